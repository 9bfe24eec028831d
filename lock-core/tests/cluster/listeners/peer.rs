//! The peer port has the same guards as the public API, with its own (larger) body limit. A
//! client without the peer secret is refused from the request head, before its body is read;
//! a peer's body is read up to the limit. Nobody holds a connection by trickling bytes.

use std::time::Duration;

use lock_core::net::{PeerSecret, AUTH_HEADER, FROM_HEADER};
use lock_core::node::HttpLimits;
use lock_core::testkit::phase;
use lock_core::testkit::raw_http::{self, bytewise, chunked};

use super::{single_node, tight, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_port_refuses_oversized_and_slow_requests() {
    let secret = PeerSecret::new(&PeerSecret::generate()).expect("secret");
    let cluster_secret = secret.clone();
    let (node, _dir) = single_node(|c| {
        c.peer_secret = Some(cluster_secret);
        c.peer_limits = HttpLimits {
            max_body_bytes: 1 << 20,
            ..tight()
        }
    })
    .await;
    let addr = node.peer_addr;

    phase("a stranger announcing 10 MiB is refused before the body is read");
    let head = format!(
        "POST /raft/append HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        10 << 20
    );
    let got = raw_http::send(addr, head.into_bytes(), vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(401), "{got:?}");
    assert_eq!(
        got.code().as_deref(),
        Some("peer_unauthenticated"),
        "{got:?}"
    );

    phase("a peer sending 10 MiB (chunked) is cut off at the peer body limit");
    let body = vec![b'a'; 10 << 20];
    let tag = secret.sign("2", "/raft/append", &body);
    let head = format!(
        "POST /raft/append HTTP/1.1\r\nHost: x\r\n{FROM_HEADER}: 2\r\n{AUTH_HEADER}: {tag}\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    );
    let got = raw_http::send(
        addr,
        head.into_bytes(),
        chunked(body.len()),
        Duration::ZERO,
        WAIT,
    )
    .await;
    assert_eq!(got.status, Some(413), "{got:?}");
    assert_eq!(got.code().as_deref(), Some("payload_too_large"), "{got:?}");

    phase("a 1 MiB header is refused with 431");
    let mut big = b"POST /raft/vote HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 1 << 20));
    big.extend_from_slice(b"\r\n\r\n");
    let got = raw_http::send(addr, big, vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(431), "{got:?}");

    phase("a head trickled a byte every 500 ms is cut off");
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
