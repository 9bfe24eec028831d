//! What a node keeps for its operators, beside the replicated state: the audit log, activity
//! counters per resource, the health of the other members, a short metrics history, the
//! elections it saw, and whether it is handing off leadership.
//!
//! All of it is this node's own view (nothing here is replicated): each node audits the calls
//! it answered and counts what it saw.

mod audit;
mod health;
mod hot;
mod series;

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

pub use audit::{AuditFilter, AuditLog};
pub use health::{Behind, HealthTable, Probe};
pub use hot::{Activity, HotTable};
pub use series::Series;

pub(super) use health::run as run_health_probes;
pub(super) use series::run as run_sampler;

use crate::machine::AdmitOutcome;
use crate::wire::{AuditLine, ElectionRecord, LeaseDigest, LeaseId};

/// Elections remembered for the page.
const ELECTIONS: usize = 50;

pub struct OpsState {
    pub audit: AuditLog,
    pub hot: HotTable,
    pub health: HealthTable,
    pub series: Series,
    elections: Mutex<VecDeque<ElectionRecord>>,
    /// Set while this leader steps aside (`drain`): it proposes nothing, so another voter's
    /// election can succeed.
    pub draining: AtomicBool,
    refusals: Mutex<RefusalPace>,
}

/// Refused operator calls recorded one by one per second at most; the rest are counted.
const REFUSALS_PER_SECOND: u32 = 20;

/// The pace of refused operator calls in the audit log: anyone who reaches the port can send
/// them, and each line would otherwise cost disk and push real actions out of the tail.
#[derive(Default)]
struct RefusalPace {
    second: u64,
    recorded: u32,
    /// Refusals not recorded since the last recorded one.
    skipped: u64,
}

impl OpsState {
    pub fn new(audit: AuditLog) -> Self {
        OpsState {
            audit,
            hot: HotTable::default(),
            health: HealthTable::default(),
            series: Series::default(),
            elections: Mutex::new(VecDeque::new()),
            draining: AtomicBool::new(false),
            refusals: Mutex::new(RefusalPace::default()),
        }
    }

    pub fn elections(&self) -> Vec<ElectionRecord> {
        let e = self.elections.lock().unwrap_or_else(|e| e.into_inner());
        e.iter().cloned().collect()
    }

    pub fn record_election(&self, record: ElectionRecord) {
        let mut e = self.elections.lock().unwrap_or_else(|e| e.into_inner());
        if e.len() == ELECTIONS {
            e.pop_front();
        }
        e.push_back(record);
    }
}

/// One lock call as the audit log and the activity counters see it.
pub struct LockCallRecord<'a> {
    pub op: &'a str,
    pub resource: &'a str,
    pub lease: Option<&'a LeaseId>,
    pub token: Option<u64>,
    /// The API key that made the call (`key:<id>`), with API keys on.
    pub caller: Option<String>,
    /// The lease's holder name, as its acquire gave it.
    pub holder: Option<String>,
    pub outcome: &'a str,
    /// How long the call took to answer (counted as wait time for acquires).
    pub took_ms: Option<u64>,
}

impl super::Node {
    /// Audits a lock call that reached the state machine and counts it for the resource.
    pub fn record_lock_call(&self, call: LockCallRecord<'_>) {
        let now = self.wall_ms();
        self.ops.hot.event(
            call.resource,
            Activity {
                at_ms: now,
                kind: call.op,
                fencing_token: call.token,
                outcome: call.outcome,
            },
            call.took_ms,
        );
        let digest = call.lease.map(LeaseId::short_digest);
        self.ops.audit.record(
            &AuditLine {
                time_ms: now,
                node_id: self.id,
                op: call.op,
                resource: Some(call.resource),
                lease_digest: digest.as_ref().map(LeaseDigest::as_str),
                token: call.token,
                caller: call.caller.as_deref(),
                holder: call.holder.as_deref(),
                outcome: call.outcome,
                detail: None,
            },
            false,
        );
    }

    /// Audits an operator action, fsynced before the action is answered.
    pub fn record_operator_action(
        &self,
        op: &str,
        operator: &str,
        resource: Option<&str>,
        token: Option<u64>,
        outcome: &str,
        detail: Option<String>,
    ) {
        let now = self.wall_ms();
        if let Some(resource) = resource {
            self.ops.hot.event(
                resource,
                Activity {
                    at_ms: now,
                    kind: op,
                    fencing_token: token,
                    outcome,
                },
                None,
            );
        }
        let caller = format!("operator:{operator}");
        self.audit_operator_line(
            now,
            op,
            resource,
            token,
            &caller,
            outcome,
            detail.as_deref(),
            true,
        );
    }

    /// One audit line of an operator call; `sync` fsyncs it before returning.
    #[allow(clippy::too_many_arguments)]
    fn audit_operator_line(
        &self,
        time_ms: u64,
        op: &str,
        resource: Option<&str>,
        token: Option<u64>,
        caller: &str,
        outcome: &str,
        detail: Option<&str>,
        sync: bool,
    ) {
        self.ops.audit.record(
            &AuditLine {
                time_ms,
                node_id: self.id,
                op,
                resource,
                lease_digest: None,
                token,
                caller: Some(caller),
                holder: None,
                outcome,
                detail,
            },
            sync,
        );
    }

    /// Audits an operator call refused for its credential (`outcome` is the refusal's code).
    /// Unlike an action taken, it is not fsynced, the operator name it claims is only detail
    /// (the caller is `unverified`: anyone can type any name), and at most
    /// [`REFUSALS_PER_SECOND`] are recorded a second; the next recorded one says how many were
    /// left out. So refusals cannot load the disk nor fill the audit log faster than that.
    pub fn record_refused_action(
        &self,
        op: &str,
        claimed_operator: Option<&str>,
        resource: Option<&str>,
        outcome: &str,
    ) {
        let now = self.wall_ms();
        let second = now / 1_000;
        let skipped = {
            let mut pace = self.ops.refusals.lock().unwrap_or_else(|e| e.into_inner());
            if pace.second != second {
                pace.second = second;
                pace.recorded = 0;
            }
            if pace.recorded >= REFUSALS_PER_SECOND {
                pace.skipped += 1;
                return;
            }
            pace.recorded += 1;
            std::mem::take(&mut pace.skipped)
        };
        let mut detail = String::new();
        if let Some(name) = claimed_operator {
            let name: String = name.chars().take(128).collect();
            detail.push_str(&format!("claimed operator: {name}"));
        }
        if skipped > 0 {
            if !detail.is_empty() {
                detail.push_str("; ");
            }
            detail.push_str(&format!(
                "{skipped} more refused operator calls before this one were not recorded one by one"
            ));
        }
        let detail = (!detail.is_empty()).then_some(detail.as_str());
        self.audit_operator_line(
            now,
            op,
            resource,
            None,
            "unverified",
            outcome,
            detail,
            false,
        );
    }

    /// Audits a call refused by authentication or a role check. Not fsynced per line, unlike
    /// operator actions: anyone who reaches the port can send refused calls, and a sync for
    /// each would let them load the disk at will. `caller` names the key by id or digest
    /// prefix.
    pub fn record_denial(&self, reason: &str, caller: Option<String>, detail: String) {
        self.ops.audit.record(
            &AuditLine {
                time_ms: self.wall_ms(),
                node_id: self.id,
                op: "denied",
                resource: None,
                lease_digest: None,
                token: None,
                caller: caller.as_deref(),
                holder: None,
                outcome: reason,
                detail: Some(&detail),
            },
            false,
        );
    }

    /// Counts a fencing proxy's admission decision made through this node.
    pub fn record_fence_decision(&self, resource: &str, token: u64, outcome: &AdmitOutcome) {
        let outcome = match outcome {
            AdmitOutcome::Admitted { .. } => "admitted",
            AdmitOutcome::Stale { .. } => "stale",
            AdmitOutcome::Unknown => "unknown",
            AdmitOutcome::Ended => "ended",
        };
        self.record_fence_event(resource, token, outcome);
    }

    /// Counts a write this node's proxy refused on its own, from the grant it holds (`stale`,
    /// `ended` or `unknown`), without asking the cluster: the usual case for a zombie's write.
    pub fn record_fence_refusal(&self, resource: &str, token: u64, outcome: &'static str) {
        self.record_fence_event(resource, token, outcome);
    }

    fn record_fence_event(&self, resource: &str, token: u64, outcome: &'static str) {
        // A refused write is what the audit trail is for (a zombie woke up); admitted ones
        // are every proxied write, counted in the metrics instead.
        if outcome != "admitted" {
            self.ops.audit.record(
                &AuditLine {
                    time_ms: self.wall_ms(),
                    node_id: self.id,
                    op: "fence",
                    resource: Some(resource),
                    lease_digest: None,
                    token: Some(token),
                    caller: None,
                    holder: None,
                    outcome,
                    detail: None,
                },
                false,
            );
        }
        self.ops.hot.event(
            resource,
            Activity {
                at_ms: self.wall_ms(),
                kind: "fence",
                fencing_token: Some(token),
                outcome,
            },
            None,
        );
    }
}
