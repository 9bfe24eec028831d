//! openraft wiring: the type configuration and the raft configuration used by nodes.

mod snapshot_stream;
mod types;

pub use snapshot_stream::SnapshotStream;
pub use types::{FencegateRaft, NodeInfo, RaftConfigExt, TypeConfig};
