//! Node configuration: identity, peers, storage and lock policy.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::net::PeerSecret;

/// Configuration of one fencegate node (the `[node]` part of the config file).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Raft node id, unique in the cluster, never reused.
    pub id: u64,
    /// Where this node's fjall database lives.
    pub data_dir: PathBuf,
    /// The founding members and their addresses. The member with the lowest id initialises
    /// the cluster on first start; later membership changes go through the admin API and are
    /// stored in the raft log, so this list only matters for a brand-new cluster.
    #[serde(default)]
    pub initial_members: BTreeMap<u64, MemberAddrs>,
    /// The API address clients and other nodes are told (defaults to the bound address).
    #[serde(default)]
    pub advertise_addr: Option<String>,
    /// The peer address other nodes use to reach this node (defaults to the bound peer
    /// address).
    #[serde(default)]
    pub advertise_peer_addr: Option<String>,
    /// The cluster's shared secret; every peer request is authenticated with it.
    #[serde(skip)]
    pub peer_secret: Option<PeerSecret>,
    #[serde(default)]
    pub policy: Policy,
    /// Serve `/v1/admin/faults` so a chaos harness can inject partitions, delays and clock
    /// offsets. Never enable in production.
    #[serde(default)]
    pub enable_fault_injection: bool,
}

/// Where a member is reached: its public API and its peer listener (`host:port` each).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberAddrs {
    pub api: String,
    pub peer: String,
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
    /// The peer secret, or the start-up error that names the missing key.
    pub fn require_peer_secret(&self) -> Result<PeerSecret, super::NodeError> {
        self.peer_secret.clone().ok_or_else(|| {
            super::NodeError::Config(
                "peer_secret is missing: every node of a cluster needs the same peer secret \
                 (peer_secret or peer_secret_file in the node's config)"
                    .to_string(),
            )
        })
    }

    /// A node with the default policy.
    pub fn new(
        id: u64,
        data_dir: impl Into<PathBuf>,
        initial_members: BTreeMap<u64, MemberAddrs>,
        peer_secret: PeerSecret,
    ) -> Self {
        NodeConfig {
            id,
            data_dir: data_dir.into(),
            initial_members,
            advertise_addr: None,
            advertise_peer_addr: None,
            peer_secret: Some(peer_secret),
            policy: Policy::default(),
            enable_fault_injection: false,
        }
    }
}
