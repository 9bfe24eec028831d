//! A store reached over TLS (`upstream_tls`): the proxy verifies the store's certificate
//! against the route's authorities and name, and fences what it forwards as over plain HTTP.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencegate_proxy::route::RouteConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

use crate::common::{phase, read_request, FenceHarness};

/// An HTTPS upstream for `localhost` that answers 200 `ok` on kept-alive connections and
/// records each request head; returns its address and the PEM of the authority that signed its
/// certificate.
async fn tls_upstream() -> (String, String, Arc<Mutex<Vec<String>>>) {
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .signed_by(&key, &ca, &ca_key)
        .expect("cert");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(conn).await else {
                    return;
                };
                // Keep-alive: the proxy may pool this connection.
                while let Some(head) = read_request(&mut tls).await {
                    seen.lock().unwrap().push(head);
                    let answered = tls
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await;
                    if answered.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, ca.pem(), heads)
}

async fn put(h: &FenceHarness, path: &str, token: u64) -> String {
    let addr = h.client.proxy_addr(1).expect("proxy 1");
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let request = format!(
        "PUT {path} HTTP/1.1\r\nHost: t\r\nFence-Token: {token}\r\nContent-Length: 2\r\n\
         Connection: close\r\n\r\nhi"
    );
    conn.write_all(request.as_bytes()).await.expect("send");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), conn.read_to_end(&mut got))
        .await
        .expect("the proxy closed the connection")
        .expect("read");
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t95_a_store_over_tls_is_verified_and_fenced() {
    let (upstream, ca_pem, heads) = tls_upstream().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_file = dir.path().join("store-ca.pem");
    std::fs::write(&ca_file, &ca_pem).expect("write ca");
    let other_ca = dir.path().join("other-ca.pem");
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("other");
    std::fs::write(&other_ca, other.cert.pem()).expect("write other ca");
    let h = FenceHarness::start_with(|c| {
        let mut good = RouteConfig::new("/secure/{key}", "secure:{key}", &upstream);
        good.upstream_tls = true;
        good.upstream_sni = Some("localhost".into());
        good.upstream_ca_file = Some(ca_file.clone());
        let mut wrong_ca = RouteConfig::new("/wrongca/{key}", "secure:{key}", &upstream);
        wrong_ca.upstream_tls = true;
        wrong_ca.upstream_sni = Some("localhost".into());
        wrong_ca.upstream_ca_file = Some(other_ca.clone());
        let mut wrong_name = RouteConfig::new("/wrongname/{key}", "secure:{key}", &upstream);
        wrong_name.upstream_tls = true;
        wrong_name.upstream_sni = Some("store.example".into());
        wrong_name.upstream_ca_file = Some(ca_file.clone());
        c.routes.extend([good, wrong_ca, wrong_name]);
    })
    .await;
    let lease = h.acquire("secure:a", "tls-1", 30_000, 0).await;

    phase("the current token's write reaches the store over TLS");
    let reply = put(&h, "/secure/a", lease.token).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    assert_eq!(heads.lock().unwrap().len(), 1);

    phase("a stale token is refused before any connection to the store");
    let next = {
        h.release(&lease).await;
        h.acquire("secure:a", "tls-2", 30_000, 10_000).await
    };
    let reply = put(&h, "/secure/a", lease.token).await;
    assert!(reply.starts_with("HTTP/1.1 412"), "{reply:?}");
    assert_eq!(
        heads.lock().unwrap().len(),
        1,
        "a stale write reached the store"
    );

    phase("a certificate the route's authorities did not sign, or for another name: 502");
    // The good route's connection to this store is pooled now: another route must not reuse
    // a connection that other authorities verified.
    for path in ["/wrongca/a", "/wrongname/a"] {
        let reply = put(&h, path, next.token).await;
        assert!(reply.starts_with("HTTP/1.1 502"), "{path}: {reply:?}");
        assert!(reply.contains("upstream_unavailable"), "{path}: {reply:?}");
        assert!(
            reply.contains("TLS handshake") && !reply.contains("127.0.0.1:"),
            "{path}: what failed, not where the store is: {reply:?}"
        );
        assert!(reply.contains("Nothing was sent"), "{path}: {reply:?}");
    }
    assert_eq!(
        heads.lock().unwrap().len(),
        1,
        "an unverified store got a write"
    );
    h.shutdown().await;
}
