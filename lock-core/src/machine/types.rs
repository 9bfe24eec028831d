//! Commands, responses and effects of the lock state machine.
//!
//! Everything here is replicated through the raft log, so every field is part of the
//! on-disk format: add fields with `#[serde(default)]`, never reuse a name.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::idempotency::{IdemCommand, IdemOutcome};
use super::keys::ApiKeyRecord;
use super::quota::{QuotaOutcome, QuotaRequest, QuotaSpec};
pub use crate::wire::LeaseId;

/// One stamped command: a command plus the facts the proposing leader stamped on it. Replicas never read their own clock or configuration while
/// applying; everything time- or policy-dependent travels in here, which keeps apply
/// deterministic on every node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The proposing leader's wall clock, in ms since the Unix epoch.
    pub now_ms: u64,
    /// Extra time every live lease gets when a new leader's first command is applied
    /// (never a shortening, never a full reset), from the proposing leader's configuration.
    pub failover_grace_ms: u64,
    pub cmd: Command,
}

/// One entry of the replicated log's application payload: the commands the leader coalesced
/// while its previous write was in flight, stamped once. Applying it applies each command in
/// order as a [`Proposal`] with this stamp, exactly as if they had been logged one by one.
///
/// An entry written before batching holds one command under `cmd` and no `cmds`; it reads
/// back as a batch of that one command.
///
/// The commands are shared, never changed once batched: a copy of an entry (the log keeps its
/// newest entries in memory for replication and apply) costs a reference count, not a copy of
/// every command. They are written as a plain sequence, as before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub now_ms: u64,
    pub failover_grace_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Command>,
    #[serde(default = "no_commands")]
    pub cmds: Arc<[Command]>,
}

fn no_commands() -> Arc<[Command]> {
    Arc::from(Vec::new())
}

impl Batch {
    pub fn new(now_ms: u64, failover_grace_ms: u64, cmds: Vec<Command>) -> Self {
        Batch {
            now_ms,
            failover_grace_ms,
            cmd: None,
            cmds: cmds.into(),
        }
    }

    /// The commands in apply order.
    pub fn commands(&self) -> impl Iterator<Item = &Command> {
        self.cmd.iter().chain(self.cmds.iter())
    }

    /// The commands as stamped proposals, in apply order.
    pub fn proposals(&self) -> impl Iterator<Item = Proposal> + '_ {
        self.commands().map(|cmd| Proposal {
            now_ms: self.now_ms,
            failover_grace_ms: self.failover_grace_ms,
            cmd: cmd.clone(),
        })
    }
}

impl From<Proposal> for Batch {
    fn from(p: Proposal) -> Self {
        Batch::new(p.now_ms, p.failover_grace_ms, vec![p.cmd])
    }
}

/// A state-changing command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Acquire(Acquire),
    Renew {
        resource: String,
        lease_id: LeaseId,
    },
    Release {
        resource: String,
        lease_id: LeaseId,
    },
    Cancel {
        resource: String,
        request_id: String,
    },
    /// A fencing proxy asks to forward writes carrying `token` for `resource`.
    /// Granted only for the resource's current, live lease; the grant lets `proxy` forward
    /// such writes without another round trip for `grant_ms` (capped at the lease's expiry),
    /// and a new token for the resource is not issued while a grant for an older one lives.
    Admit {
        resource: String,
        fencing_token: u64,
        proxy: u64,
        grant_ms: u64,
    },
    /// An operator ends the resource's current lease, whoever holds it. It has exactly the
    /// consequences of a release by the holder: the token is finished for good (the proxy
    /// refuses it from now on), and the next holder gets a newer token only after every live
    /// proxy grant for the old one has run out. `operator` is recorded for the audit trail.
    ForceRelease {
        resource: String,
        operator: String,
    },
    /// A fencing proxy confirms it stopped forwarding writes with `fencing_token` for
    /// `resource` after that lease ended (see `Effect::Revoke`): nothing with that token is in
    /// flight to the upstream from it any more. Once every proxy holding a grant confirmed,
    /// the next lease can be granted at once instead of when the grants run out.
    RevokeAck {
        resource: String,
        fencing_token: u64,
        proxy: u64,
    },
    /// Expire whatever is due at the stamped time: leases, waiters, dedup records, idle
    /// resource records. Proposed by the leader's sweeper; also advances log time so a
    /// failover never credits a lease with more than one sweep interval of idle time.
    Tick {
        /// Upper bound on the number of items processed, so one entry stays small.
        max_items: u32,
    },
    /// A fencing proxy's `Idempotency-Key` record command. Applied by the storage layer to
    /// the on-disk record (see `machine::IdempotencyMachine`); the lock machine only advances
    /// log time with its stamp.
    Idem(IdemCommand),
    /// Defines (or redefines) a global rate-limit quota. See `machine::QuotaLedger`.
    QuotaDefine(QuotaSpec),
    /// A fencing proxy leases or renews its shares of a (quota, tenant) pool.
    QuotaLease(QuotaRequest),
    /// A fencing proxy gives quota leases back (idempotent); their capacity is free at once.
    QuotaReturn {
        lease_ids: Vec<LeaseId>,
    },
    /// An operator sets a quota at run time. It overrides the proxies' config files from then
    /// on: their `QuotaDefine` no longer changes it. Leases granted before keep their shares
    /// until they end; new ones fit the new limits.
    QuotaSet(QuotaSpec),
    /// Adds an API key (its digest, never the key) to the replicated key table.
    KeyCreate(ApiKeyRecord),
    /// Removes an API key: from the moment this applies, no call made with it is applied.
    KeyRevoke {
        id: String,
    },
    /// A lock call made with the API key `key_id`: applied only if that key still exists when
    /// the command is applied, so a call that raced with the key's revocation and was ordered
    /// after it in the log does nothing (`Response::KeyRefused`). Wraps lock calls only.
    AsKey {
        key_id: String,
        cmd: Box<Command>,
    },
}

/// Per-tenant bounds, stamped into an acquire by the proposing node (with authentication on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLimits {
    /// Leases the tenant may hold at once; an acquire that would be granted beyond it is
    /// refused. (A hand-off to a waiter is not: the waiter was admitted under its own bound.)
    pub max_leases: u32,
    /// Waiting acquires the tenant may have at once, across its resources.
    pub max_waiters: u32,
}

/// An acquire, already validated and clamped to policy by the proposing node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquire {
    pub resource: String,
    pub request_id: String,
    pub holder: Option<String>,
    pub ttl_ms: u64,
    /// 0 means try once.
    pub wait_timeout_ms: u64,
    /// The lease id to use if this acquire is granted, now or later by hand-off.
    pub lease_id: LeaseId,
    /// How long the result is remembered for retries with the same `request_id`. (Idle
    /// resource records are kept for `DEFAULT_IDLE_RETAIN_MS`.)
    pub retain_ms: u64,
    /// Queue bound for this resource (429 `too_many_waiters` beyond it).
    pub max_waiters: u32,
    /// Bound on waiters across all resources.
    pub max_total_waiters: u32,
    /// The tenant's bounds (its tenant is the resource name's namespace); none without
    /// authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_limits: Option<TenantLimits>,
}

/// What a granted (or renewed) lease looks like to its holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub resource: String,
    pub lease_id: LeaseId,
    pub fencing_token: u64,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
}

/// The result of applying one command; returned to the proposer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Granted(Grant),
    /// The acquire waits in the resource's FIFO queue (or already did, for a retry).
    Queued {
        position: u32,
    },
    /// Try-once acquire of a held resource.
    Held {
        retry_after_ms: u64,
    },
    TooManyWaiters,
    /// Try-once acquire of a resource whose previous lease ended while proxies still hold
    /// grants for its token: the next lease waits for them to confirm (usually milliseconds),
    /// at most until `retry_after_ms`, when the grants run out.
    Revoking {
        retry_after_ms: u64,
    },
    /// Answer to `RevokeAck`: whether it removed a live grant.
    RevokeAcked(bool),
    Renewed(Grant),
    LeaseLost,
    Released(bool),
    Cancelled(bool),
    /// The token of the lease a `ForceRelease` ended; `None` when nothing was held.
    ForceReleased {
        fencing_token: Option<u64>,
    },
    Ticked {
        expired: u32,
        handed_off: u32,
    },
    Admit(AdmitOutcome),
    Idem(IdemOutcome),
    /// Blank and membership entries.
    Noop,
    // Quota answers come last so that the existing variants keep their positions in binary
    // encodings (peers of different versions during a rolling upgrade).
    QuotaDefined,
    Quota(QuotaOutcome),
    /// How many of the returned quota leases were still on the ledger.
    QuotaReturned(u32),
    /// Whether the key was added (false: its id was taken).
    KeyCreated(bool),
    /// Whether a key with that id existed.
    KeyRevoked(bool),
    /// An `AsKey` call whose key no longer exists: nothing was applied.
    KeyRefused,
    /// An acquire beyond its tenant's bounds: nothing was applied.
    TenantLimit(TenantLimitHit),
}

/// Which of a tenant's bounds an acquire hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TenantLimitHit {
    Leases,
    Waiters,
}

/// The state machine's verdict on a proxy's admission request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdmitOutcome {
    /// The token is the resource's current live lease: forward for up to `grant_ms`.
    Admitted { grant_ms: u64 },
    /// A larger token was issued or admitted for the resource (`highest` is a lower bound
    /// when the resource's record was already dropped).
    Stale { highest: u64 },
    /// The token was never issued for this resource.
    Unknown,
    /// The token is the resource's latest, but its lease expired or was released.
    Ended,
}

/// Side effects of a command that the node acts on after apply (waking long-polls, metrics).
/// They are not persisted; every replica emits the same ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// A queued acquire was granted the lock by hand-off.
    HandedOff { request_id: String, grant: Grant },
    /// A waiter left the queue without the lock.
    WaiterRemoved {
        resource: String,
        request_id: String,
        reason: WaiterGone,
    },
    /// A lease ended (released, or forcibly) while `proxies` held grants to forward writes with
    /// its token: each of them must stop, let its in-flight writes finish, and confirm with
    /// `Command::RevokeAck`.
    Revoke {
        resource: String,
        fencing_token: u64,
        proxies: Vec<u64>,
    },
    /// Every proxy confirmed a `Revoke` of the resource: the ended token is fenced everywhere
    /// and the lock has passed on.
    Revoked { resource: String },
    /// A lease ran out without being renewed or released.
    Expired {
        resource: String,
        fencing_token: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaiterGone {
    TimedOut,
    Cancelled,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_written_before_batching_reads_as_a_batch_of_one() {
        let old = Proposal {
            now_ms: 5,
            failover_grace_ms: 7,
            cmd: Command::Tick { max_items: 3 },
        };
        let json = serde_json::to_string(&old).expect("encode");
        let batch: Batch = serde_json::from_str(&json).expect("old entry decodes");
        assert_eq!(batch.proposals().collect::<Vec<_>>(), vec![old.clone()]);
        let new = Batch::new(5, 7, vec![old.cmd.clone(), old.cmd.clone()]);
        let json = serde_json::to_string(&new).expect("encode");
        assert!(
            !json.contains("\"cmd\""),
            "new entries write only cmds: {json}"
        );
        let back: Batch = serde_json::from_str(&json).expect("decode");
        assert_eq!(back.commands().count(), 2);
    }
}
