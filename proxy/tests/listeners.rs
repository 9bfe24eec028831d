//! The proxy's listener and the demo store's under misbehaving clients — a 10 MiB body, a
//! 2 MiB header, a head trickled a byte at a time — over real sockets, every wait bounded; and
//! the proxy listener over TLS. docs/operations.md lists each listener's limits.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{phase, FenceHarness};
use lock_core::node::TlsFiles;
use lock_core::testkit::raw_http::{self, bytewise, chunked};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

const WAIT: Duration = Duration::from_secs(20);

async fn demo_store() -> (SocketAddr, watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, mut stop_rx) = watch::channel(false);
    tokio::spawn(fencegate_proxy::demo_store::serve(listener, async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    (addr, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_store_refuses_oversized_bodies_and_headers() {
    let (addr, _stop) = demo_store().await;

    phase("a 10 MiB chunked PUT: 413 once it passes the store's 1 MiB limit");
    let head = "PUT /kv/big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
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

    phase("a 1 MiB header: 431");
    let mut big = b"GET /kv/a HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 1 << 20));
    big.extend_from_slice(b"\r\n\r\n");
    let got = raw_http::send(addr, big, vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(431), "{got:?}");

    phase("nothing was stored");
    let got = raw_http::send(
        addr,
        b"GET /kv/big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
        vec![],
        Duration::ZERO,
        WAIT,
    )
    .await;
    assert_eq!(got.status, Some(404), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_listener_bounds_headers_and_passes_the_stores_body_limit_on() {
    let h = FenceHarness::start().await;
    let proxy = first_proxy(&h);

    phase("a 2 MiB header: refused by the proxy (pingora's 1 MiB head limit) and closed");
    let mut big = b"GET /kv/a HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 2 << 20));
    big.extend_from_slice(b"\r\n\r\n");
    let got = raw_http::send(proxy, big, vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(400), "{got:?}");
    assert!(got.closed, "{got:?}");

    phase("a fenced 10 MiB write: streamed, refused by the store's limit, nothing stored");
    let lease = h.acquire("kv:big", "big-writer", 30_000, 0).await;
    let head = format!(
        "PUT /kv/big HTTP/1.1\r\nHost: x\r\nFence-Token: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        lease.token
    );
    let got = raw_http::send(
        proxy,
        head.into_bytes(),
        chunked(10 << 20),
        Duration::ZERO,
        WAIT,
    )
    .await;
    let status = got.status.expect("the proxy answered");
    assert!(
        status == 413 || status == 502,
        "expected the store's 413 (or 502 if the store cut the stream first): {got:?}"
    );
    assert_eq!(h.client.store_value("big").await, None);

    phase("the proxy still forwards");
    let small = h.acquire("kv:small", "small-writer", 30_000, 0).await;
    let ok = h.client.put(1, "small", small.token, "v").await;
    assert_eq!(ok.status, 200, "{ok:?}");
}

/// A client trickling its head one byte every 500 ms to the store is cut off at the store's
/// header timeout (60 s there); with a short wait the test only checks the store keeps serving
/// others meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_client_does_not_block_the_demo_store() {
    let (addr, _stop) = demo_store().await;
    let slow = tokio::spawn(raw_http::send(
        addr,
        vec![],
        bytewise(b"GET /kv/a HTTP/1.1\r\nHost: x\r\n\r\n"),
        Duration::from_millis(500),
        Duration::from_secs(3),
    ));
    let got = raw_http::send(
        addr,
        b"GET /log HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
        vec![],
        Duration::ZERO,
        WAIT,
    )
    .await;
    assert_eq!(got.status, Some(200), "{got:?}");
    let slow = slow.await.expect("slow client");
    assert_eq!(
        slow.status, None,
        "a 3 s trickle of a 30-byte head was answered: {slow:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_listener_serves_tls_with_the_configured_certificate() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let dir = tempfile::tempdir().expect("tempdir");
    let files = TlsFiles {
        cert_file: dir.path().join("cert.pem"),
        key_file: dir.path().join("key.pem"),
    };
    std::fs::write(&files.cert_file, cert.cert.pem()).expect("write cert");
    std::fs::write(&files.key_file, cert.key_pair.serialize_pem()).expect("write key");
    let h = FenceHarness::start_with(|c| c.tls = Some(files.clone())).await;
    let proxy = first_proxy(&h);

    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(cert.cert.der().to_vec()))
        .expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(proxy)
        .await
        .expect("connect");
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake with the proxy");
    // A read passes through unfenced: the store's own answer comes back over TLS.
    let got = raw_http::exchange(
        tls,
        b"GET /kv/none HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
        vec![],
        Duration::ZERO,
        WAIT,
    )
    .await;
    assert_eq!(got.status, Some(404), "{got:?}");
    assert!(got.body.contains("no such key"), "{got:?}");
}

/// The socket address of proxy 1 of the harness.
fn first_proxy(h: &FenceHarness) -> SocketAddr {
    h.client
        .proxy_addr(1)
        .expect("proxy 1")
        .parse()
        .expect("addr")
}

/// The index of the first of `conns` the other side closes, looking for up to `wait`.
async fn first_closed(conns: &mut [tokio::net::TcpStream], wait: Duration) -> Option<usize> {
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        for (i, conn) in conns.iter_mut().enumerate() {
            if raw_http::closed_within(conn, Duration::from_millis(20)).await {
                return Some(i);
            }
        }
    }
    None
}

/// Sends `head` on `conn` a byte every 100 ms, reading what comes back for up to `WAIT`.
async fn trickle(conn: tokio::net::TcpStream, head: &str) -> raw_http::RawReply {
    let bytes = bytewise(head.as_bytes());
    raw_http::exchange(conn, vec![], bytes, Duration::from_millis(100), WAIT).await
}

/// The proxy's request-head deadline (`[proxy.limits] header_timeout_ms`): a head trickled a
/// byte at a time, a connection that sends nothing, and the next head trickled on a kept-alive
/// connection are closed; the idle wait between requests and a body that trickles after a
/// prompt head are not cut by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_listener_bounds_the_time_to_send_a_head() {
    let h = FenceHarness::start_with(|c| {
        c.limits.header_timeout_ms = 500;
        // Unfenced writes, so a slow body is bounded by nothing but the listener.
        c.routes[0].protected_methods = Vec::new();
    })
    .await;
    let proxy = first_proxy(&h);

    phase("a head trickled a byte every 100 ms is cut off unanswered");
    let head = format!(
        "GET /kv/a HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(200)
    );
    let got = trickle(raw_http::idle(proxy).await, &head).await;
    assert!(got.closed && got.status.is_none(), "{got:?}");

    phase("a connection that sends nothing is closed");
    let mut idle = raw_http::idle(proxy).await;
    assert!(raw_http::closed_within(&mut idle, WAIT).await);

    phase("a kept-alive connection idles as before; its next head, trickled, is cut off");
    let mut conn = tokio::net::TcpStream::connect(proxy)
        .await
        .expect("connect");
    conn.write_all(b"GET /kv/none HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1024];
    let n = conn.read(&mut buf).await.expect("answer");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 404"));
    assert!(
        !raw_http::closed_within(&mut conn, Duration::from_millis(1_500)).await,
        "an idle kept-alive connection was closed by the head deadline"
    );
    let got = trickle(conn, &head).await;
    assert!(got.closed && got.status.is_none(), "{got:?}");

    phase("a body trickled for longer than the head deadline still arrives whole");
    let head =
        b"PUT /kv/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\nConnection: close\r\n\r\n";
    let got = raw_http::send(
        proxy,
        head.to_vec(),
        bytewise(b"12345678"),
        Duration::from_millis(200),
        WAIT,
    )
    .await;
    assert_eq!(got.status, Some(200), "{got:?}");
    assert_eq!(
        h.client.store_value("slow").await.as_deref(),
        Some("12345678")
    );

    phase("the closings are counted");
    let (_, metrics) = h.cluster.get(1, "/metrics").await;
    // The series exists from the start (at 0): the close must have counted.
    let counted = metrics.as_str().unwrap_or_default().lines().any(|l| {
        l.starts_with("fencegate_proxy_connections_limited_total{")
            && l.contains("reason=\"header_timeout\"")
            && l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v >= 1.0)
    });
    assert!(counted, "{metrics}");
}

/// The proxy's connection cap (`[proxy.limits] max_connections`): a connection beyond it is
/// closed at once; once a connection ends, its slot serves a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_listener_caps_its_connections() {
    let h = FenceHarness::start_with(|c| {
        c.limits.max_connections = 2;
        c.limits.header_timeout_ms = 60_000;
    })
    .await;
    let proxy = first_proxy(&h);

    phase("of three idle connections, two take both slots and one is closed unanswered");
    // Which one is closed depends on the order in which the proxy's per-connection tasks
    // take their slots, not on the order of the connects.
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(raw_http::idle(proxy).await);
    }
    let closed = first_closed(&mut conns, WAIT)
        .await
        .expect("a connection beyond the cap was closed");
    conns.remove(closed);
    for conn in &mut conns {
        assert!(
            !raw_http::closed_within(conn, Duration::from_millis(200)).await,
            "a connection within the cap was closed"
        );
    }
    phase("the open ones are counted");
    common::eventually(WAIT, "two connections open", async || {
        let (_, metrics) = h.cluster.get(1, "/metrics").await;
        let open = metrics.as_str().unwrap_or_default().lines().find_map(|l| {
            l.strip_prefix("fencegate_proxy_connections_open")
                .and_then(|rest| rest.rsplit(' ').next())
                .map(str::to_owned)
        });
        open.as_deref() == Some("2")
    })
    .await;

    phase("once a connection closes, a new one is served");
    drop(conns.pop());
    common::eventually(WAIT, "a freed slot serves a request", async || {
        let got = raw_http::send(
            proxy,
            b"GET /kv/none HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            vec![],
            Duration::ZERO,
            WAIT,
        )
        .await;
        got.status == Some(404)
    })
    .await;
}
