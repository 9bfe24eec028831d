//! The fencegate clusters both harnesses run against.
//!
//! - [`LocalCluster`]: three `fencegate node` processes the harness starts itself (temp data
//!   dirs, free 127.0.0.1 ports, optionally fencing proxies in front of a demo store), with
//!   everything the scenarios and the nemesis do to them: kill, stop, pause, resume, restart,
//!   fault rules.
//! - [`status`]: what any cluster says about itself, local or `--target`: its nodes'
//!   `GET /v1/cluster` as `lock_core::wire::ClusterStatus`, the leader, readiness.
//! - [`process`]: finding the binary, free ports, spawning and signalling processes.

mod local;
pub mod process;
pub mod status;

pub use local::{ClusterSpec, LocalCluster, ProxySpec, QuotaSetup, LOCAL_NODES};
