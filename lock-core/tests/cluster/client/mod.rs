//! The Rust client library on real 3-node clusters: background renewal, a lease guard that turns
//! invalid before anyone else could be granted the lock, retries with one request id, and
//! cancel on drop. Faults between client and cluster come from `lock_core::testkit::TcpRelay`.

mod leader;
mod lease;
mod options;
mod retry;
mod store;
mod timing;

use std::time::Duration;

use lock_core::client::Client;
use lock_core::testkit::TestCluster;

pub const SEC: Duration = Duration::from_secs(1);

pub fn direct_client(c: &TestCluster) -> Client {
    Client::new(c.addrs.values().map(|a| format!("http://{a}"))).expect("client")
}

pub async fn lock_status(c: &TestCluster, resource: &str) -> serde_json::Value {
    let id = c.running()[0];
    let (s, v) = c.get(id, &format!("/v1/locks/{resource}")).await;
    assert_eq!(s, 200, "{v}");
    v
}
