//! The public API's listener: a body or header over the limit is refused without being
//! buffered, a client trickling its request is cut off, idle connections are closed and the
//! connection bound never stops the node from serving.

use std::time::Duration;

use lock_core::testkit::phase;
use lock_core::testkit::raw_http::{self, bytewise, chunked};

use super::{single_node, tight, WAIT};

const TEN_MIB: usize = 10 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_without_being_read() {
    let (node, _dir) = single_node(|c| c.limits = tight()).await;
    let addr = node.addr;

    phase("a 10 MiB body announced by Content-Length: refused before it is sent");
    let head = format!(
        "POST /v1/locks/a/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {TEN_MIB}\r\n\r\n"
    );
    let got = raw_http::send(addr, head.into_bytes(), vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(413), "{got:?}");
    assert_eq!(got.code().as_deref(), Some("payload_too_large"), "{got:?}");

    phase("a 10 MiB chunked body: refused once it passes the limit");
    let head = "POST /v1/locks/a/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\n\r\n";
    let got = raw_http::send(
        addr,
        head.as_bytes().to_vec(),
        chunked(TEN_MIB),
        Duration::ZERO,
        WAIT,
    )
    .await;
    assert_eq!(got.status, Some(413), "{got:?}");
    assert_eq!(got.code().as_deref(), Some("payload_too_large"), "{got:?}");

    phase("the node still serves");
    let ok = raw_http::send(addr, get_healthz(), vec![], Duration::ZERO, WAIT).await;
    assert_eq!(ok.status, Some(200), "{ok:?}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_header_gets_431() {
    let (node, _dir) = single_node(|c| c.limits = tight()).await;
    let mut head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 1 << 20));
    head.extend_from_slice(b"\r\n\r\n");
    let got = raw_http::send(node.addr, head, vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(431), "{got:?}");
    assert!(got.closed, "the connection stays open after a refused head");
    node.shutdown().await;
}

/// Slowloris: a head sent one byte every 500 ms never completes within the header timeout;
/// the node closes the connection instead of waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_trickled_byte_by_byte_is_cut_off() {
    let (node, _dir) = single_node(|c| c.limits = tight()).await;
    let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n\r\n";
    let got = raw_http::send(
        node.addr,
        vec![],
        bytewise(head),
        Duration::from_millis(500),
        WAIT,
    )
    .await;
    // The whole head takes ~23 s to trickle in; the header timeout is 1.5 s.
    assert!(
        got.closed,
        "a trickling client kept its connection: {got:?}"
    );
    assert_eq!(got.status, None, "the trickled request was served: {got:?}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_trickled_byte_by_byte_gets_408() {
    let (node, _dir) = single_node(|c| c.limits = tight()).await;
    let body = br#"{"request_id":"slow-body-request-0001"}"#;
    let head = format!(
        "POST /v1/locks/a/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let got = raw_http::send(
        node.addr,
        head.into_bytes(),
        bytewise(body),
        Duration::from_millis(500),
        WAIT,
    )
    .await;
    assert_eq!(got.status, Some(408), "{got:?}");
    assert_eq!(got.code().as_deref(), Some("request_timeout"), "{got:?}");
    node.shutdown().await;
}

/// A client that sends request after request and reads none of the answers: once the node's
/// writes have waited `send_timeout_ms` for it, the connection is closed (it kept its slot
/// forever before). What the socket buffers held is all the client ever gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_no_answers_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (node, _dir) = single_node(|c| c.limits = tight()).await;
    const REQUESTS: usize = 2_000;

    phase("pipeline 2,000 GET /metrics (tens of MB of answers) and read nothing");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("small window");
    let mut conn = socket.connect(node.addr).await.expect("connect");
    let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    let requests: Vec<u8> = request.repeat(REQUESTS);
    let _ = tokio::time::timeout(WAIT, conn.write_all(&requests)).await;
    tokio::time::sleep(Duration::from_secs(8)).await;

    phase("the node closed the connection: far fewer answers arrive than were asked for");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(WAIT, conn.read_to_end(&mut got)).await;
    let answers = got.windows(15).filter(|w| w == b"HTTP/1.1 200 OK").count();
    assert!(
        answers < REQUESTS / 2,
        "{answers} of {REQUESTS} answers arrived: the node kept serving a client that read none"
    );
    node.shutdown().await;
}

/// Many connections that send nothing: the node serves at most `max_connections` at once,
/// closes idle ones at the header timeout, and a real client is served in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_bounded_and_closed() {
    let (node, _dir) = single_node(|c| c.limits = tight()).await;
    let addr = node.addr;

    phase("open 16 idle connections against a bound of 4");
    let mut idle = Vec::new();
    for _ in 0..16 {
        idle.push(raw_http::idle(addr).await);
    }

    phase("a real request is still answered (after idle ones were closed)");
    let got = raw_http::send(addr, get_healthz(), vec![], Duration::ZERO, WAIT * 4).await;
    assert_eq!(got.status, Some(200), "{got:?}");

    phase("every idle connection is closed by the node");
    for (i, conn) in idle.iter_mut().enumerate() {
        assert!(
            raw_http::closed_within(conn, WAIT * 4).await,
            "idle connection {i} still open"
        );
    }

    phase("a keep-alive client that goes quiet after its answer is closed too");
    let keep_alive = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    let got = raw_http::send(addr, keep_alive, vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(200), "{got:?}");
    assert!(got.closed, "an idle keep-alive connection stayed open");
    node.shutdown().await;
}

pub fn get_healthz() -> Vec<u8> {
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec()
}
