//! `Idempotency-Key` on the proxy: at most one upstream effect per (tenant, route, key).
//!
//! [`contract`] is the pure part (key rules, fingerprint, which answers are final, how answers
//! are stored); [`layer`] runs a request through the replicated record (claim, forward,
//! complete, replay, reconcile). The record's state machine itself is
//! `lock_core::machine::IdempotencyMachine`, applied on every node to an on-disk keyspace.
//! docs/idempotency.md has the contract and its limits.

pub mod contract;
pub mod layer;

pub use contract::{IdempotencyMode, IdempotencyOptions};
pub use layer::{AdmitFuture, Handled, IdempotencyLayer, Permit, Refusal};
