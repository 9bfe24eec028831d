//! The public API over TLS: a certificate made in the test, a real handshake, a real request.

use std::sync::Arc;
use std::time::Duration;

use lock_core::node::TlsFiles;
use lock_core::testkit::raw_http;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use super::public::get_healthz;
use super::{single_node, try_single_node, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_api_serves_tls_with_the_configured_certificate() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let dir = tempfile::tempdir().expect("tempdir");
    let files = TlsFiles {
        cert_file: dir.path().join("cert.pem"),
        key_file: dir.path().join("key.pem"),
    };
    std::fs::write(&files.cert_file, cert.cert.pem()).expect("write cert");
    std::fs::write(&files.key_file, cert.key_pair.serialize_pem()).expect("write key");
    let (node, _data) = single_node(|c| c.tls = Some(files.clone())).await;

    // A client that trusts exactly this certificate.
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
    let tcp = tokio::net::TcpStream::connect(node.addr)
        .await
        .expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake with the node");
    let got = raw_http::exchange(tls, get_healthz(), vec![], Duration::ZERO, WAIT).await;
    assert_eq!(got.status, Some(200), "{got:?}");

    // Plain HTTP on the TLS port is not served: it is told, in HTTP, to use https.
    let plain = raw_http::send(node.addr, get_healthz(), vec![], Duration::ZERO, WAIT).await;
    assert_eq!(plain.status, Some(400), "{plain:?}");
    assert!(plain.body.contains("plain_http_to_https_port"), "{plain:?}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_certificate_stops_the_node_from_starting_with_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = TlsFiles {
        cert_file: dir.path().join("nope.pem"),
        key_file: dir.path().join("nope.key"),
    };
    let (started, _data) = try_single_node(|c| c.tls = Some(files)).await;
    let err = started
        .err()
        .expect("a node without its certificate started");
    assert!(err.to_string().contains("nope.pem"), "{err}");
}
