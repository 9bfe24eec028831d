//! What the checks read: the history's operations (an invocation paired with its completion)
//! and every lease the service's answers named, derived once.

use std::collections::{BTreeMap, HashMap};

use lock_core::wire::{
    AcquireRequest, AcquireResponse, ClusterStatus, LeaseId, LeaseRequest, ReleaseResponse,
    RenewResponse, StoreLogEntry,
};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::{json, Value};

use super::CheckResult;
use crate::chaos::history::{value_as, Event, EventType, FaultNote, LockCall, QuotaNote, Trouble};

/// One operation: an invocation and its completion (if any).
#[derive(Clone, Debug)]
pub struct Op {
    pub op: u64,
    pub process: String,
    pub f: String,
    pub node: Option<u64>,
    pub invoke_index: u64,
    pub complete_index: Option<u64>,
    /// Wall ms at invocation.
    pub t_inv: f64,
    /// Wall ms at completion.
    pub t_done: Option<f64>,
    /// `Info` when the operation never completed (the run ended first).
    pub kind: EventType,
    pub req: Value,
    pub resp: Value,
}

impl Op {
    pub fn is_ok(&self) -> bool {
        self.kind == EventType::Ok
    }

    /// What the operation asked, as `T`.
    pub fn request<T: DeserializeOwned>(&self) -> Option<T> {
        value_as(&self.req)
    }

    /// Why an operation that did not succeed failed (or may have).
    pub fn trouble(&self) -> Option<Trouble> {
        match self.kind {
            EventType::Ok => None,
            _ => value_as(&self.resp),
        }
    }

    /// The lock-API answer this operation received, as `T`: the body of an `ok`, or the body
    /// of an answer the drop-responses nemesis threw away (the service gave it).
    pub fn answer<T: DeserializeOwned>(&self) -> Option<T> {
        match self.kind {
            EventType::Ok => value_as(&self.resp),
            EventType::Info => self
                .trouble()
                .filter(|t| t.error == Trouble::RESPONSE_DROPPED)
                .and_then(|t| value_as(&t.body?)),
            _ => None,
        }
    }

    /// Whether the service answered it (whatever the answer says).
    pub fn answered(&self) -> bool {
        self.answer::<IgnoredAny>().is_some()
    }

    pub fn brief(&self) -> Value {
        json!({
            "op": self.op,
            "process": self.process,
            "f": self.f,
            "node": self.node,
            "type": self.kind,
            "invoke_index": self.invoke_index,
            "complete_index": self.complete_index,
            "t_invoke_ms": self.t_inv,
            "t_complete_ms": self.t_done,
            "request": self.req,
            "response": self.resp,
        })
    }
}

/// Pairs invocations with completions. Single-event notes (nemesis) are returned apart.
pub fn ops(events: &[Event]) -> (Vec<Op>, Vec<&Event>) {
    let mut by_op: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<Op> = Vec::new();
    let mut notes = Vec::new();
    for e in events {
        match e.kind {
            EventType::Invoke => {
                by_op.insert(e.op, out.len());
                out.push(Op {
                    op: e.op,
                    process: e.process.clone(),
                    f: e.f.clone(),
                    node: e.node,
                    invoke_index: e.index,
                    complete_index: None,
                    t_inv: e.time_ms,
                    t_done: None,
                    kind: EventType::Info,
                    req: e.value.clone(),
                    resp: Value::Null,
                });
            }
            _ => match by_op.get(&e.op) {
                Some(&i) => {
                    let o = &mut out[i];
                    o.complete_index = Some(e.index);
                    o.t_done = Some(e.time_ms);
                    o.kind = e.kind;
                    o.resp = e.value.clone();
                }
                None => notes.push(e),
            },
        }
    }
    (out, notes)
}

/// Everything known about one lease, gathered from every answer that named it.
#[derive(Clone, Debug)]
pub struct LeaseRec {
    pub lease_id: LeaseId,
    pub resource: String,
    pub token: u64,
    /// Upper bound on the grant's log time: min over acquire answers of expires − ttl.
    pub granted_at: u64,
    /// Acknowledged expiries (acquire and renew answers): (wall ms received, expires_at_ms).
    pub acks: Vec<(f64, u64)>,
    /// Latest acknowledged expires_at_ms.
    pub acked_until: u64,
    /// Wall ms of the first answer naming the lease (it was granted before then).
    pub first_seen: f64,
    /// Wall ms the first attempt of its acquire (by request id) was sent (granted after).
    pub first_invoke: f64,
    /// The op that first reported it.
    pub first_op: usize,
    /// Release attempts: (invoked, completed, released?).
    pub releases: Vec<(f64, Option<f64>, Option<bool>)>,
}

impl LeaseRec {
    pub fn released_before(&self, t: f64) -> bool {
        self.releases.iter().any(|(inv, _, _)| *inv < t)
    }

    pub fn acked_until_before(&self, t: f64) -> u64 {
        self.acks
            .iter()
            .filter(|(done, _)| *done < t)
            .map(|(_, e)| *e)
            .max()
            .unwrap_or(0)
    }

    pub fn brief(&self) -> Value {
        json!({
            "lease_id": self.lease_id,
            "resource": self.resource,
            "fencing_token": self.token,
            "granted_at_ms_at_most": self.granted_at,
            "acked_until_ms": self.acked_until,
        })
    }
}

/// Everything the checks need, derived once from the history.
pub struct Model {
    pub ops: Vec<Op>,
    pub leases: Vec<LeaseRec>,
    pub by_lease: HashMap<LeaseId, usize>,
    /// The largest forward clock offset the nemesis injected (ms, ≥ 0).
    pub max_forward_offset_ms: f64,
    /// Faults the nemesis started, by kind.
    pub faults: BTreeMap<String, u64>,
    /// `GET /log` of the demo store at the end.
    pub store_log: Option<Vec<StoreLogEntry>>,
    /// `GET /v1/cluster` of each node at the end.
    pub final_cluster: Vec<ClusterStatus>,
    /// The quota of the rate-limited route, when the run had a quota workload.
    pub quota: Option<QuotaNote>,
    /// The run was ended early: nothing was read at its end (the store's logs, the final
    /// state), so the checks that need those check only the history.
    pub cut_short: bool,
    /// Problems building the model (malformed answers): each also counts as a violation of
    /// the invariant it belongs to.
    malformed: Vec<(u8, Value)>,
}

pub fn model(events: &[Event]) -> Model {
    let (ops, notes) = ops(events);
    let mut max_off = 0i64;
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for n in notes.iter().filter(|n| n.process == "nemesis") {
        let note: FaultNote = value_as(&n.value).unwrap_or_default();
        if let Some(o) = note.offset_ms {
            max_off = max_off.max(o);
        }
        if let (true, Some(k)) = (n.f == "start", note.kind) {
            *faults.entry(k).or_default() += 1;
        }
    }
    let quota = notes
        .iter()
        .filter(|n| n.process == "harness" && n.f == "quota")
        .find_map(|n| value_as::<QuotaNote>(&n.value));
    let mut book = LeaseBook::default();
    let first_attempts = first_attempts(&ops);
    let mut store_log = None;
    let mut final_cluster = Vec::new();
    for (i, o) in ops.iter().enumerate() {
        match o.f.as_str() {
            "acquire" | "renew" => book.answer(i, o, &first_attempts),
            "store_log" if o.is_ok() => store_log = o.answer(),
            "final_cluster" if o.is_ok() => final_cluster.extend(o.answer::<ClusterStatus>()),
            _ => {}
        }
    }
    for o in ops.iter().filter(|o| o.f == "release") {
        book.release(o);
    }
    for l in &mut book.leases {
        if l.first_invoke == f64::MAX {
            l.first_invoke = l.first_seen;
        }
    }
    Model {
        ops,
        leases: book.leases,
        by_lease: book.by_lease,
        max_forward_offset_ms: max_off as f64,
        faults,
        store_log,
        final_cluster,
        quota,
        cut_short: false,
        malformed: book.malformed,
    }
}

/// When the first attempt of every acquire was sent, by (resource, request id).
fn first_attempts(ops: &[Op]) -> HashMap<(String, String), f64> {
    let mut first: HashMap<(String, String), f64> = HashMap::new();
    for o in ops.iter().filter(|o| o.f == "acquire") {
        if let Some(call) = o.request::<LockCall<AcquireRequest>>() {
            let e = first
                .entry((call.resource, call.body.request_id))
                .or_insert(o.t_inv);
            *e = e.min(o.t_inv);
        }
    }
    first
}

/// What an acquire or renew answer says about its lease.
struct LeaseAnswer {
    lease_id: LeaseId,
    token: u64,
    ttl_ms: u64,
    expires_at_ms: u64,
}

/// The leases, built up answer by answer.
#[derive(Default)]
struct LeaseBook {
    leases: Vec<LeaseRec>,
    by_lease: HashMap<LeaseId, usize>,
    malformed: Vec<(u8, Value)>,
}

impl LeaseBook {
    /// Op `i`, an acquire or a renew: its answer, if any, names a lease.
    fn answer(&mut self, i: usize, o: &Op, first_attempts: &HashMap<(String, String), f64>) {
        let Some(body) = o.answer::<Value>() else {
            return;
        };
        let acquire = o.f == "acquire";
        let (resource, request_id) = if acquire {
            match o.request::<LockCall<AcquireRequest>>() {
                Some(c) => (c.resource, Some(c.body.request_id)),
                None => return,
            }
        } else {
            match o.request::<LockCall<LeaseRequest>>() {
                Some(c) => (c.resource, None),
                None => return,
            }
        };
        let parsed = if acquire {
            value_as::<AcquireResponse>(&body).map(|a| LeaseAnswer {
                lease_id: a.lease_id,
                token: a.fencing_token,
                ttl_ms: a.ttl_ms,
                expires_at_ms: a.expires_at_ms,
            })
        } else {
            value_as::<RenewResponse>(&body).map(|r| LeaseAnswer {
                lease_id: r.lease_id,
                token: r.fencing_token,
                ttl_ms: r.ttl_ms,
                expires_at_ms: r.expires_at_ms,
            })
        };
        let Some(a) = parsed else {
            let invariant = if acquire { 1 } else { 4 };
            self.malformed.push((
                invariant,
                json!({ "reason": "answer without lease fields", "op": o.brief() }),
            ));
            return;
        };
        let seen = o.t_done.unwrap_or(o.t_inv);
        let idx = *self.by_lease.entry(a.lease_id).or_insert_with(|| {
            self.leases.push(LeaseRec {
                lease_id: a.lease_id,
                resource: resource.clone(),
                token: a.token,
                granted_at: u64::MAX,
                acks: Vec::new(),
                acked_until: 0,
                first_seen: seen,
                first_invoke: f64::MAX,
                first_op: i,
                releases: Vec::new(),
            });
            self.leases.len() - 1
        });
        let l = &mut self.leases[idx];
        if l.token != a.token || l.resource != resource {
            self.malformed.push((
                2,
                json!({
                    "reason": "one lease answered with two tokens or resources",
                    "lease": l.brief(),
                    "op": o.brief(),
                }),
            ));
        }
        if acquire {
            l.granted_at = l.granted_at.min(a.expires_at_ms.saturating_sub(a.ttl_ms));
            if let Some(t) = request_id.and_then(|id| first_attempts.get(&(resource, id))) {
                l.first_invoke = l.first_invoke.min(*t);
            }
        }
        if seen < l.first_seen {
            l.first_seen = seen;
            l.first_op = i;
        }
        l.acks.push((seen, a.expires_at_ms));
        l.acked_until = l.acked_until.max(a.expires_at_ms);
    }

    /// A release of a known lease.
    fn release(&mut self, o: &Op) {
        let Some(lease_id) = o
            .request::<LockCall<LeaseRequest>>()
            .and_then(|c| c.body.lease_id)
        else {
            return;
        };
        let Some(&idx) = self.by_lease.get(&lease_id) else {
            return;
        };
        let released = o.answer::<ReleaseResponse>().map(|r| r.released);
        self.leases[idx]
            .releases
            .push((o.t_inv, o.t_done, released));
    }
}

impl Model {
    /// The leases of each resource, in token order.
    pub fn leases_by_resource(&self) -> BTreeMap<&str, Vec<&LeaseRec>> {
        let mut out: BTreeMap<&str, Vec<&LeaseRec>> = BTreeMap::new();
        for l in &self.leases {
            out.entry(l.resource.as_str()).or_default().push(l);
        }
        for v in out.values_mut() {
            v.sort_by_key(|l| l.token);
        }
        out
    }

    /// The lease a renew or release names, if the history knows it.
    pub fn lease_of(&self, o: &Op) -> Option<&LeaseRec> {
        let id = o.request::<LockCall<LeaseRequest>>()?.body.lease_id?;
        self.by_lease.get(&id).map(|&i| &self.leases[i])
    }

    /// Counts every malformed answer that belongs to `r`'s invariant as a violation.
    pub fn report_malformed(&self, r: &mut CheckResult) {
        for (inv, v) in &self.malformed {
            if *inv == r.invariant {
                r.violation(v.clone());
            }
        }
    }

    /// Log time as of the final cluster views: an upper bound for any earlier moment.
    pub fn final_log_now(&self) -> Option<f64> {
        self.final_cluster
            .iter()
            .map(|s| s.locks.now_ms)
            .max()
            .map(|t| t as f64)
    }
}
