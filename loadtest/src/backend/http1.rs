//! A lean HTTP/1.1 client for the load loops: per endpoint, a pool of keep-alive connections
//! driven through hyper's connection API directly.
//!
//! The harness shares the machine with the cluster it measures, so every microsecond it spends
//! per request is taken from the system under test. reqwest, which these loops used before,
//! parses a URL (with IDNA host processing), runs its redirect layer and checks a connection
//! out of a shared pool on every request; on the 2-core test machine that made the harness use
//! about half a core at 6,000 requests/s. Here a request is a path, a host header and a body
//! written on a connection that is already open, and an answer is its status, headers and body.
//!
//! Only what the load loops need: plain `http://host:port` endpoints on loopback, requests
//! that are safe to send again (the harness retries every uncertain outcome with the same ids).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Conn = SendRequest<Full<Bytes>>;

/// A connection idle this long is closed rather than used again: half the 10 s after which a
/// fencegate node closes an idle keep-alive connection. Used near that moment, a request can
/// cross the server's close on the wire and come back as a transport error (in a steal
/// stretch, when the pool's oldest connections are reached, ~20 at once).
const IDLE_MAX: Duration = Duration::from_secs(5);

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

/// One endpoint's connections. Concurrency is bounded by the caller (the endpoint's permits),
/// so the pool never holds more connections than requests ever ran at once.
pub struct ConnPool {
    /// `host:port`, as connected to and sent in `Host`.
    authority: String,
    host: HeaderValue,
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
        Ok(ConnPool {
            host: HeaderValue::from_str(&authority)?,
            authority,
            idle: Mutex::new(Vec::new()),
            idle_max: IDLE_MAX,
            connect_timeout,
            timeout,
        })
    }

    /// A JSON POST of `body` to `path`; `None` if `path` is not a valid request target.
    pub fn post_json(&self, path: &str, body: Bytes) -> Option<Request<Full<Bytes>>> {
        let json = HeaderValue::from_static("application/json");
        self.request(Method::POST, path, [(CONTENT_TYPE, json)], body)
    }

    /// A request for `path` with `headers` and `body`; `None` if `path` is not a valid
    /// request target.
    pub fn request(
        &self,
        method: Method,
        path: &str,
        headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Option<Request<Full<Bytes>>> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone());
        for (name, value) in headers {
            req = req.header(name, value);
        }
        req.body(Full::new(body)).ok()
    }

    /// Sends `req` on an idle connection (or a new one) and reads the whole answer, within the
    /// pool's timeout.
    pub async fn send(&self, req: Request<Full<Bytes>>) -> Result<Answer, SendError> {
        match tokio::time::timeout(self.timeout, self.exchange(req)).await {
            Ok(answer) => answer,
            // The connection is dropped with the future: a late answer cannot be mistaken
            // for the next request's.
            Err(_) => Err(SendError::Timeout),
        }
    }

    async fn exchange(&self, req: Request<Full<Bytes>>) -> Result<Answer, SendError> {
        let (mut conn, reused) = self.ready_conn().await?;
        let resp = match conn.try_send_request(req).await {
            Ok(resp) => resp,
            // A kept-alive connection the server had just closed (its idle timeout) is found
            // out only when it is used; hyper hands the request back if none of it was
            // written, and then it goes out once more on a fresh connection.
            Err(mut e) if reused => match e.take_message() {
                Some(req) => {
                    conn = self.connect().await?;
                    conn.try_send_request(req)
                        .await
                        .map_err(|_| SendError::Transport)?
                }
                None => return Err(SendError::Transport),
            },
            Err(_) => return Err(SendError::Transport),
        };
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|_| SendError::Transport)?
            .to_bytes();
        self.checkin(conn);
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    /// A connection ready for a request, and whether it was used before: an idle one that is
    /// still open, or a new one.
    async fn ready_conn(&self) -> Result<(Conn, bool), SendError> {
        while let Some(mut conn) = self.checkout() {
            if conn.ready().await.is_ok() {
                return Ok((conn, true));
            }
        }
        Ok((self.connect().await?, false))
    }

    /// The most recently used idle connection, unless it has been idle too long (see
    /// [`IDLE_MAX`]); then it and every older one are closed.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let (conn, since) = idle.pop()?;
        if since.elapsed() > self.idle_max {
            idle.clear();
            return None;
        }
        Some(conn)
    }

    fn checkin(&self, conn: Conn) {
        // A connection the server closed (`Connection: close`, or it failed) is dropped here
        // or, if that shows only later, at its next checkout.
        if !conn.is_closed() {
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
            let (mut send, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
            // The connection's own task: it reads and writes the socket for `send`, and ends
            // when `send` is dropped or the peer closes.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            send.ready().await.ok()?;
            Some(send)
        };
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(Some(send)) => Ok(send),
            _ => Err(SendError::Connect),
        }
    }
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
                        if let After::Stall = after {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            return;
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
            // The server drops the kept-alive connection, and the pooled connection's task
            // sees it; the next request must not fail on it.
            close.notify_one();
            while !pool.idle.lock().unwrap()[0].0.is_closed() {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
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
