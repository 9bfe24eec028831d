//! The lock service on real clusters: real raft over TCP, real fjall in temp dirs and the real
//! HTTP API, every node on an OS-chosen port of 127.0.0.1 so tests run side by side
//! (`lock_core::testkit`).
//!
//! - `api`: every call of the v1 API, on the leader and on followers, one file per concern.
//! - `auth`: API keys and tenants on clusters that require keys.
//! - `client`: the Rust client library, with faults between it and the cluster.
//! - `faults`: the invariants under leader kills, partitions, clock skew, whole-cluster restarts
//!   and follower catch-up.
//! - `replication`: command batching, the authenticated peer port, snapshot catch-up.
//!
//! Each test starts its own cluster and reads as linear phases, a `phase` line each in the
//! output; comments name the invariant a phase checks. Waits poll observable state with
//! deadlines instead of sleeping a fixed time.

mod api;
mod auth;
mod client;
mod faults;
mod listeners;
mod replication;
