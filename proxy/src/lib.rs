//! The fencing proxy: pingora in front of stores that cannot check fencing tokens.
//!
//! A protected write reaches the upstream only if its `Fence-Token` is the current token of
//! the resource its path maps to, decided against the lock cluster's replicated state. The
//! decision logic is pure ([`verdict`]); [`gate`] adds the local grant cache and the consensus
//! round trip; [`service`] is the pingora glue; [`server`] runs it inside a node's tokio
//! runtime on a listener the caller bound, until a shutdown future the caller passes
//! completes.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod config;
pub mod conn_limits;
pub mod demo_store;
pub mod gate;
pub mod idempotency;
pub mod metrics;
pub mod quota;
pub mod route;
pub mod send_deadline;
pub mod server;
pub mod service;
pub mod tenant;
pub mod verdict;
