//! Bodies of the operator endpoints the admin UI reads and acts through: the cluster overview
//! with every member's health, resource detail, hot resources, the metrics time series, the
//! audit tail, and the operator actions (forced release, leader drain, snapshot, membership).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cluster::{ClusterStatus, Role};
use super::locks::LockView;

/// `GET /v1/admin/overview`: this node's status plus how it sees every other member.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterOverview {
    /// This node's own raft view (the node that served the page).
    pub status: ClusterStatus,
    /// Every member of the configuration, this node included, in id order.
    pub peers: Vec<PeerHealth>,
    /// The latest leader elections this node saw, newest last (at most a few dozen).
    pub elections: Vec<ElectionRecord>,
    /// Whether operator actions are possible on this node (an admin token is configured).
    pub actions_enabled: bool,
}

/// One member as seen from the node that answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerHealth {
    pub id: u64,
    pub addr: String,
    pub voter: bool,
    /// Whether the member answered its last `/readyz` probe (a ready node knows a leader).
    pub up: bool,
    /// The leader the member named in its last answer.
    pub leader_id: Option<u64>,
    /// Wall-clock time of the last answer, ms since the Unix epoch.
    pub last_seen_ms: Option<u64>,
    /// Why the last probe failed, if it did.
    pub error: Option<String>,
    /// Role as far as this node knows: exact for itself and for every member when this node
    /// leads; otherwise the leader is known and the rest are shown as followers.
    pub role: Option<Role>,
    /// On the leader: the highest log index known to be replicated to this member.
    pub matched_index: Option<u64>,
    /// On the leader: how many entries this member is behind the leader's log.
    pub lag: Option<u64>,
    /// The member's wall clock minus this node's, ms, from its latest ready answer (null for
    /// this node itself and until a member of this version has answered).
    #[serde(default)]
    pub clock_offset_ms: Option<i64>,
    /// How fast the member's monotonic clock runs against this node's (1: the same), over the
    /// last one to two minutes; null until a minute of answers is in.
    #[serde(default)]
    pub clock_rate: Option<f64>,
    /// The build the member runs (`0.1.0 (1a2b3c4d5e6f)`), from its latest ready answer; null
    /// for a member of a version that does not tell it.
    #[serde(default)]
    pub version: Option<String>,
}

/// A leader election as one node saw it: when the new leader became known and how long the
/// node was without one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionRecord {
    /// Wall-clock time the new leader became known, ms since the Unix epoch.
    pub at_ms: u64,
    /// Time without a known leader before it, ms.
    pub duration_ms: u64,
    pub leader_id: u64,
    pub term: u64,
}

/// `GET /v1/admin/resources/{resource}`: everything the replicated state holds about one
/// resource, plus this node's recent events for it. Never a lease id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceDetail {
    pub view: LockView,
    /// Log time the detail was read at, ms since the Unix epoch.
    pub now_ms: u64,
    pub lease: Option<LeaseDetail>,
    /// The FIFO queue, head first.
    pub queue: Vec<WaiterView>,
    /// Highest token issued for the resource.
    pub last_token: u64,
    /// Highest token a fencing proxy was admitted to forward writes with.
    pub admitted: u64,
    /// Live proxy admission grants.
    pub grants: Vec<GrantView>,
    /// Set while the next token waits for proxy grants of an ended lease to run out.
    pub reissue_at_ms: Option<u64>,
    /// Recent lock and fencing events for the resource, as this node saw them, newest last.
    pub events: Vec<ResourceEvent>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseDetail {
    pub holder: Option<String>,
    pub fencing_token: u64,
    /// A digest of the lease id, to match audit lines; the id itself is never shown.
    pub lease_digest: String,
    pub ttl_ms: u64,
    pub granted_at_ms: u64,
    pub expires_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaiterView {
    pub position: u32,
    pub holder: Option<String>,
    pub ttl_ms: u64,
    pub deadline_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantView {
    pub proxy: u64,
    pub fencing_token: u64,
    pub until_ms: u64,
}

/// One event on a resource: a token granted, renewed, released, expired, forced off, or a
/// fencing decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceEvent {
    pub at_ms: u64,
    /// `acquire`, `renew`, `release`, `force_release`, `handoff`, `expire` or `fence`.
    pub kind: String,
    pub fencing_token: Option<u64>,
    /// The outcome (`granted`, `lock_held`, `admitted`, `stale`, ...).
    pub outcome: String,
}

/// `GET /v1/admin/hot?limit=`: the resources that stand out, by four measures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HotResources {
    /// Acquires per second over the last minute, as this node saw them.
    pub by_acquire_rate: Vec<HotEntry>,
    /// Mean time an acquire took until it was answered (including queueing), ms.
    pub by_wait_ms: Vec<HotEntry>,
    /// Current FIFO queue length, from the replicated state.
    pub by_queue_depth: Vec<HotEntry>,
    /// Fencing rejections (stale, unknown or ended tokens) over the last minute.
    pub by_fence_rejections: Vec<HotEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HotEntry {
    pub resource: String,
    pub value: f64,
}

/// `GET /v1/admin/series?since=`: one-second samples of this node's metrics, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsSeries {
    pub node_id: u64,
    pub samples: Vec<MetricsSample>,
    pub elections: Vec<ElectionRecord>,
}

/// What happened on one node during one sampling interval (about a second).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsSample {
    /// End of the interval, wall clock ms since the Unix epoch.
    pub at_ms: u64,
    /// Lock API latency quantiles of calls that finished in the interval, by operation.
    pub latency: BTreeMap<String, Quantiles>,
    /// Log entries applied per second.
    pub commits_per_s: f64,
    pub active_locks: u64,
    pub waiters: u64,
    /// Fencing decisions in the interval, by `outcome/reason`.
    pub fence: BTreeMap<String, u64>,
    pub leader_id: Option<u64>,
    pub term: u64,
}

/// Quantiles estimated from histogram buckets (upper bound of the bucket), ms.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

/// One audit line, as written to the node's audit log and shown by the audit tail. Never a
/// payload or a lease id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Wall clock of the node that wrote it, ms since the Unix epoch.
    pub time_ms: u64,
    pub node_id: u64,
    /// `acquire`, `renew`, `release`, `cancel`, or an operator action (`force_release`,
    /// `drain`, `snapshot`, `add_member`, `remove_member`, `denied`).
    pub op: String,
    pub resource: Option<String>,
    /// 64-bit digest of the lease id.
    pub lease_digest: Option<String>,
    pub token: Option<u64>,
    /// Who made the call: the API key (`key:<id>`) of a lock call with API keys on (none with
    /// keys off: then nobody is authenticated), `operator:<name>` for an operator action.
    pub caller: Option<String>,
    /// The holder name of the lease a lock call concerns, as its acquire gave it (chosen by
    /// the client, so not proof of who called).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    pub outcome: String,
    /// For operator actions: what was asked (the target node, the new member).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl AuditEntry {
    /// The same line over borrowed fields.
    pub fn line(&self) -> AuditLine<'_> {
        AuditLine {
            time_ms: self.time_ms,
            node_id: self.node_id,
            op: &self.op,
            resource: self.resource.as_deref(),
            lease_digest: self.lease_digest.as_deref(),
            token: self.token,
            caller: self.caller.as_deref(),
            holder: self.holder.as_deref(),
            outcome: &self.outcome,
            detail: self.detail.as_deref(),
        }
    }
}

/// An [`AuditEntry`] over borrowed fields, so a node can write one without copying each field
/// into a string of its own; it encodes to the same JSON.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AuditLine<'a> {
    pub time_ms: u64,
    pub node_id: u64,
    pub op: &'a str,
    pub resource: Option<&'a str>,
    pub lease_digest: Option<&'a str>,
    pub token: Option<u64>,
    pub caller: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<&'a str>,
    pub outcome: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<&'a str>,
}

/// `GET /v1/admin/audit?resource=&outcome=&caller=&limit=`: the newest matching lines of this
/// node's audit log, newest last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditTail {
    pub entries: Vec<AuditEntry>,
}

/// Every operator action names the operator, for the audit log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorRequest {
    #[serde(default)]
    pub operator: String,
}

/// `POST /v1/admin/locks/{resource}/force-release`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForceReleaseResponse {
    pub resource: String,
    /// False when the resource had no live lease (nothing changed).
    pub released: bool,
    /// The token of the lease that was ended.
    pub fencing_token: Option<u64>,
}

/// `POST /v1/admin/drain {operator, to}`: the leader steps aside, for `to` if named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    #[serde(default)]
    pub operator: String,
    /// The voter to hand leadership to; unset: the leader picks the follower that has lately
    /// kept up best.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<u64>,
}

/// `POST /v1/admin/drain`: the leader steps aside.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainResponse {
    pub old_leader: u64,
    pub new_leader: u64,
    pub term: u64,
}

/// `POST /v1/admin/snapshot`: a snapshot was built on the answering node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotResponse {
    pub node_id: u64,
    /// Log index the snapshot covers.
    pub snapshot_index: Option<u64>,
}

/// `POST /v1/admin/members/add`: the membership call plus the operator's name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminAddMember {
    #[serde(default)]
    pub operator: String,
    pub node_id: u64,
    /// Its public API address.
    pub addr: String,
    /// Its peer listener's address.
    #[serde(default)]
    pub peer_addr: String,
}

/// `POST /v1/admin/members/remove`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminRemoveMember {
    #[serde(default)]
    pub operator: String,
    pub node_id: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line written from borrowed fields reads back as the entry it was made from, byte for
    /// byte the same as the entry's own encoding, with and without the optional fields.
    #[test]
    fn an_audit_line_encodes_as_its_entry() {
        let full = AuditEntry {
            time_ms: 1_733_450_000_123,
            node_id: 3,
            op: "force_release".into(),
            resource: Some("kv:a\"b\\c\u{e9}".into()),
            lease_digest: Some("00ff00ff00ff00ff".into()),
            token: Some(u64::MAX),
            caller: Some("operator:ana \n".into()),
            holder: Some("worker \"1\"".into()),
            outcome: "released".into(),
            detail: Some("node 2".into()),
        };
        let bare = AuditEntry {
            resource: None,
            lease_digest: None,
            token: None,
            caller: None,
            holder: None,
            detail: None,
            ..full.clone()
        };
        for entry in [full, bare] {
            let line = serde_json::to_string(&entry.line()).expect("line");
            assert_eq!(line, serde_json::to_string(&entry).expect("entry"));
            let back: AuditEntry = serde_json::from_str(&line).expect("decodes");
            assert_eq!(back, entry);
        }
    }
}
