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
