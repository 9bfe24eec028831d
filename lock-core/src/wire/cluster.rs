//! Bodies of the cluster endpoints: `GET /v1/cluster`, membership changes, `/healthz`,
//! `/readyz` and the fault-injection admin call.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A node's raft role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

/// One member of the cluster's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: u64,
    /// `host:port` of the member's API.
    pub addr: String,
    /// `host:port` of the member's peer listener.
    #[serde(default)]
    pub peer_addr: String,
    /// False for a learner.
    pub voter: bool,
}

/// Aggregate numbers of the lock state, as this node has applied it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockStats {
    /// Log time: the latest leader stamp applied, ms since the Unix epoch.
    pub now_ms: u64,
    pub term: u64,
    /// The global fencing-token counter.
    pub last_token: u64,
    pub resources: u64,
    pub active_locks: u64,
    pub waiters: u64,
    pub dedup_records: u64,
}

/// `GET /v1/cluster`: this node's own view (a status page, not a linearizable read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub node_id: u64,
    pub leader_id: Option<u64>,
    pub term: u64,
    /// This node's role.
    pub role: Role,
    pub members: Vec<Member>,
    pub last_log_index: Option<u64>,
    pub last_applied: u64,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    /// On the leader: how long ago a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    pub locks: LockStats,
}

impl ClusterStatus {
    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }
}

/// `POST /v1/cluster/members/add`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddMemberRequest {
    pub node_id: u64,
    /// `host:port` where the new node's API listens.
    pub addr: String,
    /// `host:port` where the new node's peer listener listens.
    #[serde(default)]
    pub peer_addr: String,
    /// How long the new node may take to catch up with the leader's log before the add is
    /// refused (default 20 s, at most 10 min).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_timeout_ms: Option<u64>,
}

/// `POST /v1/cluster/members/remove`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveMemberRequest {
    pub node_id: u64,
    /// Remove even if fewer than a quorum of the remaining voters answer.
    #[serde(default)]
    pub force: bool,
}

/// The voter set after a membership change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipResponse {
    pub voters: BTreeSet<u64>,
}

/// `GET /healthz`: the process is up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthStatus {
    pub status: String,
}

/// `GET /readyz` when ready: this node knows a leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyStatus {
    pub status: String,
    pub leader_id: u64,
    /// This node's wall clock when it answered, ms since the Unix epoch. The other members
    /// compare it with theirs (absent from nodes of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_ms: Option<u64>,
    /// This node's monotonic clock, ms since the process started: the other members compare
    /// its rate with their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monotonic_ms: Option<u64>,
    /// The index of the last log entry this node applied: the other members compare theirs
    /// with the leader's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_index: Option<u64>,
    /// The build this node runs: its version and commit, as `0.1.0 (1a2b3c4d5e6f)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// What happens to traffic between this node and one peer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// Drop everything in both directions (a partition).
    #[serde(default)]
    pub blocked: bool,
    /// Delay every outgoing request by this long.
    #[serde(default)]
    pub delay_ms: u64,
    /// Drop this fraction (0.0–1.0) of outgoing requests.
    #[serde(default)]
    pub drop_rate: f64,
}

/// The whole fault configuration of a node, as shown and set by the admin endpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultSnapshot {
    #[serde(default)]
    pub peers: BTreeMap<u64, FaultRule>,
    #[serde(default)]
    pub clock_offset_ms: i64,
}
