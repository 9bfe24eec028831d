//! Fixtures for integration tests, behind the `testkit` feature; not for production use.
//!
//! Everything here is real: [`TestCluster`] starts nodes in-process with real raft over TCP
//! sockets on ports the OS picks on 127.0.0.1, real fjall in temp dirs and the real HTTP API,
//! so many clusters run side by side. [`TcpRelay`] stands in for the network between one client
//! and one node (stall it, lose answers). [`phase`] and [`eventually`] make a test read as a
//! story of phases and wait for events instead of sleeping.
//!
//! lock-core's own tests enable the feature through a dev-dependency on the crate itself; other
//! crates add `lock-core = { path = "../lock-core", features = ["testkit"] }` to their
//! dev-dependencies.

mod api_client;
mod bulk;
mod cluster;
pub mod raw_http;
mod relay;
mod wait;

pub use api_client::ApiClient;
pub use cluster::{TestCluster, TEST_ADMIN_TOKEN};
pub use relay::TcpRelay;
pub use wait::{eventually, phase};

/// How many cases a fuzz test runs: `default` (sized for the test suite), or `PROPTEST_CASES`
/// when set — the long runs recorded in docs/verification.md set it.
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
