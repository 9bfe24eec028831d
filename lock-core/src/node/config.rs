//! Node configuration: identity, peers, storage and lock policy.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::auth::{AuthMode, TenantPolicy};
use super::limits::{HttpLimits, TlsFiles};
use crate::net::PeerSecret;
use crate::timing::RaftTiming;

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
    /// The admin credential: operator actions (forced release, drain, snapshot, membership)
    /// need `Authorization: Bearer <admin_token>`. Without one, the node refuses those actions.
    #[serde(default)]
    pub admin_token: Option<String>,
    /// Whether the public API requires API keys (`on`) or is open (`off`, the default of the
    /// library; the `fencegate node` config file must say which). With keys on, `admin_token`
    /// also acts as an admin key of the default tenant, so the first keys can be created.
    #[serde(default)]
    pub auth: AuthMode,
    /// Per-tenant bounds, applied with authentication on.
    #[serde(default)]
    pub tenants: TenantPolicy,
    /// The audit log (`<data_dir>/audit/audit.log`) rotates at this size...
    #[serde(default = "default_audit_max_bytes")]
    pub audit_max_bytes: u64,
    /// ...keeping this many rotated files.
    #[serde(default = "default_audit_keep")]
    pub audit_keep: usize,
    /// Limits of the public API's listener.
    #[serde(default)]
    pub limits: HttpLimits,
    /// Limits of the peer port's listener.
    #[serde(default = "HttpLimits::peer")]
    pub peer_limits: HttpLimits,
    /// Serve the public API over TLS with this certificate (plain HTTP without).
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// With a bound, the commands the leader holds waiting for its next raft writes; beyond
    /// them it refuses new ones with 503 `overloaded` (and a `retry_after_ms`) instead of
    /// letting them wait. None (the default): no bound beyond the listeners' connection limits.
    #[serde(default)]
    pub max_queued_writes: Option<usize>,
    /// Raft's heartbeat and election timing (the same on every member).
    #[serde(default)]
    pub raft: RaftTiming,
}

fn default_audit_max_bytes() -> u64 {
    64 * 1024 * 1024
}

fn default_audit_keep() -> usize {
    5
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

/// Longest failover grace a policy may set: the grace is added to every live lease on a leader
/// change, so it bounds how far past its TTL a lease can be stretched.
pub const MAX_FAILOVER_GRACE_MS: u64 = 60_000;

impl Policy {
    /// Checks the policy is coherent; the error names the offending setting.
    pub fn validate(&self) -> Result<(), String> {
        let p = self;
        if p.min_ttl_ms == 0 {
            return Err("policy.min_ttl_ms must be at least 1".into());
        }
        if p.min_ttl_ms > p.max_ttl_ms {
            return Err(format!(
                "policy.min_ttl_ms ({}) is larger than policy.max_ttl_ms ({})",
                p.min_ttl_ms, p.max_ttl_ms
            ));
        }
        if !(p.min_ttl_ms..=p.max_ttl_ms).contains(&p.default_ttl_ms) {
            return Err(format!(
                "policy.default_ttl_ms ({}) must lie between min_ttl_ms ({}) and max_ttl_ms ({})",
                p.default_ttl_ms, p.min_ttl_ms, p.max_ttl_ms
            ));
        }
        if p.failover_grace_ms > MAX_FAILOVER_GRACE_MS {
            return Err(format!(
                "policy.failover_grace_ms ({}) is above the limit of {MAX_FAILOVER_GRACE_MS}: it \
                 stretches every lease by that much on each leader change",
                p.failover_grace_ms
            ));
        }
        if p.write_timeout_ms == 0 {
            return Err("policy.write_timeout_ms must be at least 1".into());
        }
        if p.retry_window_ms == 0 {
            return Err("policy.retry_window_ms must be at least 1".into());
        }
        if p.max_waiters_per_resource > p.max_total_waiters {
            return Err(format!(
                "policy.max_waiters_per_resource ({}) is larger than max_total_waiters ({})",
                p.max_waiters_per_resource, p.max_total_waiters
            ));
        }
        Ok(())
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

    /// The founding member: the lowest id of the initial members, the one that initialises a
    /// brand-new cluster and stands in its first election.
    pub fn founder(&self) -> Option<u64> {
        self.initial_members.keys().next().copied()
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
            admin_token: None,
            auth: AuthMode::Off,
            tenants: TenantPolicy::default(),
            audit_max_bytes: default_audit_max_bytes(),
            audit_keep: default_audit_keep(),
            limits: HttpLimits::default(),
            peer_limits: HttpLimits::peer(),
            tls: None,
            max_queued_writes: None,
            raft: RaftTiming::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_is_valid() {
        assert_eq!(Policy::default().validate(), Ok(()));
    }

    #[test]
    fn incoherent_policies_are_refused_naming_the_setting() {
        let bad = [
            (
                Policy {
                    min_ttl_ms: 10_000,
                    max_ttl_ms: 5_000,
                    ..Policy::default()
                },
                "min_ttl_ms",
            ),
            (
                Policy {
                    failover_grace_ms: 3_600_000,
                    ..Policy::default()
                },
                "failover_grace_ms",
            ),
            (
                Policy {
                    default_ttl_ms: 500,
                    ..Policy::default()
                },
                "default_ttl_ms",
            ),
            (
                Policy {
                    write_timeout_ms: 0,
                    ..Policy::default()
                },
                "write_timeout_ms",
            ),
        ];
        for (policy, setting) in bad {
            let err = policy.validate().expect_err(setting);
            assert!(err.contains(setting), "{err}");
        }
    }
}
