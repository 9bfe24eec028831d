//! A running fencegate node: raft + storage + the HTTP API on one listener.
//!
//! [`Node`] is the shared state every handler sees; [`start`] wires the pieces and returns a
//! [`NodeHandle`] that can shut the node down gracefully or crash it (for tests).

mod config;
mod metrics;
mod server;
mod sweeper;
mod waits;

pub use config::{NodeConfig, Policy};
pub use metrics::Metrics;
pub use server::{start, Node, NodeError, NodeHandle, ProposeError};
pub use waits::{WaitOutcome, WaitRegistry, WaitTicket};
