//! Framed peer connections: the peer port's fast path for node-to-node calls.
//!
//! A peer call over HTTP pays for a request head, its parsing, a signature of its own and,
//! on the sending side, a hand-off to the HTTP client's connection task and back. Appends and
//! forwarded batches are hundreds of calls a second per follower, and their round trip is
//! part of every commit. A framed connection does the same call as one length-prefixed frame
//! each way, written and read by the calling task itself.
//!
//! A connection opens with a handshake in which both ends prove they hold the cluster's peer
//! secret (see [`PeerSecret`]); a connection that fails it is closed before any frame is read.
//! Every frame after it is signed with a key made for this connection from both ends' nonces,
//! its direction and its sequence number, so a frame cannot be altered, replayed or reordered.
//!
//! The byte layout (integers big endian):
//!
//! ```text
//! hello   PREFACE(8) version(1) from(8) unix_ms(8) nonce(16) mac(32)
//! answer  0 nonce(16) mac(32)            accepted
//!         1 len(2) message(len)          refused, then closed
//! request len(4) path_len(1) path body   tag(16)   len counts path_len, path and body
//! reply   len(4) status(2) body          tag(16)   len counts status and body
//! ```
//!
//! The preface's first byte can never start an HTTP request, so the peer port tells the two
//! apart by it; a node of an earlier version answers the preface with an HTTP 400, which the
//! caller takes as "this peer speaks HTTP only" and sends its calls there instead.

use std::future::Future;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::auth::{now_ms, AuthError, PeerSecret, SessionKey, TAG_LEN};

/// The first bytes of a framed connection. 0xFE is not a byte an HTTP method starts with.
pub const PREFACE: [u8; 8] = *b"\xfeFGPEER1";

/// Version of the framing; the byte after the preface.
pub const VERSION: u8 = 1;

const NONCE_LEN: usize = 16;
const MAC_LEN: usize = 32;
const HELLO_LEN: usize = PREFACE.len() + 1 + 8 + 8 + NONCE_LEN + MAC_LEN;

const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;

/// At most this much of a refused request is read before its connection is closed.
const LINGER_BYTES: usize = 64 << 20;

/// Frame directions, signed into each tag.
const REQUEST: u8 = 1;
const REPLY: u8 = 2;

/// Why a framed call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The peer answered the preface as an HTTP server: it speaks HTTP only.
    #[error("the peer does not speak the framed protocol")]
    HttpOnly,
    /// The peer refused the handshake (its message says why: usually a different secret).
    #[error("the peer refused the connection: {0}")]
    Refused(String),
    /// The peer's answer to the handshake was not made with this node's secret.
    #[error("the peer could not prove it holds the cluster's peer secret")]
    BadPeer,
    /// A reply whose tag does not match: the connection is not to be trusted any more.
    #[error("a reply's signature does not match")]
    BadTag,
    #[error("reply of {0} bytes is over this node's limit")]
    TooLarge(usize),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The calling end of a framed connection. One call at a time: a caller takes the connection,
/// writes its request and reads the reply.
pub struct FramedConn {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    key: SessionKey,
    seq: u64,
    max_reply: usize,
}

impl FramedConn {
    /// Connects to `addr` as node `from` and runs the handshake. Replies over `max_reply`
    /// bytes are refused.
    pub async fn open(
        addr: &str,
        from: u64,
        secret: &PeerSecret,
        max_reply: usize,
    ) -> Result<Self, FrameError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, mut writer) = stream.into_split();
        let mut reader = BufReader::new(read);
        let nonce: [u8; NONCE_LEN] = rand::random();
        let unix_ms = now_ms();
        let mut hello = Vec::with_capacity(HELLO_LEN);
        hello.extend_from_slice(&PREFACE);
        hello.push(VERSION);
        hello.extend_from_slice(&from.to_be_bytes());
        hello.extend_from_slice(&unix_ms.to_be_bytes());
        hello.extend_from_slice(&nonce);
        hello.extend_from_slice(&secret.hello_mac(from, unix_ms, &nonce));
        writer.write_all(&hello).await?;
        match reader.read_u8().await? {
            ACCEPTED => {}
            REFUSED => {
                let len = reader.read_u16().await?;
                let mut message = vec![0u8; usize::from(len)];
                reader.read_exact(&mut message).await?;
                return Err(FrameError::Refused(
                    String::from_utf8_lossy(&message).into_owned(),
                ));
            }
            b'H' => return Err(FrameError::HttpOnly),
            _ => return Err(FrameError::BadPeer),
        }
        let mut server_nonce = [0u8; NONCE_LEN];
        reader.read_exact(&mut server_nonce).await?;
        let mut mac = [0u8; MAC_LEN];
        reader.read_exact(&mut mac).await?;
        secret
            .verify_accept(&nonce, &server_nonce, &mac)
            .map_err(|_| FrameError::BadPeer)?;
        Ok(FramedConn {
            reader,
            writer,
            key: secret.session_key(&nonce, &server_nonce),
            seq: 0,
            max_reply,
        })
    }

    /// Sends `body` to `path` and returns the reply's status and body. After an error the
    /// connection must be dropped: a reply may still be on its way.
    pub async fn call(&mut self, path: &str, body: &[u8]) -> Result<(u16, Bytes), FrameError> {
        let path_len = u8::try_from(path.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "peer path too long"))?;
        let len = 1 + path.len() + body.len();
        let len32 = u32::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "peer message too long"))?;
        let seq = self.seq;
        self.seq += 1;
        let tag = self
            .key
            .tag(REQUEST, seq, &[&[path_len], path.as_bytes(), body]);
        let mut frame = Vec::with_capacity(4 + len + TAG_LEN);
        frame.extend_from_slice(&len32.to_be_bytes());
        frame.push(path_len);
        frame.extend_from_slice(path.as_bytes());
        frame.extend_from_slice(body);
        frame.extend_from_slice(&tag);
        self.writer.write_all(&frame).await?;

        let len = self.reader.read_u32().await? as usize;
        if len < 2 {
            return Err(
                io::Error::new(io::ErrorKind::InvalidData, "reply without a status").into(),
            );
        }
        if len > self.max_reply.saturating_add(2) {
            return Err(FrameError::TooLarge(len));
        }
        let mut reply = vec![0u8; len + TAG_LEN];
        self.reader.read_exact(&mut reply).await?;
        let (payload, tag) = reply.split_at(len);
        if !self.key.verify(REPLY, seq, &[payload], tag) {
            return Err(FrameError::BadTag);
        }
        let status = u16::from_be_bytes([payload[0], payload[1]]);
        reply.truncate(len);
        let mut body = Bytes::from(reply);
        Ok((status, body.split_off(2)))
    }
}

/// What the accepting end enforces on a framed connection.
#[derive(Clone, Copy, Debug)]
pub struct ServeLimits {
    /// Largest request body; a larger request is answered 413 and the connection closed.
    pub max_body: usize,
    /// The hello must arrive within this, and a request's bytes within this of its length.
    pub read_timeout: Duration,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
}

/// Serves one framed connection whose first byte was the preface's: the handshake, then one
/// request at a time, each answered with what `call(from, path, body)` returns, until the
/// caller closes, a frame is bad or `shutdown` completes between requests.
pub async fn serve_connection<S, C, F>(
    stream: S,
    secret: &PeerSecret,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
    call: C,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    C: Fn(u64, String, Bytes) -> F,
    F: Future<Output = (u16, Bytes)>,
{
    let (read, mut writer) = tokio::io::split(stream);
    let mut reader = BufReader::new(read);
    let accepted = tokio::time::timeout(
        limits.read_timeout,
        handshake(&mut reader, &mut writer, secret),
    )
    .await;
    let Ok(Ok((from, key))) = accepted else {
        return;
    };
    tokio::pin!(shutdown);
    let mut seq = 0u64;
    loop {
        let len = tokio::select! {
            len = tokio::time::timeout(limits.idle_timeout, reader.read_u32()) => match len {
                Ok(Ok(len)) => len as usize,
                _ => return,
            },
            () = &mut shutdown => return,
        };
        if len > limits.max_body.saturating_add(1 + usize::from(u8::MAX)) {
            let message = Bytes::from(format!(
                "peer message of {len} bytes is over this node's limit of {} bytes",
                limits.max_body
            ));
            let _ = write_reply(&mut writer, &key, seq, 413, &message).await;
            // Read (a bounded part of) what the caller is still sending before closing, so
            // the close does not reset the connection under the answer.
            let rest = (len + TAG_LEN).min(LINGER_BYTES) as u64;
            let mut unread = (&mut reader).take(rest);
            let mut sink = tokio::io::sink();
            let drain = tokio::io::copy(&mut unread, &mut sink);
            let _ = tokio::time::timeout(limits.read_timeout, drain).await;
            return;
        }
        let mut frame = vec![0u8; len + TAG_LEN];
        match tokio::time::timeout(limits.read_timeout, reader.read_exact(&mut frame)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let (payload, tag) = frame.split_at(len);
        if !key.verify(REQUEST, seq, &[payload], tag) {
            return;
        }
        let Some(&path_len) = payload.first() else {
            return;
        };
        let body_at = 1 + usize::from(path_len);
        if body_at > len {
            return;
        }
        let path = std::str::from_utf8(&payload[1..body_at]).map(str::to_string);
        // The body is handed on without a copy: the frame's own bytes, past its path.
        frame.truncate(len);
        let body = Bytes::from(frame).slice(body_at..);
        let (status, reply) = match path {
            Ok(path) if path.starts_with('/') => call(from, path, body).await,
            _ => (400, Bytes::from_static(b"bad peer path")),
        };
        if write_reply(&mut writer, &key, seq, status, &reply)
            .await
            .is_err()
        {
            return;
        }
        seq += 1;
    }
}

/// Reads and checks the hello, answers it; the caller's node id and the session key.
async fn handshake<R, W>(
    reader: &mut R,
    writer: &mut W,
    secret: &PeerSecret,
) -> io::Result<(u64, SessionKey)>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut hello = [0u8; HELLO_LEN];
    reader.read_exact(&mut hello).await?;
    let (preface, rest) = hello.split_at(PREFACE.len());
    let (version, rest) = rest.split_at(1);
    let (from, rest) = rest.split_at(8);
    let (unix_ms, rest) = rest.split_at(8);
    let (nonce, mac) = rest.split_at(NONCE_LEN);
    let from = u64::from_be_bytes(from.try_into().unwrap_or_default());
    let unix_ms = u64::from_be_bytes(unix_ms.try_into().unwrap_or_default());
    let checked = if preface != PREFACE || version[0] != VERSION {
        Err(format!(
            "framed peer protocol version {} is not {VERSION}",
            version[0]
        ))
    } else {
        secret
            .verify_hello(from, unix_ms, nonce, mac)
            .map_err(|e: AuthError| e.refusal())
    };
    if let Err(message) = checked {
        super::auth::warn_refused(&format!("node {from}"), &message);
        let message = message.into_bytes();
        let len = u16::try_from(message.len()).unwrap_or(u16::MAX);
        let mut refusal = vec![REFUSED];
        refusal.extend_from_slice(&len.to_be_bytes());
        refusal.extend_from_slice(&message[..usize::from(len)]);
        writer.write_all(&refusal).await?;
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "refused"));
    }
    let server_nonce: [u8; NONCE_LEN] = rand::random();
    let mut answer = Vec::with_capacity(1 + NONCE_LEN + MAC_LEN);
    answer.push(ACCEPTED);
    answer.extend_from_slice(&server_nonce);
    answer.extend_from_slice(&secret.accept_mac(nonce, &server_nonce));
    writer.write_all(&answer).await?;
    Ok((from, secret.session_key(nonce, &server_nonce)))
}

async fn write_reply<W: AsyncWrite + Unpin>(
    writer: &mut W,
    key: &SessionKey,
    seq: u64,
    status: u16,
    body: &[u8],
) -> io::Result<()> {
    let len = u32::try_from(2 + body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "reply too long"))?;
    let status = status.to_be_bytes();
    let tag = key.tag(REPLY, seq, &[&status, body]);
    let mut frame = Vec::with_capacity(4 + 2 + body.len() + TAG_LEN);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&status);
    frame.extend_from_slice(body);
    frame.extend_from_slice(&tag);
    writer.write_all(&frame).await
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    fn secret() -> PeerSecret {
        PeerSecret::new("framed-test-secret-0123").expect("secret")
    }

    fn limits(max_body: usize) -> ServeLimits {
        ServeLimits {
            max_body,
            read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
        }
    }

    /// A listener serving one framed connection that answers each call with its caller, path
    /// and body; the task ends when the connection does.
    async fn echo_server(max_body: usize) -> (String, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let task = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let call = |from: u64, path: String, body: Bytes| async move {
                let status = if path == "/missing" { 404 } else { 200 };
                let mut reply = format!("{from} {path} ").into_bytes();
                reply.extend_from_slice(&body);
                (status, Bytes::from(reply))
            };
            serve_connection(
                stream,
                &secret(),
                limits(max_body),
                std::future::pending(),
                call,
            )
            .await;
        });
        (addr, task)
    }

    #[tokio::test]
    async fn calls_go_both_ways_in_order_on_one_connection() {
        let (addr, server) = echo_server(1 << 20).await;
        let mut conn = FramedConn::open(&addr, 7, &secret(), 1 << 20)
            .await
            .expect("open");
        for i in 0..3u8 {
            let (status, body) = conn.call("/raft/append", &[b'x', i]).await.expect("call");
            assert_eq!(status, 200);
            assert_eq!(
                &body[..],
                &[b"7 /raft/append x".as_slice(), &[i]].concat()[..]
            );
        }
        let (status, body) = conn.call("/missing", b"").await.expect("call");
        assert_eq!((status, &body[..]), (404, b"7 /missing ".as_slice()));
        // An empty body and a large one frame the same way.
        let big = vec![9u8; 300_000];
        let (_, body) = conn.call("/big", &big).await.expect("call");
        assert_eq!(body.len(), "7 /big ".len() + big.len());
        drop(conn);
        server.await.expect("server ends when the caller closes");
    }

    #[tokio::test]
    async fn a_caller_with_another_secret_is_refused_and_answered_why() {
        let (addr, server) = echo_server(1 << 20).await;
        let wrong = PeerSecret::new("another-secret-entirely").expect("secret");
        match FramedConn::open(&addr, 7, &wrong, 1 << 20).await {
            Err(FrameError::Refused(message)) => {
                assert!(message.contains("peer secret"), "{message}")
            }
            other => panic!("expected a refusal, got {:?}", other.err()),
        }
        server
            .await
            .expect("the server closes a refused connection");
    }

    #[tokio::test]
    async fn a_frame_with_a_bad_tag_or_over_the_limit_closes_the_connection() {
        // A tampered frame: the server reads it, finds the tag wrong and closes unanswered.
        let (addr, server) = echo_server(1 << 20).await;
        let mut conn = FramedConn::open(&addr, 7, &secret(), 1 << 20)
            .await
            .expect("open");
        let mut frame = 5u32.to_be_bytes().to_vec();
        frame.extend_from_slice(&[3, b'/', b'a', b'b', b'!']);
        frame.extend_from_slice(&[0u8; TAG_LEN]);
        conn.writer.write_all(&frame).await.expect("write");
        let mut rest = Vec::new();
        let read = conn.reader.read_to_end(&mut rest).await.expect("read");
        assert_eq!(read, 0, "nothing is answered to a forged frame");
        server.await.expect("server ends");

        // A frame over the body limit is answered 413 before its bytes are read.
        let (addr, server) = echo_server(1_000).await;
        let mut conn = FramedConn::open(&addr, 7, &secret(), 1 << 20)
            .await
            .expect("open");
        let (status, body) = conn
            .call("/raft/append", &[0u8; 5_000])
            .await
            .expect("call");
        assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
        assert!(conn.call("/raft/append", b"").await.is_err(), "then closed");
        server.await.expect("server ends");
    }

    #[tokio::test]
    async fn a_reply_not_signed_with_the_session_key_is_refused() {
        // A server that knows the secret but answers with a reply for another sequence number.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let (read, mut writer) = tokio::io::split(stream);
            let mut reader = BufReader::new(read);
            let (_, key) = handshake(&mut reader, &mut writer, &secret())
                .await
                .expect("handshake");
            let len = reader.read_u32().await.expect("len") as usize;
            let mut frame = vec![0u8; len + TAG_LEN];
            reader.read_exact(&mut frame).await.expect("frame");
            write_reply(&mut writer, &key, 41, 200, b"replayed")
                .await
                .expect("write");
            std::future::pending::<()>().await;
        });
        let mut conn = FramedConn::open(&addr, 7, &secret(), 1 << 20)
            .await
            .expect("open");
        assert!(matches!(
            conn.call("/raft/vote", b"").await,
            Err(FrameError::BadTag)
        ));
    }

    #[tokio::test]
    async fn an_http_server_is_recognised_as_one() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut first = [0u8; 16];
            let _ = stream.read(&mut first).await;
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        });
        assert!(matches!(
            FramedConn::open(&addr, 7, &secret(), 1 << 20).await,
            Err(FrameError::HttpOnly)
        ));
    }
}
