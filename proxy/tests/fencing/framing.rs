//! How the proxy frames what it passes on, against an upstream that misbehaves on cue: an
//! answer cut off midway reaches the client cut off (never as a complete answer with an error
//! inside it), an HTTP/1.0 client gets a body it can read, and nothing the proxy forwards can
//! become a tunnel that carries unfenced writes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencegate_proxy::route::RouteConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{phase, read_head, FenceHarness};

/// An upstream that answers by the request path and records each request head it reads:
/// `/raw/cut` sends 10 of the 20 body bytes it announces and then stalls past the proxy's
/// upstream timeout; `/raw/nolen` answers without a length and closes; `/raw/switch` answers
/// 101; anything else 200 `ok`.
async fn scripted_upstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(answer(conn, seen.clone()));
        }
    });
    (addr, heads)
}

async fn answer(mut conn: TcpStream, heads: Arc<Mutex<Vec<String>>>) {
    let Some(head) = read_head(&mut conn).await else {
        return;
    };
    let path = head.split(' ').nth(1).unwrap_or("").to_string();
    heads.lock().unwrap().push(head);
    let reply: &[u8] = match path.as_str() {
        "/raw/cut" => b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n0123456789",
        "/raw/nolen" => b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello world",
        "/raw/switch" => {
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        }
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    };
    let _ = conn.write_all(reply).await;
    match path.as_str() {
        "/raw/cut" | "/raw/switch" => tokio::time::sleep(Duration::from_secs(5)).await,
        _ => {}
    }
}

/// Sends `request` on a fresh connection to proxy 1 and reads until the proxy closes it.
async fn exchange(h: &FenceHarness, request: &str) -> String {
    let addr = h.client.proxy_addr(1).expect("proxy 1");
    let mut conn = TcpStream::connect(&addr).await.expect("connect");
    conn.write_all(request.as_bytes()).await.expect("send");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), conn.read_to_end(&mut got))
        .await
        .expect("the proxy closed the connection")
        .expect("read");
    String::from_utf8_lossy(&got).into_owned()
}

fn split(reply: &str) -> (&str, &str) {
    reply.split_once("\r\n\r\n").unwrap_or((reply, ""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t90_an_answer_cut_off_upstream_reaches_the_client_cut_off() {
    let (upstream, _) = scripted_upstream().await;
    let h = FenceHarness::start_with(|c| {
        c.routes
            .push(RouteConfig::new("/raw/{key}", "raw:{key}", &upstream));
    })
    .await;

    phase("20 bytes announced, 10 sent, then silence past the upstream timeout");
    let reply = exchange(&h, "GET /raw/cut HTTP/1.1\r\nHost: t\r\n\r\n").await;
    let (head, body) = split(&reply);
    assert!(head.starts_with("HTTP/1.1 200"), "{reply:?}");
    assert_eq!(
        body, "0123456789",
        "the client must see the answer end early, with nothing of the proxy's in it"
    );

    phase("the same on an HTTP/1.0 request: no chunk framing, only the bytes that came");
    let reply = exchange(&h, "GET /raw/nolen HTTP/1.0\r\nHost: t\r\n\r\n").await;
    let (head, body) = split(&reply);
    assert!(head.starts_with("HTTP/1."), "{reply:?}");
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "an HTTP/1.0 client cannot read chunks: {reply:?}"
    );
    assert_eq!(body, "hello world", "{reply:?}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_no_upgrade_and_no_unknown_transfer_coding_passes() {
    let (upstream, heads) = scripted_upstream().await;
    let h = FenceHarness::start_with(|c| {
        c.routes
            .push(RouteConfig::new("/raw/{key}", "raw:{key}", &upstream));
    })
    .await;
    let lease = h.acquire("raw:x", "up-1", 30_000, 0).await;

    phase("a WebSocket upgrade is refused before it reaches the upstream");
    let reply = exchange(
        &h,
        "GET /raw/x HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n\
         PUT /raw/x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nSMUG!",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 501"), "{reply:?}");
    assert!(reply.contains("upgrade_not_supported"), "{reply:?}");

    phase("a transfer coding other than chunked is refused, token or not");
    let reply = exchange(
        &h,
        &format!(
            "PUT /raw/x HTTP/1.1\r\nHost: t\r\nFence-Token: {}\r\n\
             Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n",
            lease.token
        ),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 501"), "{reply:?}");
    assert!(reply.contains("unsupported_transfer_encoding"), "{reply:?}");
    assert!(
        heads.lock().unwrap().is_empty(),
        "the upstream saw a request"
    );

    phase("an h2c offer is answered in HTTP/1.1 and not passed on");
    let reply = exchange(
        &h,
        "GET /raw/x HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings, close\r\n\
         Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    let forwarded = heads.lock().unwrap().last().cloned().expect("forwarded");
    let lower = forwarded.to_ascii_lowercase();
    assert!(
        !lower.contains("upgrade") && !lower.contains("http2-settings"),
        "{forwarded}"
    );

    phase("an upstream that switches protocols unasked is an upstream error, not a tunnel");
    let reply = exchange(&h, "GET /raw/switch HTTP/1.1\r\nHost: t\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 502"), "{reply:?}");
    h.shutdown().await;
}

/// WebDAV's MOVE and COPY write to their `Destination` too: a token of one resource must not
/// write another's data through it, however the destination is spelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t92_a_destination_outside_the_fenced_resource_is_refused() {
    let (upstream, heads) = scripted_upstream().await;
    let h = FenceHarness::start_with(|c| {
        c.routes.push(RouteConfig::new(
            "/raw/{project}/**",
            "raw:{project}",
            &upstream,
        ));
    })
    .await;
    let lease = h.acquire("raw:a", "dest-1", 30_000, 0).await;
    let copy = |dest: &str| {
        format!(
            "COPY /raw/a/f HTTP/1.1\r\nHost: t\r\nFence-Token: {}\r\nDestination: {dest}\r\n\
             Connection: close\r\n\r\n",
            lease.token
        )
    };

    phase("another resource's path, an unrouted path, dot segments: 400 before the upstream");
    for dest in [
        "http://t/raw/b/f",
        "/raw/b/f",
        "http://t/elsewhere/f",
        "http://t/raw/a/../b/f",
        "http://t/raw/a/%2e%2e/b/f",
        "http://t/raw/a/f?x",
    ] {
        let reply = exchange(&h, &copy(dest)).await;
        assert!(reply.starts_with("HTTP/1.1 400"), "{dest}: {reply:?}");
        assert!(reply.contains("invalid_destination"), "{dest}: {reply:?}");
    }
    phase("two Destination headers, the second one elsewhere: a store may join them");
    let twice = format!(
        "COPY /raw/a/f HTTP/1.1\r\nHost: t\r\nFence-Token: {}\r\nDestination: /raw/a/x\r\n\
         Destination: /../../b/secret\r\nConnection: close\r\n\r\n",
        lease.token
    );
    let reply = exchange(&h, &twice).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply:?}");
    assert!(reply.contains("invalid_destination"), "{reply:?}");
    assert!(
        heads.lock().unwrap().is_empty(),
        "a refused COPY reached the upstream"
    );

    phase("within the fenced resource it is forwarded with its Destination");
    let reply = exchange(&h, &copy("http://t/raw/a/g")).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    let seen = heads.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0]
            .to_ascii_lowercase()
            .contains("destination: http://t/raw/a/g"),
        "{seen:?}"
    );
    h.shutdown().await;
}

/// An HTTP/1.0 client may send no Host; the request goes upstream as HTTP/1.1, which needs
/// one (a store such as Apache answers 400 without it): the upstream's address is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t93_an_http_1_0_request_without_host_reaches_the_upstream_with_one() {
    let (upstream, heads) = scripted_upstream().await;
    let h = FenceHarness::start_with(|c| {
        c.routes
            .push(RouteConfig::new("/raw/{key}", "raw:{key}", &upstream));
    })
    .await;
    let reply = exchange(&h, "GET /raw/x HTTP/1.0\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1."), "{reply:?}");
    let seen = heads.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0]
            .to_ascii_lowercase()
            .contains(&format!("\r\nhost: {upstream}\r\n")),
        "{seen:?}"
    );

    phase("a Host the client sent is kept");
    let reply = exchange(&h, "GET /raw/y HTTP/1.0\r\nHost: store.example\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1."), "{reply:?}");
    let seen = heads.lock().unwrap().clone();
    assert!(
        seen[1].contains("\r\nHost: store.example\r\n")
            || seen[1].contains("\r\nhost: store.example\r\n"),
        "{seen:?}"
    );
    h.shutdown().await;
}

/// A store that picks its target by `Host` (S3's virtual-hosted buckets, name-based virtual
/// hosts): routes with `hosts` serve only those hosts, so a token for one host's resource
/// cannot write another host's data by changing the `Host` it sends; `upstream_host` replaces
/// the client's `Host` on the way to the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t94_a_route_with_hosts_serves_only_its_hosts() {
    let (upstream, heads) = scripted_upstream().await;
    let h = FenceHarness::start_with(|c| {
        let mut photos = RouteConfig::new("/raw/**", "bucket:photos", &upstream);
        photos.hosts = vec!["photos.store.example".into()];
        let mut docs = RouteConfig::new("/raw/**", "bucket:docs", &upstream);
        docs.hosts = vec!["docs.store.example".into()];
        docs.upstream_host = Some("docs.internal".into());
        // Ahead of the harness's own routes, which serve every host.
        c.routes.insert(0, docs);
        c.routes.insert(0, photos);
    })
    .await;
    let lease = h.acquire("bucket:docs", "hosts-1", 30_000, 0).await;
    let put = |host: &str| {
        format!(
            "PUT /raw/report HTTP/1.1\r\nHost: {host}\r\nFence-Token: {}\r\nContent-Length: 2\r\n\
             Connection: close\r\n\r\nhi",
            lease.token
        )
    };

    phase("the docs token, sent for the photos host: fenced as photos, refused");
    let reply = exchange(&h, &put("photos.store.example")).await;
    assert!(reply.starts_with("HTTP/1.1 412"), "{reply:?}");

    phase("a host no route serves, and two Host headers: refused before the upstream");
    let reply = exchange(&h, &put("other.store.example")).await;
    assert!(reply.starts_with("HTTP/1.1 404"), "{reply:?}");
    assert!(reply.contains("no_route"), "{reply:?}");
    let twice = format!(
        "PUT /raw/report HTTP/1.1\r\nHost: docs.store.example\r\nHost: photos.store.example\r\n\
         Fence-Token: {}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        lease.token
    );
    let reply = exchange(&h, &twice).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply:?}");
    assert!(
        heads.lock().unwrap().is_empty(),
        "a refused write reached the upstream"
    );

    phase("for its own host it is forwarded, with the route's upstream_host");
    // Nor can a forwarding header name another host to a store behind further proxies.
    let put_forwarded = put("DOCS.store.example:8443").replace(
        "Connection: close",
        "X-Forwarded-Host: photos.store.example\r\nForwarded: host=photos.store.example\r\n\
         Connection: close",
    );
    let reply = exchange(&h, &put_forwarded).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    let seen = heads.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let head = seen[0].to_ascii_lowercase();
    assert!(head.contains("\r\nhost: docs.internal\r\n"), "{seen:?}");
    assert!(!head.contains("store.example"), "{seen:?}");
    assert!(!head.contains("forwarded"), "{seen:?}");
    h.shutdown().await;
}
