//! Node configuration: identity, peers, storage and lock policy.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Configuration of one fencegate node (the `[node]` part of the config file).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Raft node id, unique in the cluster, never reused.
    pub id: u64,
    /// Where this node's fjall database lives.
    pub data_dir: PathBuf,
    /// The founding members (id -> `host:port` of their API). The member with the lowest id
    /// initialises the cluster on first start; later membership changes go through the admin
    /// API and are stored in the raft log, so this list only matters for a brand-new cluster.
    #[serde(default)]
    pub initial_members: BTreeMap<u64, String>,
    /// The address other nodes use to reach this node (defaults to the bound address).
    #[serde(default)]
    pub advertise_addr: Option<String>,
    #[serde(default)]
    pub policy: Policy,
    /// Serve `/v1/admin/faults` so a chaos harness can inject partitions, delays and clock
    /// offsets. Never enable in production.
    #[serde(default)]
    pub enable_fault_injection: bool,
    /// The admin credential: operator actions (forced release, drain, snapshot, membership)
    /// need `Authorization: Bearer <admin_token>`. Without one, the node refuses those actions
    /// (the membership endpoints then stay open, as before there was a credential).
    #[serde(default)]
    pub admin_token: Option<String>,
    /// The audit log (`<data_dir>/audit/audit.log`) rotates at this size...
    #[serde(default = "default_audit_max_bytes")]
    pub audit_max_bytes: u64,
    /// ...keeping this many rotated files.
    #[serde(default = "default_audit_keep")]
    pub audit_keep: usize,
}

fn default_audit_max_bytes() -> u64 {
    64 * 1024 * 1024
}

fn default_audit_keep() -> usize {
    5
}

/// Lock policy. Every limit here is stamped into the commands the node proposes, so nodes
/// with different policies never make replicas diverge.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    pub default_ttl_ms: u64,
    pub min_ttl_ms: u64,
    pub max_ttl_ms: u64,
    pub max_wait_timeout_ms: u64,
    /// How long an acquire's result is kept for retries with the same `request_id`.
    pub retry_window_ms: u64,
    pub max_waiters_per_resource: u32,
    pub max_total_waiters: u32,
    /// Added to every live lease when a new leader takes over; it covers clock skew and election time.
    pub failover_grace_ms: u64,
    /// How long a write may take to commit before the caller gets 503 `no_quorum`.
    pub write_timeout_ms: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            default_ttl_ms: 30_000,
            min_ttl_ms: 1_000,
            max_ttl_ms: 300_000,
            max_wait_timeout_ms: 300_000,
            retry_window_ms: 600_000,
            max_waiters_per_resource: 1_024,
            max_total_waiters: 100_000,
            failover_grace_ms: 1_000,
            write_timeout_ms: 2_000,
        }
    }
}

impl NodeConfig {
    /// A single-purpose constructor for tests and `fencegate dev`.
    pub fn new(
        id: u64,
        data_dir: impl Into<PathBuf>,
        initial_members: BTreeMap<u64, String>,
    ) -> Self {
        NodeConfig {
            id,
            data_dir: data_dir.into(),
            initial_members,
            advertise_addr: None,
            policy: Policy::default(),
            enable_fault_injection: false,
            admin_token: None,
            audit_max_bytes: default_audit_max_bytes(),
            audit_keep: default_audit_keep(),
        }
    }
}
