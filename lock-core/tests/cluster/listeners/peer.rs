//! The peer port has the same guards as the public API, with its own (larger) body limit: a
//! client that is not a peer cannot make a node buffer more than that limit or hold a
//! connection by trickling bytes. Bodies are bounded before authentication is checked (the tag
//! covers the body), so the bound holds for anyone who can reach the port.

use std::time::Duration;

use lock_core::node::HttpLimits;
use lock_core::testkit::raw_http::{self, bytewise, chunked};

use super::{single_node, tight, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_port_refuses_oversized_and_slow_requests() {
    let (node, _dir) = single_node(|c| {
        c.peer_limits = HttpLimits {
            max_body_bytes: 1 << 20,
            ..tight()
        }
    })
    .await;
    let addr = node.peer_addr;

    let head = "POST /raft/append HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    let got = raw_http::send(
        addr,
        head.as_bytes().to_vec(),
        chunked(10 << 20),
        Duration::ZERO,
        WAIT,
    )
    .await;
    assert_eq!(got.status, Some(413), "{got:?}");
    assert_eq!(got.code().as_deref(), Some("payload_too_large"), "{got:?}");

    let mut big = b"POST /raft/vote HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 1 << 20));
    big.extend_from_slice(b"\r\n\r\n");
    let got = raw_http::send(addr, big, vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(431), "{got:?}");

    let slow = b"POST /raft/vote HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    let got = raw_http::send(
        addr,
        vec![],
        bytewise(slow),
        Duration::from_millis(500),
        WAIT,
    )
    .await;
    assert!(
        got.closed,
        "a trickling client kept its peer connection: {got:?}"
    );
    assert_eq!(got.status, None, "{got:?}");
    node.shutdown().await;
}
