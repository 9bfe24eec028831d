//! A raw HTTP/1.1 client on a bare socket, for testing what a listener does with clients that
//! misbehave: huge bodies and headers, bytes trickled one at a time, connections that send
//! nothing. A well-behaved client library cannot send those.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// What came back on a connection within the wait.
#[derive(Debug)]
pub struct RawReply {
    /// The status of the response, if a response head arrived.
    pub status: Option<u16>,
    /// Everything after the response head.
    pub body: String,
    /// Whether the server closed (or reset) the connection within the wait.
    pub closed: bool,
}

impl RawReply {
    /// The `error` code of a JSON error body.
    pub fn code(&self) -> Option<String> {
        let v: crate::wire::ErrorBody = serde_json::from_str(self.body.trim()).ok()?;
        Some(v.error.as_str().to_string())
    }
}

/// Sends `head` and then each of `parts` (each after `pause`) on a new connection to `addr`,
/// while reading whatever the server answers, for at most `wait`. Writing stops at the first
/// error (the server closed); reading stops at end of stream or when `wait` has passed.
pub async fn send(
    addr: SocketAddr,
    head: Vec<u8>,
    parts: Vec<Vec<u8>>,
    pause: Duration,
    wait: Duration,
) -> RawReply {
    let stream = TcpStream::connect(addr).await.expect("connect");
    exchange(stream, head, parts, pause, wait).await
}

/// [`send`] on an already open stream (a TLS stream, for instance).
pub async fn exchange<S>(
    stream: S,
    head: Vec<u8>,
    parts: Vec<Vec<u8>>,
    pause: Duration,
    wait: Duration,
) -> RawReply
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let writer = tokio::spawn(async move {
        if wr.write_all(&head).await.is_err() {
            return;
        }
        for part in parts {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            if wr.write_all(&part).await.is_err() || wr.flush().await.is_err() {
                return;
            }
        }
    });
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(wait, async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    writer.abort();
    parse(&got, closed)
}

/// Opens a connection and sends nothing on it.
pub async fn idle(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect")
}

/// Whether the server closes `stream` within `wait`, sending nothing but perhaps an error.
pub async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(wait, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// `n` bytes of a chunked body in chunks of 64 KiB, with the final empty chunk.
pub fn chunked(n: usize) -> Vec<Vec<u8>> {
    let mut parts = Vec::new();
    let mut left = n;
    while left > 0 {
        let len = left.min(64 * 1024);
        let mut part = format!("{len:x}\r\n").into_bytes();
        part.extend(std::iter::repeat_n(b'a', len));
        part.extend_from_slice(b"\r\n");
        parts.push(part);
        left -= len;
    }
    parts.push(b"0\r\n\r\n".to_vec());
    parts
}

/// One byte per part.
pub fn bytewise(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes.iter().map(|b| vec![*b]).collect()
}

fn parse(got: &[u8], closed: bool) -> RawReply {
    let text = String::from_utf8_lossy(got);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|s| s.parse().ok());
    RawReply {
        status,
        body: body.to_string(),
        closed,
    }
}
