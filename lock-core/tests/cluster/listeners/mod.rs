//! Every listener holds its clients to its limits (body and header size, slow clients, idle
//! connections) and answers each breach with a clear status — over real sockets, with a
//! misbehaving raw client, every wait bounded. And the public API over TLS.

mod peer;
mod public;
mod tls;

use std::collections::BTreeMap;
use std::time::Duration;

use lock_core::net::PeerSecret;
use lock_core::node::{HttpLimits, MemberAddrs, NodeConfig, NodeError};
use lock_core::server::{self, NodeHandle};
use tempfile::TempDir;
use tokio::net::TcpListener;

/// Short timeouts so a test sees them fire; small bounds so it can exceed them cheaply.
pub fn tight() -> HttpLimits {
    HttpLimits {
        max_body_bytes: 64 * 1024,
        max_header_bytes: 16 * 1024,
        header_timeout_ms: 1_500,
        body_timeout_ms: 1_500,
        send_timeout_ms: 1_500,
        max_connections: 4,
    }
}

/// How long a test waits for an answer or a close: several times every timeout above.
pub const WAIT: Duration = Duration::from_secs(15);

/// A one-node cluster with `tweak` applied to its config.
pub async fn single_node(tweak: impl FnOnce(&mut NodeConfig)) -> (NodeHandle, TempDir) {
    let (started, dir) = try_single_node(tweak).await;
    (started.expect("start node"), dir)
}

/// [`single_node`], returning the start's error.
pub async fn try_single_node(
    tweak: impl FnOnce(&mut NodeConfig),
) -> (Result<NodeHandle, NodeError>, TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let peer = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let members = BTreeMap::from([(
        1,
        MemberAddrs {
            api: api.local_addr().expect("addr").to_string(),
            peer: peer.local_addr().expect("addr").to_string(),
        },
    )]);
    let secret = PeerSecret::new(&PeerSecret::generate()).expect("secret");
    let mut config = NodeConfig::new(1, dir.path().join("node1"), members, secret);
    tweak(&mut config);
    let started = server::start(config, api, peer, std::future::pending()).await;
    (started, dir)
}
