//! The openraft type configuration of fencegate.

use serde::{Deserialize, Serialize};

use super::SnapshotStream;
use crate::machine::{Batch, Response};
use crate::timing;

/// How a raft member is reached: its public API address and its peer address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// `host:port` of the node's public HTTP API.
    pub api_addr: String,
    /// `host:port` of the node's peer listener (raft RPCs, forwarding). Membership records
    /// written before peers had their own port lack it and read as empty.
    #[serde(default)]
    pub peer_addr: String,
}

impl NodeInfo {
    /// Where peer traffic for this member goes. A record from before the peer port existed
    /// names only the API address, where peer calls were served then.
    pub fn peer_addr(&self) -> &str {
        if self.peer_addr.is_empty() {
            &self.api_addr
        } else {
            &self.peer_addr
        }
    }
}

impl std::fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "api {} peer {}", self.api_addr, self.peer_addr())
    }
}

openraft::declare_raft_types!(
    /// Types of the fencegate raft group: log payloads are stamped batches of lock commands,
    /// and applying one answers one response per command.
    pub TypeConfig:
        D = Batch,
        R = Vec<Response>,
        NodeId = u64,
        Node = NodeInfo,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = SnapshotStream,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type FencegateRaft = openraft::Raft<TypeConfig>;

/// Raft configuration used by nodes; see docs/architecture.md for the reasoning.
pub trait RaftConfigExt {
    /// The configuration of a node with heartbeat and election `timing`.
    fn fencegate(timing: &timing::RaftTiming) -> openraft::Config;
}

impl RaftConfigExt for openraft::Config {
    fn fencegate(timing: &timing::RaftTiming) -> openraft::Config {
        openraft::Config {
            cluster_name: "fencegate".to_string(),
            // Also how long the leader waits for one append's answer.
            heartbeat_interval: timing.heartbeat_ms,
            election_timeout_min: timing.election_timeout_ms,
            election_timeout_max: timing.election_timeout_max_ms(),
            // The node asks for its snapshots itself, each member at its own offset into the
            // interval (`node::snapshots`).
            snapshot_policy: openraft::SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: timing::LOG_KEPT_BEHIND_SNAPSHOT,
            // Entries are batches of up to `MAX_BATCH` commands; this bounds an append's body
            // (a few MB at most) well under the peer body limit.
            max_payload_entries: 256,
            // Snapshots cross in chunks of this size (raw bytes, see `net::codec`); the
            // timeout covers one chunk, and the last one includes the follower's install.
            snapshot_max_chunk_size: timing::SNAPSHOT_CHUNK_BYTES,
            install_snapshot_timeout: timing::SNAPSHOT_CHUNK_TIMEOUT_MS,
            ..Default::default()
        }
    }
}
