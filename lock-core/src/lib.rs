//! fencegate's lock core: a replicated lock service with globally monotonic fencing tokens.
//!
//! The design, in the order a request meets it:
//!
//! - [`api`] serves the v1 HTTP API on every node. Any node accepts any call.
//! - [`node`] turns a call into a [`machine::Command`], has the leader stamp it with its clock
//!   and policy ([`machine::Proposal`]) and commits it through openraft ([`raft`]); followers
//!   forward commands to the leader and serve reads after a read barrier.
//! - [`net`] carries raft RPCs between nodes over HTTP, through a fault layer that tests and the
//!   chaos harness use to partition, delay and drop traffic or skew a node's clock.
//! - [`store`] keeps the raft log, vote and snapshots in fjall, fsynced before acknowledging.
//! - [`machine`] is the lock state machine itself: pure, synchronous, deterministic. Every
//!   replica applies the same committed commands and reaches the same state.
//! - [`client`] is the Rust client: retries with one request id, background renewal, and a
//!   lease guard that turns invalid before the server could grant the lock to anyone else.
//!
//! The state machine can be driven directly, which is how its tests work:
//!
//! ```
//! use lock_core::machine::{Acquire, Command, LeaseId, LockMachine, Proposal, Response};
//!
//! let mut m = LockMachine::new();
//! let acquire = |request_id: &str, lease: u128| Command::Acquire(Acquire {
//!     resource: "kv:a".into(),
//!     request_id: request_id.into(),
//!     holder: None,
//!     ttl_ms: 30_000,
//!     wait_timeout_ms: 0,
//!     lease_id: LeaseId(lease),
//!     retain_ms: 600_000,
//!     max_waiters: 16,
//!     max_total_waiters: 1_000,
//!     tenant_limits: None,
//! });
//! let at = |now_ms, cmd| Proposal { now_ms, failover_grace_ms: 1_000, cmd };
//!
//! // The first acquire gets token 1; a second one finds the lock held.
//! let (first, _) = m.apply(&at(1_000, acquire("r1", 7)), 1);
//! assert!(matches!(first, Response::Granted(ref g) if g.fencing_token == 1));
//! let (second, _) = m.apply(&at(1_001, acquire("r2", 8)), 1);
//! assert!(matches!(second, Response::Held { .. }));
//!
//! // A retry of r1 returns the original lease; after expiry the next grant gets token 2.
//! let (retry, _) = m.apply(&at(1_002, acquire("r1", 9)), 1);
//! assert_eq!(retry, first);
//! let (later, _) = m.apply(&at(40_000, acquire("r3", 10)), 1);
//! assert!(matches!(later, Response::Granted(ref g) if g.fencing_token == 2));
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

// The client side: the wire contract, timing facts and the Rust client. Built without the
// `server` feature too, so a client pulls in no raft, storage or HTTP server.
pub mod build_info;
pub mod client;
pub mod timing;
pub mod wire;

// The server side, in layer order from the top: each module only uses those below it.
#[cfg(feature = "server")]
pub mod api;
#[cfg(feature = "server")]
pub mod machine;
#[cfg(feature = "server")]
pub mod net;
#[cfg(feature = "server")]
pub mod node;
#[cfg(feature = "server")]
pub mod raft;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod store;

// Above everything: fixtures for integration tests (an in-process cluster, network faults).
#[cfg(feature = "testkit")]
pub mod testkit;
