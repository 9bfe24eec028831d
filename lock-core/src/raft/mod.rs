//! openraft wiring: the type configuration and the raft configuration used by nodes.

mod types;

pub use types::{FencegateRaft, NodeInfo, RaftConfigExt, TypeConfig};
