//! The records the lock state is made of: leases, waiters, per-resource state, proxy
//! grants, dedup records, and the snapshot image. All of it is replicated and snapshotted, so
//! every field is part of the on-disk format: add fields with `#[serde(default)]`.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::keys::ApiKeyRecord;
use super::quota::QuotaLedger;
use super::types::Grant;
use crate::wire::LeaseId;

/// A granted lease as stored in the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub lease_id: LeaseId,
    pub fencing_token: u64,
    pub holder: Option<String>,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
    pub granted_at_ms: u64,
}

/// An acquire waiting in a resource's FIFO queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    pub request_id: String,
    pub holder: Option<String>,
    pub ttl_ms: u64,
    pub deadline_ms: u64,
    pub lease_id: LeaseId,
    pub retain_ms: u64,
}

/// Per-resource record. Kept while held or waited on, then for `retain_ms` after it went
/// idle so that reads (and the fencing proxy) still see its last token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceState {
    pub lease: Option<Lease>,
    pub waiters: VecDeque<Waiter>,
    /// Highest fencing token ever issued for this resource.
    pub last_token: u64,
    /// Highest token a fencing proxy was admitted to forward writes with.
    #[serde(default)]
    pub admitted: u64,
    /// Live proxy admission grants for the current token (see `Command::Admit`).
    #[serde(default)]
    pub grants: Vec<FenceGrant>,
    /// Set when the lease ended while proxy grants were live: no new token is issued for the
    /// resource before this time, so writes already admitted under the old token have
    /// completed or timed out before a newer token can exist (the epoch barrier).
    #[serde(default)]
    pub reissue_at_ms: Option<u64>,
    /// When the record became idle (no lease, no waiters) and when it may be dropped.
    pub idle_until_ms: Option<u64>,
}

/// A proxy's permission to forward writes with `fencing_token` until `until_ms` (log time).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceGrant {
    pub proxy: u64,
    pub fencing_token: u64,
    pub until_ms: u64,
}

/// What a retried acquire with the same `request_id` gets back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DedupState {
    Granted(Grant),
    Waiting,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    pub state: DedupState,
    pub expires_at_ms: u64,
}

pub(super) type DedupKey = (String, String);

/// The persistent part of the machine, as written into snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineImage {
    pub now_ms: u64,
    pub term: u64,
    pub last_token: u64,
    #[serde(default)]
    pub gc_floor: u64,
    pub resources: Vec<(String, ResourceState)>,
    pub dedup: Vec<(String, String, DedupRecord)>,
    /// Absent in snapshots taken before quotas existed.
    #[serde(default)]
    pub quotas: QuotaLedger,
    /// The API keys (digests only), in id order. Absent in snapshots taken before keys existed.
    #[serde(default)]
    pub keys: Vec<ApiKeyRecord>,
}

/// How long an idle resource record is kept (it carries the resource's last token).
pub const DEFAULT_IDLE_RETAIN_MS: u64 = 10 * 60 * 1000;
