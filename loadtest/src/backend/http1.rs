//! A lean HTTP/1.1 client for the load loops: per endpoint, a pool of keep-alive connections,
//! each one driven by the task that sends on it.
//!
//! The harness shares the machine with the cluster it measures, so every microsecond it spends
//! per request is taken from the system under test. reqwest, which these loops used first,
//! parses a URL (with IDNA host processing), runs its redirect layer and checks a connection
//! out of a shared pool on every request; on the 2-core test machine that made the harness use
//! about half a core at 6,000 requests/s. hyper's connection API, used next, still hands each
//! request to the connection's own task and the answer back through channels: two task
//! wake-ups per request besides the socket's. Here the calling task writes the request (one
//! prepared buffer) and reads the answer on a connection it has checked out; nothing else runs.
//!
//! Only what the load loops need: plain `http://host:port` endpoints on loopback, requests
//! that are safe to send again (the harness retries every uncertain outcome with the same ids),
//! answers framed by `content-length`, `transfer-encoding: chunked` or the connection's end.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Method};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection idle this long is closed rather than used again: half the 10 s after which a
/// fencegate node closes an idle keep-alive connection. Used near that moment, a request can
/// cross the server's close on the wire and come back as a transport error (in a steal
/// stretch, when the pool's oldest connections are reached, ~20 at once).
const IDLE_MAX: Duration = Duration::from_secs(5);

/// The most header lines an answer may have.
const MAX_HEADERS: usize = 64;

/// The largest answer head or chunk-size line read before giving up on the connection.
const MAX_HEAD: usize = 64 * 1024;

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// No connection could be made: nothing was sent.
    Connect,
    /// No complete answer within the request timeout.
    Timeout,
    /// The connection failed after the request may have been sent.
    Transport,
}

/// A complete answer.
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A request ready to go on the wire: its head and body in one buffer, cheap to clone for a
/// retry.
#[derive(Clone)]
pub struct Outgoing(Bytes);

/// One kept-alive connection and what was read on it beyond the last answer.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

/// One endpoint's connections. Concurrency is bounded by the caller (the endpoint's permits),
/// so the pool never holds more connections than requests ever ran at once.
pub struct ConnPool {
    /// `host:port`, as connected to and sent in `Host`.
    authority: String,
    /// Idle connections and when each was last answered, oldest first.
    idle: Mutex<Vec<(Conn, Instant)>>,
    idle_max: Duration,
    connect_timeout: Duration,
    timeout: Duration,
}

impl ConnPool {
    /// A pool for `base` (`http://host:port`, no path).
    pub fn new(base: &str, connect_timeout: Duration, timeout: Duration) -> anyhow::Result<Self> {
        let authority = base
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("{base}: only http:// endpoints are supported"))?
            .trim_end_matches('/')
            .to_string();
        anyhow::ensure!(
            !authority.is_empty() && !authority.contains('/'),
            "{base}: expected http://host:port"
        );
        // Sent as the Host header: it must be a valid header value.
        HeaderValue::from_str(&authority)?;
        Ok(ConnPool {
            authority,
            idle: Mutex::new(Vec::new()),
            idle_max: IDLE_MAX,
            connect_timeout,
            timeout,
        })
    }

    /// A JSON POST of `body` to `path`; `None` if `path` is not a valid request target.
    pub fn post_json(&self, path: &str, body: Bytes) -> Option<Outgoing> {
        let json = HeaderValue::from_static("application/json");
        self.request(
            Method::POST,
            path,
            [(hyper::header::CONTENT_TYPE, json)],
            body,
        )
    }

    /// A request for `path` with `headers` and `body`; `None` if `path` is not a valid
    /// request target (an absolute path of visible ASCII).
    pub fn request(
        &self,
        method: Method,
        path: &str,
        headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Option<Outgoing> {
        if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        let mut out = Vec::with_capacity(160 + path.len() + body.len());
        out.extend_from_slice(method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(path.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        out.extend_from_slice(self.authority.as_bytes());
        for (name, value) in headers {
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(b"\r\ncontent-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(&body);
        Some(Outgoing(out.into()))
    }

    /// Sends `req` on an idle connection (or a new one) and reads the whole answer, within the
    /// pool's timeout.
    pub async fn send(&self, req: Outgoing) -> Result<Answer, SendError> {
        match tokio::time::timeout(self.timeout, self.exchange(&req)).await {
            Ok(answer) => answer,
            // The connection is dropped with the future: a late answer cannot be mistaken
            // for the next request's.
            Err(_) => Err(SendError::Timeout),
        }
    }

    async fn exchange(&self, req: &Outgoing) -> Result<Answer, SendError> {
        if let Some(mut conn) = self.checkout() {
            match conn.exchange(req).await {
                Ok((answer, keep)) => {
                    self.checkin(conn, keep);
                    return Ok(answer);
                }
                // A kept-alive connection the server had just closed (its idle timeout) is
                // found out only when it is used: closed before a byte of an answer came
                // back, and the request goes out once more on a fresh connection.
                Err(Failed::Closed) => {}
                Err(Failed::Broken) => return Err(SendError::Transport),
            }
        }
        let mut conn = self.connect().await?;
        match conn.exchange(req).await {
            Ok((answer, keep)) => {
                self.checkin(conn, keep);
                Ok(answer)
            }
            Err(_) => Err(SendError::Transport),
        }
    }

    /// The most recently used idle connection that is still open, unless it has been idle too
    /// long (see [`IDLE_MAX`]); then it and every older one are closed.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() > self.idle_max {
                idle.clear();
                return None;
            }
            if conn.still_open() {
                return Some(conn);
            }
        }
        None
    }

    fn checkin(&self, conn: Conn, keep: bool) {
        if keep {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((conn, Instant::now()));
        }
    }

    async fn connect(&self) -> Result<Conn, SendError> {
        let open = async {
            let stream = TcpStream::connect(&self.authority).await.ok()?;
            stream.set_nodelay(true).ok()?;
            Some(Conn {
                stream,
                buf: BytesMut::with_capacity(4096),
            })
        };
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(Some(conn)) => Ok(conn),
            _ => Err(SendError::Connect),
        }
    }
}

/// How an exchange on a connection failed.
enum Failed {
    /// The connection ended (or was reset) before any of an answer came back.
    Closed,
    /// Anything else: the answer was cut off or malformed, or the socket failed otherwise.
    Broken,
}

impl From<io::Error> for Failed {
    fn from(_: io::Error) -> Self {
        Failed::Broken
    }
}

/// Whether `e` says the peer had closed the connection (rather than that the socket failed).
fn peer_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

impl Conn {
    /// Whether an idle connection can take a request: the server has not closed it, and it
    /// has sent nothing unasked. Costs no system call unless the socket became readable.
    fn still_open(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Writes `req` and reads its whole answer; with it, whether the connection can be used
    /// again.
    async fn exchange(&mut self, req: &Outgoing) -> Result<(Answer, bool), Failed> {
        self.buf.clear();
        match self.stream.write_all(&req.0).await {
            Ok(()) => {}
            Err(e) if peer_closed(&e) => return Err(Failed::Closed),
            Err(_) => return Err(Failed::Broken),
        }
        let (status, headers, head_len, framing) = loop {
            if let Some(head) = parse_head(&self.buf)? {
                break head;
            }
            if self.buf.len() > MAX_HEAD {
                return Err(Failed::Broken);
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(n) if n > 0 => {}
                Ok(_) if self.buf.is_empty() => return Err(Failed::Closed),
                Err(e) if self.buf.is_empty() && peer_closed(&e) => return Err(Failed::Closed),
                _ => return Err(Failed::Broken),
            }
        };
        self.buf.advance(head_len);
        let keep = !headers
            .get(hyper::header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let (body, keep) = match framing {
            Framing::Length(len) => (self.read_exact(len).await?, keep),
            Framing::Chunked => (self.read_chunked().await?, keep),
            Framing::UntilClose => {
                while self.stream.read_buf(&mut self.buf).await? > 0 {}
                (self.buf.split().freeze(), false)
            }
        };
        // Anything beyond the answer was not asked for: the connection is not used again.
        let keep = keep && self.buf.is_empty();
        Ok((
            Answer {
                status,
                headers,
                body,
            },
            keep,
        ))
    }

    /// The next `len` bytes of the connection.
    async fn read_exact(&mut self, len: usize) -> Result<Bytes, Failed> {
        self.buf.reserve(len.saturating_sub(self.buf.len()));
        while self.buf.len() < len {
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(Failed::Broken);
            }
        }
        Ok(self.buf.split_to(len).freeze())
    }

    /// A line ending in CRLF, without it.
    async fn read_line(&mut self) -> Result<Bytes, Failed> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf.split_to(end).freeze();
                self.buf.advance(2);
                return Ok(line);
            }
            if self.buf.len() > MAX_HEAD || self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(Failed::Broken);
            }
        }
    }

    /// A chunked body, decoded; trailers are read and dropped.
    async fn read_chunked(&mut self) -> Result<Bytes, Failed> {
        let mut body = BytesMut::new();
        loop {
            let line = self.read_line().await?;
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .ok()
                .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
                .ok_or(Failed::Broken)?;
            if size == 0 {
                while !self.read_line().await?.is_empty() {}
                return Ok(body.freeze());
            }
            body.extend_from_slice(&self.read_exact(size).await?);
            if !self.read_line().await?.is_empty() {
                return Err(Failed::Broken);
            }
        }
    }
}

/// How an answer's body is delimited.
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// The answer's status, headers, head length and body framing once its whole head is in
/// `buf`; `None` while it is not.
fn parse_head(buf: &[u8]) -> Result<Option<(u16, HeaderMap, usize, Framing)>, Failed> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut lines);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Failed::Broken),
    };
    let status = resp.code.ok_or(Failed::Broken)?;
    // Nothing here asks for an interim answer (no `Expect: 100-continue`).
    if !(200..600).contains(&status) {
        return Err(Failed::Broken);
    }
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    let mut framing = if status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        Framing::UntilClose
    };
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| Failed::Broken)?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| Failed::Broken)?;
        if name == hyper::header::TRANSFER_ENCODING {
            if value.as_bytes().eq_ignore_ascii_case(b"chunked") {
                framing = Framing::Chunked;
            } else {
                return Err(Failed::Broken);
            }
        } else if name == hyper::header::CONTENT_LENGTH && !matches!(framing, Framing::Chunked) {
            let len = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(Failed::Broken)?;
            framing = Framing::Length(len);
        }
        headers.append(name, value);
    }
    Ok(Some((status, headers, head_len, framing)))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::Notify;

    use super::*;

    /// How the test server treats a connection after answering a request.
    #[derive(Clone)]
    enum After {
        KeepAlive,
        /// Keep the connection until told, then close it without saying so, as a server's
        /// idle timeout does.
        CloseWhenTold(Arc<Notify>),
        /// Read the request, never answer.
        Stall,
        /// Read the request, close the connection without answering.
        Hangup,
    }

    /// A raw HTTP/1.1 server on 127.0.0.1:0 that answers every request with its body; returns
    /// its base URL and the number of connections it accepted.
    async fn server(after: After) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                let after = after.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let Some(body) = read_request(&mut sock, &mut buf).await else {
                            return;
                        };
                        match after {
                            After::Stall => {
                                tokio::time::sleep(Duration::from_secs(60)).await;
                                return;
                            }
                            After::Hangup => return,
                            _ => {}
                        }
                        let head =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        sock.write_all(head.as_bytes()).await.unwrap();
                        sock.write_all(&body).await.unwrap();
                        if let After::CloseWhenTold(close) = &after {
                            close.notified().await;
                            return;
                        }
                    }
                });
            }
        });
        (base, accepted)
    }

    /// Reads one request (head and `content-length` body) and returns its body.
    async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + len {
                    let body = buf[end + 4..end + 4 + len].to_vec();
                    buf.drain(..end + 4 + len);
                    return Some(body);
                }
            }
            let n = sock.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn short_pool(base: &str) -> ConnPool {
        ConnPool::new(base, Duration::from_millis(500), Duration::from_millis(500)).unwrap()
    }

    #[tokio::test]
    async fn answers_come_back_whole_on_one_kept_alive_connection() {
        let (base, accepted) = server(After::KeepAlive).await;
        let pool = short_pool(&base);
        for i in 0..20 {
            let body = Bytes::from(format!("{{\"n\":{i}}}"));
            let req = pool.post_json("/v1/locks/a/acquire", body.clone()).unwrap();
            let answer = pool.send(req).await.unwrap();
            assert_eq!(answer.status, 200);
            assert_eq!(answer.body, body);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_replaced_without_an_error() {
        let close = Arc::new(Notify::new());
        let (base, accepted) = server(After::CloseWhenTold(close.clone())).await;
        let pool = short_pool(&base);
        for i in 0..5 {
            let req = pool.post_json("/x", Bytes::from(vec![b'x'; i])).unwrap();
            let answer = pool.send(req).await.unwrap();
            assert_eq!(answer.body.len(), i);
            assert_eq!(pool.idle.lock().unwrap().len(), 1, "the connection is kept");
            // The server drops the kept-alive connection. Whether the pool sees the close
            // before it sends (at checkout) or only after (the answer never starts), the next
            // request must not fail on it.
            close.notify_one();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
    }

    /// A server that closes every connection right after reading a request, without answering
    /// it: only a fresh connection's failure is reported, and it is not retried.
    #[tokio::test]
    async fn a_fresh_connection_closed_unanswered_is_a_transport_error() {
        let (base, accepted) = server(After::Hangup).await;
        let pool = short_pool(&base);
        let req = pool.post_json("/x", Bytes::from_static(b"{}")).unwrap();
        assert_eq!(pool.send(req).await.err(), Some(SendError::Transport));
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "sent once");
    }

    /// Serves one connection with `answer` (raw bytes, written in `pieces` parts) to every
    /// request; returns the base URL.
    async fn raw_server(answer: &'static [u8], pieces: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    while read_request(&mut sock, &mut buf).await.is_some() {
                        for part in answer.chunks(answer.len().div_ceil(pieces)) {
                            sock.write_all(part).await.unwrap();
                            sock.flush().await.unwrap();
                            tokio::task::yield_now().await;
                        }
                    }
                });
            }
        });
        base
    }

    #[tokio::test]
    async fn chunked_and_split_answers_are_read_whole() {
        let chunked: &[u8] =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-leader: 2\r\n\r\n\
            5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\ntrailer: t\r\n\r\n";
        for pieces in [1, 7, 40] {
            let base = raw_server(chunked, pieces).await;
            let pool = short_pool(&base);
            for _ in 0..3 {
                let req = pool.post_json("/x", Bytes::from_static(b"{}")).unwrap();
                let answer = pool.send(req).await.unwrap();
                assert_eq!(answer.status, 200);
                assert_eq!(&answer.body[..], b"hello, world", "{pieces} pieces");
                assert_eq!(answer.headers["x-leader"], "2");
            }
            assert_eq!(pool.idle.lock().unwrap().len(), 1, "kept alive");
        }
    }

    #[tokio::test]
    async fn an_answer_without_length_ends_with_its_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut buf = Vec::new();
                read_request(&mut sock, &mut buf).await.unwrap();
                sock.write_all(b"HTTP/1.1 503 Service Unavailable\r\n\r\nbusy")
                    .await
                    .unwrap();
            }
        });
        let pool = short_pool(&base);
        let req = pool.post_json("/x", Bytes::from_static(b"{}")).unwrap();
        let answer = pool.send(req).await.unwrap();
        assert_eq!((answer.status, &answer.body[..]), (503, &b"busy"[..]));
        assert!(pool.idle.lock().unwrap().is_empty(), "not used again");
    }

    #[tokio::test]
    async fn a_malformed_answer_is_a_transport_error() {
        let base = raw_server(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", 1).await;
        let pool = short_pool(&base);
        let req = pool.post_json("/x", Bytes::from_static(b"{}")).unwrap();
        assert_eq!(pool.send(req).await.err(), Some(SendError::Transport));
        assert!(pool.idle.lock().unwrap().is_empty());
    }

    #[test]
    fn a_request_is_written_as_one_http_1_1_message() {
        let pool = short_pool("http://127.0.0.1:7001");
        let req = pool
            .request(
                Method::PUT,
                "/kv/a?x=1",
                [(
                    HeaderName::from_static("fencing-token"),
                    HeaderValue::from(7u64),
                )],
                Bytes::from_static(b"abc"),
            )
            .unwrap();
        assert_eq!(
            &req.0[..],
            b"PUT /kv/a?x=1 HTTP/1.1\r\nhost: 127.0.0.1:7001\r\nfencing-token: 7\r\n\
              content-length: 3\r\n\r\nabc"
        );
        for bad in ["", "x", "/a b", "/a\r\nx: y", "/\u{e9}"] {
            assert!(pool.post_json(bad, Bytes::new()).is_none(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_connection_idle_too_long_is_not_used_again() {
        let (base, accepted) = server(After::KeepAlive).await;
        let mut pool = short_pool(&base);
        pool.idle_max = Duration::from_millis(200);
        let req = || pool.post_json("/x", Bytes::from_static(b"{}")).unwrap();
        pool.send(req()).await.unwrap();
        pool.send(req()).await.unwrap();
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "a fresh one is used again"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        pool.send(req()).await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "an old one is replaced");
        assert_eq!(pool.idle.lock().unwrap().len(), 1, "and not kept");
    }

    #[tokio::test]
    async fn no_answer_is_a_timeout_and_no_listener_a_connect_error() {
        let (base, _) = server(After::Stall).await;
        let pool = short_pool(&base);
        let req = pool.post_json("/x", Bytes::from_static(b"{}")).unwrap();
        assert_eq!(pool.send(req).await.err(), Some(SendError::Timeout));

        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let pool = short_pool(&base);
        let req = pool.post_json("/x", Bytes::from_static(b"{}")).unwrap();
        assert_eq!(pool.send(req).await.err(), Some(SendError::Connect));
    }

    #[test]
    fn only_plain_http_host_port_endpoints_are_taken() {
        for bad in [
            "https://127.0.0.1:1",
            "http://",
            "http://127.0.0.1:1/v1",
            "127.0.0.1:1",
        ] {
            assert!(
                ConnPool::new(bad, Duration::ZERO, Duration::ZERO).is_err(),
                "{bad}"
            );
        }
        assert!(ConnPool::new("http://127.0.0.1:7001/", Duration::ZERO, Duration::ZERO).is_ok());
    }
}
