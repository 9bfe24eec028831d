//! The send-by bound holds for the whole request, not per write: against an upstream that
//! reads slowly, a fenced write whose request has not reached the upstream (and been answered)
//! by its send-by instant is cut off — the upstream connection is reset, so the store never
//! receives the complete request, and no byte of it trickles in after the grant's end. The
//! client gets a clear 504.

use std::time::{Duration, Instant};

use fencegate_proxy::route::RouteConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, watch};

use crate::common::{phase, FenceHarness};

/// What the slow upstream saw of one connection.
#[derive(Debug)]
struct Seen {
    accepted: Instant,
    /// Request bytes received in all (head and body), up to the connection's end.
    bytes: Vec<u8>,
    /// How the connection ended once drained: `Err` is a reset.
    end: std::io::Result<()>,
}

/// An upstream that never answers (but an interim 100 Continue if `send_continue`) and reads
/// its socket slowly (64 bytes every 200 ms, with a 4 KiB receive buffer) until `drain` is set, then reads whatever is still coming at full
/// speed until the connection ends.
async fn slow_upstream(
    drain: watch::Receiver<bool>,
    send_continue: bool,
) -> (String, oneshot::Receiver<Seen>) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    // Set before listening so the accepted connection inherits it: the proxy's bytes pile up
    // in its own send queue instead of in ours.
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(8).expect("listen");
    let addr = listener.local_addr().expect("addr").to_string();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut conn, _)) = listener.accept().await else {
            return;
        };
        let accepted = Instant::now();
        if send_continue {
            // As a store does for `Expect: 100-continue`: go ahead, send the body.
            let _ = conn.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
        }
        let mut bytes = Vec::new();
        let mut buf = [0u8; 64];
        let mut drain = drain;
        let end = loop {
            if *drain.borrow() {
                let mut rest = Vec::new();
                let end = conn.read_to_end(&mut rest).await.map(|_| ());
                bytes.extend_from_slice(&rest);
                break end;
            }
            match conn.read(&mut buf).await {
                Ok(0) => break Ok(()),
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) => break Err(e),
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), drain.changed()).await;
        };
        let _ = tx.send(Seen {
            accepted,
            bytes,
            end,
        });
    });
    (addr, rx)
}

/// The body bytes in what the upstream received (after the request head).
fn body_of(request: &[u8]) -> usize {
    request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |head| request.len() - head - 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t44_send_deadline_cuts_a_write_the_upstream_reads_too_slowly() {
    cut_at_send_by(false).await;
}

/// The same with `Expect: 100-continue` (curl sends it for large bodies): the client has had
/// an interim 100 when the write is cut, and still gets the final 504 (it got no final answer
/// at all: the 100 was taken for the start of the upstream's answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t45_a_write_cut_after_100_continue_still_gets_its_504() {
    cut_at_send_by(true).await;
}

async fn cut_at_send_by(expect_continue: bool) {
    let (drain_tx, drain_rx) = watch::channel(false);
    let (slow_addr, seen) = slow_upstream(drain_rx, expect_continue).await;
    let h = FenceHarness::start_with(|c| {
        c.routes
            .push(RouteConfig::new("/slow/{key}", "slow:{key}", &slow_addr));
    })
    .await;
    let grant = Duration::from_millis(h.config().grant_ms);
    let a = h.acquire("slow:x", "A", 30_000, 0).await;

    phase("A sends a 256 KiB fenced write; the proxy admits it and hands it all to its socket");
    // Far more than the upstream can take in before the send-by, little enough for the
    // proxy's kernel send queue: pingora's writes all complete at once, so only a bound on
    // the whole send (not per write) can stop the rest reaching the store late.
    let body = vec![b'a'; 256 * 1024];
    let addr = h.client.proxy_addr(1).expect("proxy 1");
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let expect = if expect_continue {
        "Expect: 100-continue\r\n"
    } else {
        ""
    };
    let head = format!(
        "PUT /slow/x HTTP/1.1\r\nHost: test\r\nFence-Token: {}\r\nContent-Length: {}\r\n\
         {expect}\r\n",
        a.token,
        body.len()
    );
    let (mut rd, mut wr) = conn.split();
    let send = async {
        let _ = wr.write_all(head.as_bytes()).await;
        let _ = wr.write_all(&body).await;
    };
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut answer));
    let (_, read) = tokio::join!(send, read);
    let answered_at = Instant::now();
    let answer = String::from_utf8_lossy(&answer).into_owned();

    phase("the client gets 504 upstream_timeout, before the grant could have ended");
    assert!(read.is_ok(), "no answer within 20 s");
    let answer = if expect_continue {
        answer
            .strip_prefix("HTTP/1.1 100 Continue\r\n\r\n")
            .unwrap_or_else(|| panic!("expected an interim 100 first, got {answer:?}"))
            .to_string()
    } else {
        answer
    };
    assert!(
        answer.starts_with("HTTP/1.1 504"),
        "expected a 504, got {answer:?}"
    );
    assert!(answer.contains("upstream_timeout"), "{answer}");

    phase("the upstream drains its socket: it got an incomplete request and then a reset");
    drain_tx.send(true).expect("drain");
    let seen = tokio::time::timeout(Duration::from_secs(20), seen)
        .await
        .expect("the upstream connection ended")
        .expect("upstream task");
    let received = body_of(&seen.bytes);
    eprintln!(
        "upstream: {received} of {} body bytes, end {:?}, answer after {:?}",
        body.len(),
        seen.end,
        answered_at - seen.accepted
    );
    assert!(
        seen.end.is_err(),
        "the connection ended in order, so the queued rest of the request was delivered after \
         the proxy gave up ({received} body bytes)"
    );
    assert!(received < body.len(), "the store got the whole request");
    // The proxy's grant started when it asked for the admission, before it connected here, so
    // it ended by `accepted + grant`: the cut (and so the 504) came before.
    assert!(
        answered_at < seen.accepted + grant,
        "cut {:?} after the upstream connection, grant {grant:?}",
        answered_at - seen.accepted
    );
    h.shutdown().await;
}
