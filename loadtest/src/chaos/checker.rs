//! The checker: one function per invariant of issue 6, each reading only the history (and the
//! store's accepted-write log and final state recorded at its end), each reporting how much it
//! checked, how many violations it found and the first counter-example.
//!
//! **Time.** The service's timestamps (`expires_at_ms`) are *log time*: the largest stamp any
//! leader put on a committed command, in ms since the Unix epoch of the stamping leader's
//! clock. Log time never goes backwards, and a leader change shifts every live lease later
//! (never earlier), so all of a run's `expires_at_ms` are on one consistent time line. A
//! lease's validity interval as granted and renewed by the service is
//! `[granted_at, latest acknowledged expires_at_ms]`, where `granted_at = expires_at_ms −
//! ttl_ms` of the acquire's answer. A retried acquire answers with the lease's *current*
//! expiry, which a failover may have moved later, so `expires_at_ms − ttl_ms` is an upper
//! bound on the grant time, never an under-estimate; the checks only use it in the direction
//! where that is safe. Where a check must relate log time to the harness's wall clock (same
//! host, same clock) it uses `log time ≤ wall time + the largest forward clock offset the
//! nemesis injected`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use serde_json::{json, Value};

use super::history::{token_in_value, Event, EventType};

/// Slack for comparing whole-ms service stamps with µs wall-clock readings.
const EPS_MS: f64 = 5.0;

/// One invariant's result.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub invariant: u8,
    pub name: &'static str,
    pub description: &'static str,
    /// How many facts were checked (pairs, log entries, answers — see each check).
    pub checked: u64,
    /// `checked`, by kind of fact.
    pub parts: BTreeMap<&'static str, u64>,
    pub violations: u64,
    /// The first counter-example found, with the history indices of the events involved.
    pub first: Option<Value>,
    /// Up to ten counter-examples.
    pub examples: Vec<Value>,
}

impl CheckResult {
    fn new(invariant: u8, name: &'static str, description: &'static str) -> Self {
        CheckResult {
            invariant,
            name,
            description,
            checked: 0,
            parts: BTreeMap::new(),
            violations: 0,
            first: None,
            examples: Vec::new(),
        }
    }

    fn count(&mut self, part: &'static str) {
        self.checked += 1;
        *self.parts.entry(part).or_default() += 1;
    }

    fn violation(&mut self, v: Value) {
        self.violations += 1;
        if self.first.is_none() {
            self.first = Some(v.clone());
        }
        if self.examples.len() < 10 {
            self.examples.push(v);
        }
    }
}

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
    fn is_ok(&self) -> bool {
        self.kind == EventType::Ok
    }

    /// The lock-API answer body this operation received, if any: the body of an `ok`, or
    /// the body of an answer the drop-responses nemesis threw away (the service gave it).
    fn answer(&self) -> Option<&Value> {
        match self.kind {
            EventType::Ok => Some(&self.resp),
            EventType::Info if self.resp.get("error") == Some(&json!("response_dropped")) => {
                self.resp.get("body")
            }
            _ => None,
        }
    }

    fn req_str(&self, k: &str) -> Option<&str> {
        self.req.get(k).and_then(Value::as_str)
    }

    fn brief(&self) -> Value {
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
struct LeaseRec {
    lease_id: String,
    resource: String,
    token: u64,
    /// Upper bound on the grant's log time: min over acquire answers of expires − ttl.
    granted_at: u64,
    /// Acknowledged expiries (acquire and renew answers): (wall ms received, expires_at_ms).
    acks: Vec<(f64, u64)>,
    /// Latest acknowledged expires_at_ms.
    acked_until: u64,
    /// Wall ms of the first answer naming the lease (it was granted before then).
    first_seen: f64,
    /// Wall ms the first attempt of its acquire (by request id) was sent (granted after).
    first_invoke: f64,
    /// The op that first reported it.
    first_op: usize,
    /// Release attempts: (invoked, completed, released?).
    releases: Vec<(f64, Option<f64>, Option<bool>)>,
}

impl LeaseRec {
    fn released_before(&self, t: f64) -> bool {
        self.releases.iter().any(|(inv, _, _)| *inv < t)
    }

    fn acked_until_before(&self, t: f64) -> u64 {
        self.acks
            .iter()
            .filter(|(done, _)| *done < t)
            .map(|(_, e)| *e)
            .max()
            .unwrap_or(0)
    }

    fn brief(&self) -> Value {
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
    leases: Vec<LeaseRec>,
    by_lease: HashMap<String, usize>,
    /// The largest forward clock offset the nemesis injected (ms, ≥ 0).
    pub max_forward_offset_ms: f64,
    /// Faults the nemesis started, by kind.
    pub faults: BTreeMap<String, u64>,
    /// `GET /log` of the demo store at the end.
    store_log: Option<Vec<Value>>,
    /// `GET /v1/cluster` of each node at the end.
    final_cluster: Vec<Value>,
    /// Problems building the model (malformed answers): each also counts as a violation of
    /// the invariant it belongs to.
    malformed: Vec<(u8, Value)>,
}

pub fn model(events: &[Event]) -> Model {
    let (ops, notes) = ops(events);
    let mut max_off = 0i64;
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for n in &notes {
        if n.process == "nemesis" {
            if let Some(o) = n.value.get("offset_ms").and_then(Value::as_i64) {
                max_off = max_off.max(o);
            }
            if n.f == "start" {
                if let Some(k) = n.value.get("kind").and_then(Value::as_str) {
                    *faults.entry(k.to_string()).or_default() += 1;
                }
            }
        }
    }
    let mut m = Model {
        ops,
        leases: Vec::new(),
        by_lease: HashMap::new(),
        max_forward_offset_ms: max_off as f64,
        faults,
        store_log: None,
        final_cluster: Vec::new(),
        malformed: Vec::new(),
    };
    // The first attempt of every acquire, by (resource, request id).
    let mut first_attempt: HashMap<(String, String), f64> = HashMap::new();
    for o in &m.ops {
        if o.f == "acquire" {
            if let (Some(r), Some(id)) = (o.req_str("resource"), o.req_str("request_id")) {
                let e = first_attempt
                    .entry((r.to_string(), id.to_string()))
                    .or_insert(o.t_inv);
                *e = e.min(o.t_inv);
            }
        }
    }
    for (i, o) in m.ops.iter().enumerate() {
        match o.f.as_str() {
            "acquire" | "renew" => {
                let Some(body) = o.answer() else { continue };
                let Some(resource) = o.req_str("resource") else {
                    continue;
                };
                let (Some(lease_id), Some(token), Some(ttl), Some(exp)) = (
                    body.get("lease_id").and_then(Value::as_str),
                    body.get("fencing_token").and_then(Value::as_u64),
                    body.get("ttl_ms").and_then(Value::as_u64),
                    body.get("expires_at_ms").and_then(Value::as_u64),
                ) else {
                    let inv = if o.f == "acquire" { 1 } else { 4 };
                    m.malformed.push((
                        inv,
                        json!({ "reason": "answer without lease fields", "op": o.brief() }),
                    ));
                    continue;
                };
                let seen = o.t_done.unwrap_or(o.t_inv);
                let idx = *m.by_lease.entry(lease_id.to_string()).or_insert_with(|| {
                    m.leases.push(LeaseRec {
                        lease_id: lease_id.to_string(),
                        resource: resource.to_string(),
                        token,
                        granted_at: u64::MAX,
                        acks: Vec::new(),
                        acked_until: 0,
                        first_seen: seen,
                        first_invoke: f64::MAX,
                        first_op: i,
                        releases: Vec::new(),
                    });
                    m.leases.len() - 1
                });
                let l = &mut m.leases[idx];
                if l.token != token || l.resource != resource {
                    m.malformed.push((
                        2,
                        json!({
                            "reason": "one lease answered with two tokens or resources",
                            "lease": l.brief(),
                            "op": o.brief(),
                        }),
                    ));
                }
                if o.f == "acquire" {
                    l.granted_at = l.granted_at.min(exp.saturating_sub(ttl));
                    if let Some(id) = o.req_str("request_id") {
                        if let Some(t) = first_attempt.get(&(resource.to_string(), id.to_string()))
                        {
                            l.first_invoke = l.first_invoke.min(*t);
                        }
                    }
                }
                if seen < l.first_seen {
                    l.first_seen = seen;
                    l.first_op = i;
                }
                l.acks.push((seen, exp));
                l.acked_until = l.acked_until.max(exp);
            }
            "store_log" if o.is_ok() => {
                m.store_log = o.resp.as_array().cloned();
            }
            "final_cluster" if o.is_ok() => m.final_cluster.push(o.resp.clone()),
            _ => {}
        }
    }
    for o in &m.ops {
        if o.f != "release" {
            continue;
        }
        let Some(&idx) = o.req_str("lease_id").and_then(|id| m.by_lease.get(id)) else {
            continue;
        };
        let released = o
            .answer()
            .and_then(|b| b.get("released"))
            .and_then(Value::as_bool);
        m.leases[idx].releases.push((o.t_inv, o.t_done, released));
    }
    for l in &mut m.leases {
        if l.first_invoke == f64::MAX {
            l.first_invoke = l.first_seen;
        }
    }
    m
}

impl Model {
    fn leases_by_resource(&self) -> BTreeMap<&str, Vec<&LeaseRec>> {
        let mut out: BTreeMap<&str, Vec<&LeaseRec>> = BTreeMap::new();
        for l in &self.leases {
            out.entry(l.resource.as_str()).or_default().push(l);
        }
        for v in out.values_mut() {
            v.sort_by_key(|l| l.token);
        }
        out
    }

    fn malformed(&self, r: &mut CheckResult) {
        for (inv, v) in &self.malformed {
            if *inv == r.invariant {
                r.violation(v.clone());
            }
        }
    }

    /// Log time as of the final cluster views: an upper bound for any earlier moment.
    fn final_log_now(&self) -> Option<f64> {
        self.final_cluster
            .iter()
            .filter_map(|v| v.pointer("/locks/now_ms").and_then(Value::as_u64))
            .max()
            .map(|t| t as f64)
    }
}

/// Invariant 1 — single holder: no two leases of one resource whose validity intervals, as
/// granted and renewed by the service, overlap. Lease B (newer token) overlaps lease A if B
/// was granted before A's latest acknowledged `expires_at_ms` — unless A's holder had already
/// sent a release before B's grant was seen (then A may have ended early, legitimately).
/// A failover extends A beyond its acknowledged expiry; B is then granted later still, so the
/// extension never causes a false alarm. Counts: pairs of leases on one resource.
pub fn check_single_holder(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        1,
        "single_holder",
        "no two leases of a resource have overlapping validity intervals [granted_at, latest acknowledged expires_at_ms]",
    );
    m.malformed(&mut r);
    for leases in m.leases_by_resource().values() {
        for (j, b) in leases.iter().enumerate() {
            for a in &leases[..j] {
                r.count("lease_pairs");
                if a.token == b.token {
                    continue; // invariant 2's business
                }
                if b.granted_at < a.acked_until && !a.released_before(b.first_seen) {
                    r.violation(json!({
                        "resource": b.resource,
                        "overlap_ms": a.acked_until - b.granted_at,
                        "earlier": a.brief(),
                        "earlier_first_answer": m.ops[a.first_op].brief(),
                        "later": b.brief(),
                        "later_first_answer": m.ops[b.first_op].brief(),
                        "explanation": "the later lease was granted while the earlier one was still valid by an acknowledged expires_at_ms, and the earlier holder had not sent a release",
                    }));
                }
            }
        }
    }
    r
}

/// Invariant 2 — tokens strictly increase and never repeat: every token names one lease and
/// every lease one token; a lease granted (answered) before another's acquire was first sent
/// has a smaller token (tokens follow real-time order, globally); the replicas agree on the
/// token counter at the end and it covers every token handed out. Counts: leases.
pub fn check_tokens(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        2,
        "tokens_monotonic",
        "fencing tokens never repeat, follow the real-time order of grants, and the counter never goes backwards",
    );
    m.malformed(&mut r);
    let mut by_token: HashMap<u64, &LeaseRec> = HashMap::new();
    for l in &m.leases {
        r.count("leases");
        if let Some(other) = by_token.insert(l.token, l) {
            r.violation(json!({
                "reason": "one token issued for two leases",
                "fencing_token": l.token,
                "leases": [other.brief(), l.brief()],
            }));
        }
    }
    // Real-time order: sort by when each lease was first seen; for each lease B, every lease
    // seen before B's acquire was first sent must have a smaller token.
    let mut seen: Vec<&LeaseRec> = m.leases.iter().collect();
    seen.sort_by(|a, b| a.first_seen.total_cmp(&b.first_seen));
    // Prefix maximum of tokens in first-seen order, with the lease holding it.
    let mut prefix: Vec<(u64, usize)> = Vec::with_capacity(seen.len());
    for (i, l) in seen.iter().enumerate() {
        let best = match prefix.last() {
            Some(&(t, k)) if t >= l.token => (t, k),
            _ => (l.token, i),
        };
        prefix.push(best);
    }
    for b in &m.leases {
        let n = seen.partition_point(|a| a.first_seen < b.first_invoke);
        if n == 0 {
            continue;
        }
        let (t, k) = prefix[n - 1];
        if t >= b.token && seen[k].lease_id != b.lease_id {
            r.violation(json!({
                "reason": "a lease granted after another one completed has a token that is not larger",
                "earlier": seen[k].brief(),
                "earlier_answer": m.ops[seen[k].first_op].brief(),
                "later": b.brief(),
                "later_answer": m.ops[b.first_op].brief(),
            }));
        }
    }
    // The replicas' counters at the end: equal between nodes at the same applied index, and
    // the most advanced replica's counter covers every token handed out (a lagging replica
    // may legitimately be behind).
    let max_token = m.leases.iter().map(|l| l.token).max().unwrap_or(0);
    let views: Vec<(u64, u64, &Value)> = m
        .final_cluster
        .iter()
        .filter_map(|v| {
            Some((
                v.get("last_applied").and_then(Value::as_u64)?,
                v.pointer("/locks/last_token").and_then(Value::as_u64)?,
                v,
            ))
        })
        .collect();
    let most_applied = views.iter().map(|(a, _, _)| *a).max();
    let mut by_applied: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for (applied, last, v) in &views {
        r.count("replica_counters");
        by_applied.entry(*applied).or_default().insert(*last);
        if Some(*applied) == most_applied && *last < max_token {
            r.violation(json!({
                "reason": "the most advanced replica's token counter is below a token it handed out",
                "node": v.get("node_id"),
                "last_applied": applied,
                "last_token": last,
                "max_token_seen": max_token,
            }));
        }
    }
    for (applied, tokens) in by_applied {
        if tokens.len() > 1 {
            r.violation(json!({
                "reason": "replicas at the same applied index disagree on the token counter",
                "last_applied": applied,
                "last_tokens": tokens,
            }));
        }
    }
    r
}

/// Invariant 3 — the store's accepted-write log is token-monotonic per key, and nothing but
/// fenced, current writes reached it: (a) no entry carries a lower token than an earlier
/// entry for its key; (b) every entry's token was issued for that key's resource; (c) every
/// entry is a write some client sent, and not one the proxy definitely refused; (d) every
/// write the proxy acknowledged is in the log (zero lost updates). Counts: log entries plus
/// acknowledged writes.
pub fn check_store_log(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        3,
        "store_token_monotonic",
        "the store's accepted-write log is token-monotonic per key, holds only current tokens issued for the key, and loses no acknowledged write",
    );
    let Some(log) = &m.store_log else {
        r.violation(json!({ "reason": "the store's log was not recorded at the end of the run" }));
        return r;
    };
    let mut writes: HashMap<&str, &Op> = HashMap::new();
    for o in m.ops.iter().filter(|o| o.f == "write") {
        if let Some(v) = o.req_str("value") {
            writes.insert(v, o);
        }
    }
    let mut issued: HashMap<&str, BTreeSet<u64>> = HashMap::new();
    for l in &m.leases {
        issued
            .entry(l.resource.as_str())
            .or_default()
            .insert(l.token);
    }
    let mut highest: HashMap<String, (u64, &Value)> = HashMap::new();
    let mut landed: BTreeSet<&str> = BTreeSet::new();
    for entry in log {
        r.count("store_log_entries");
        let key = entry.get("key").and_then(Value::as_str).unwrap_or("");
        let value = entry.get("value").and_then(Value::as_str).unwrap_or("");
        let token = entry.get("fence_token").and_then(Value::as_u64);
        landed.insert(value);
        let writer = writes.get(value).map(|o| o.brief());
        let Some(token) = token else {
            r.violation(json!({ "reason": "a write without a fencing token reached the store", "entry": entry, "write": writer }));
            continue;
        };
        if let Some((high, high_entry)) = highest.get(key) {
            if token < *high {
                r.violation(json!({
                    "reason": "a write with a lower token landed after a higher one (lost update)",
                    "key": key,
                    "entry": entry,
                    "write": writer,
                    "after_entry": high_entry,
                    "after_write": high_entry.get("value").and_then(Value::as_str).and_then(|v| writes.get(v)).map(|o| o.brief()),
                }));
            }
        }
        if highest.get(key).is_none_or(|(h, _)| token > *h) {
            highest.insert(key.to_string(), (token, entry));
        }
        let resource = format!("kv:{key}");
        if !issued
            .get(resource.as_str())
            .is_some_and(|s| s.contains(&token))
        {
            r.violation(json!({
                "reason": "a write whose token was never issued for this key's resource reached the store",
                "entry": entry,
                "write": writer,
            }));
        }
        match writes.get(value) {
            None => r.violation(json!({ "reason": "an entry no client wrote", "entry": entry })),
            Some(o) if o.kind == EventType::Fail => r.violation(json!({
                "reason": "a write the proxy refused reached the store",
                "entry": entry,
                "write": o.brief(),
            })),
            Some(o)
                if token_in_value(value) != Some(token)
                    || o.req.get("key").and_then(Value::as_str) != Some(key) =>
            {
                r.violation(json!({
                    "reason": "the entry's token or key differs from what the client sent",
                    "entry": entry,
                    "write": o.brief(),
                }));
            }
            _ => {}
        }
    }
    for o in m.ops.iter().filter(|o| o.f == "write" && o.is_ok()) {
        r.count("acknowledged_writes");
        let v = o.req_str("value").unwrap_or("");
        if !landed.contains(v) {
            r.violation(json!({
                "reason": "an acknowledged write is missing from the store's log",
                "write": o.brief(),
            }));
        }
    }
    r
}

/// Invariant 4 — nothing acknowledged is lost: (a) a renew never answers `lease_lost` while
/// an acknowledged expiry is provably still ahead (log time ≤ wall time + the largest
/// forward clock offset injected) unless the holder had sent a release; (b) a renew never
/// succeeds after a release of that lease answered `released: true`; (c) in the final state
/// every lease that must still be live (acknowledged expiry beyond the final log time, never
/// released) is held with its token and at least its acknowledged expiry, no lease whose
/// release was acknowledged is held, and each resource's token is at least every token
/// handed out for it. Counts: renew answers, releases and final-state facts checked.
pub fn check_acknowledged(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        4,
        "acknowledged_not_lost",
        "every acknowledged acquire, renew and release is reflected in later answers and in the final state",
    );
    m.malformed(&mut r);
    let off = m.max_forward_offset_ms;
    for o in m.ops.iter().filter(|o| o.f == "renew") {
        let Some(&idx) = o.req_str("lease_id").and_then(|id| m.by_lease.get(id)) else {
            continue;
        };
        let l = &m.leases[idx];
        match o.kind {
            EventType::Fail if o.resp.get("error") == Some(&json!("lease_lost")) => {
                r.count("renew_lease_lost_answers");
                let done = o.t_done.unwrap_or(o.t_inv);
                let acked = l.acked_until_before(o.t_inv);
                if !l.released_before(done) && done + off + EPS_MS < acked as f64 {
                    r.violation(json!({
                        "reason": "renew answered lease_lost although the lease was acknowledged until later and never released",
                        "lease": l.brief(),
                        "acked_until_before_renew_ms": acked,
                        "renew": o.brief(),
                        "log_time_at_most_ms": done + off,
                        "max_forward_clock_offset_ms": off,
                    }));
                }
            }
            EventType::Ok => {
                r.count("renew_ok_answers");
                if let Some((_, done, _)) = l
                    .releases
                    .iter()
                    .find(|(_, done, rel)| *rel == Some(true) && done.is_some_and(|d| d < o.t_inv))
                {
                    r.violation(json!({
                        "reason": "a renew succeeded after a release of the same lease was acknowledged",
                        "lease": l.brief(),
                        "release_completed_ms": done,
                        "renew": o.brief(),
                    }));
                }
            }
            _ => {}
        }
    }
    // The final state.
    let final_now = m.final_log_now();
    let by_resource = m.leases_by_resource();
    let mut final_reads = 0;
    for o in m.ops.iter().filter(|o| o.f == "final_read" && o.is_ok()) {
        final_reads += 1;
        let Some(resource) = o.req_str("resource") else {
            continue;
        };
        let Some(leases) = by_resource.get(resource) else {
            continue;
        };
        let held = o.resp.get("held").and_then(Value::as_bool).unwrap_or(false);
        let token = o.resp.get("fencing_token").and_then(Value::as_u64);
        let expires = o.resp.get("expires_at_ms").and_then(Value::as_u64);
        let done = o.t_done.unwrap_or(o.t_inv);
        let bound = final_now.map_or(done + off, |n| n.min(done + off));
        if let (Some(t), Some(max)) = (token, leases.iter().map(|l| l.token).max()) {
            r.count("final_resource_tokens");
            if t < max {
                r.violation(json!({
                    "reason": "the resource's final token is below a token handed out for it",
                    "resource": resource,
                    "final": o.brief(),
                    "max_token_seen": max,
                }));
            }
        }
        for l in leases {
            if l.releases.iter().any(|(_, _, rel)| *rel == Some(true)) {
                r.count("final_released_leases");
                if held && token == Some(l.token) {
                    r.violation(json!({
                        "reason": "a lease whose release was acknowledged is still held at the end",
                        "lease": l.brief(),
                        "final": o.brief(),
                    }));
                }
            } else if l.releases.is_empty() && l.acked_until as f64 > bound + EPS_MS {
                r.count("final_live_leases");
                let ok =
                    held && token == Some(l.token) && expires.is_some_and(|e| e >= l.acked_until);
                if !ok {
                    r.violation(json!({
                        "reason": "a lease acknowledged until after the end of the run is not held (with its token and expiry) in the final state",
                        "lease": l.brief(),
                        "lease_first_answer": m.ops[l.first_op].brief(),
                        "final": o.brief(),
                        "final_log_time_at_most_ms": bound,
                    }));
                }
            }
        }
    }
    if final_reads == 0 && !m.leases.is_empty() {
        r.violation(json!({ "reason": "the final state was not read at the end of the run" }));
    }
    r
}

/// Invariant 5 — a `request_id` never yields two different leases: every answer to an
/// acquire with one (resource, request_id) — first try, retries after lost answers, retries
/// on other nodes, across failovers — names the same lease and token. Counts: request ids
/// that were granted.
pub fn check_request_ids(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        5,
        "request_id_single_lease",
        "all answers to acquires with one request_id name the same lease and token",
    );
    let mut by_request: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for o in m.ops.iter().filter(|o| o.f == "acquire") {
        if o.answer().is_none() {
            continue;
        }
        if let (Some(res), Some(id)) = (o.req_str("resource"), o.req_str("request_id")) {
            by_request.entry((res, id)).or_default().push(o);
        }
    }
    for ((resource, id), answers) in by_request {
        r.count("granted_request_ids");
        let distinct: BTreeSet<(Option<&str>, Option<u64>)> = answers
            .iter()
            .filter_map(|o| o.answer())
            .map(|b| {
                (
                    b.get("lease_id").and_then(Value::as_str),
                    b.get("fencing_token").and_then(Value::as_u64),
                )
            })
            .collect();
        if distinct.len() > 1 {
            r.violation(json!({
                "resource": resource,
                "request_id": id,
                "leases": distinct.iter().map(|(l, t)| json!({ "lease_id": l, "fencing_token": t })).collect::<Vec<_>>(),
                "answers": answers.iter().map(|o| o.brief()).collect::<Vec<_>>(),
            }));
        }
    }
    r
}

/// Runs every check.
pub fn check_all(m: &Model) -> Vec<CheckResult> {
    vec![
        check_single_holder(m),
        check_tokens(m),
        check_store_log(m),
        check_acknowledged(m),
        check_request_ids(m),
    ]
}

/// Counts for the verdict: operations by function and outcome, and what the clients saw.
pub fn stats(m: &Model) -> Value {
    let mut ops: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    let mut writes: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for o in &m.ops {
        let kind = match o.kind {
            EventType::Ok => "ok",
            EventType::Fail => "fail",
            _ => "info",
        };
        let e = ops.entry(o.f.as_str()).or_default();
        *e.entry("invoked").or_default() += 1;
        *e.entry(kind).or_default() += 1;
        if o.f == "write" {
            let role = o.req_str("role").unwrap_or("normal");
            *writes.entry(role).or_default().entry(kind).or_default() += 1;
        }
    }
    let client_ops: u64 = m
        .ops
        .iter()
        .filter(|o| matches!(o.f.as_str(), "acquire" | "renew" | "release" | "write"))
        .count() as u64;
    json!({
        "client_operations": client_ops,
        "by_function": ops,
        "writes_by_role": writes,
        "leases_granted": m.leases.len(),
        "store_log_entries": m.store_log.as_ref().map(Vec::len),
        "max_forward_clock_offset_ms": m.max_forward_offset_ms,
    })
}

#[cfg(test)]
mod tests {
    //! Each check must be able to fail: hand-written histories with one planted violation.
    use super::*;

    struct H {
        events: Vec<Event>,
        op: u64,
    }

    impl H {
        fn new() -> Self {
            H {
                events: Vec::new(),
                op: 0,
            }
        }

        fn push(&mut self, t: f64, process: &str, kind: EventType, f: &str, op: u64, value: Value) {
            self.events.push(Event {
                index: self.events.len() as u64,
                time_ms: t,
                mono_ms: t,
                process: process.into(),
                kind,
                f: f.into(),
                op,
                node: Some(1),
                value,
            });
        }

        #[allow(clippy::too_many_arguments)]
        fn op(
            &mut self,
            t0: f64,
            t1: f64,
            p: &str,
            f: &str,
            kind: EventType,
            req: Value,
            resp: Value,
        ) {
            self.op += 1;
            let op = self.op;
            self.push(t0, p, EventType::Invoke, f, op, req);
            self.push(t1, p, kind, f, op, resp);
        }

        #[allow(clippy::too_many_arguments)]
        fn acquire(
            &mut self,
            t0: f64,
            t1: f64,
            p: &str,
            res: &str,
            rid: &str,
            lease: &str,
            token: u64,
            granted: u64,
            ttl: u64,
        ) {
            self.op(
                t0,
                t1,
                p,
                "acquire",
                EventType::Ok,
                json!({ "resource": res, "request_id": rid, "ttl_ms": ttl }),
                json!({ "resource": res, "lease_id": lease, "fencing_token": token, "ttl_ms": ttl, "expires_at_ms": granted + ttl }),
            );
        }

        fn finish(mut self, store: Value) -> Model {
            self.op(
                9e12,
                9e12,
                "final",
                "store_log",
                EventType::Ok,
                json!({}),
                store,
            );
            model(&self.events)
        }
    }

    fn violations(m: &Model) -> Vec<u64> {
        check_all(m).iter().map(|r| r.violations).collect()
    }

    #[test]
    fn clean_history_passes() {
        let mut h = H::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", "L1", 1, 1005, 2000);
        h.op(
            1100.0,
            1110.0,
            "w1",
            "write",
            EventType::Ok,
            json!({ "key": "a", "value": "w1:t1:n1", "token": 1 }),
            json!({}),
        );
        h.op(
            1200.0,
            1210.0,
            "w1",
            "release",
            EventType::Ok,
            json!({ "resource": "kv:a", "lease_id": "L1" }),
            json!({ "released": true }),
        );
        h.acquire(1300.0, 1310.0, "w2", "kv:a", "r2", "L2", 2, 1305, 2000);
        h.op(
            1400.0,
            1410.0,
            "w2",
            "write",
            EventType::Ok,
            json!({ "key": "a", "value": "w2:t2:n1", "token": 2 }),
            json!({}),
        );
        let store = json!([
            { "seq": 1, "key": "a", "fence_token": 1, "value": "w1:t1:n1" },
            { "seq": 2, "key": "a", "fence_token": 2, "value": "w2:t2:n1" },
        ]);
        assert_eq!(
            violations(&h.finish(store)),
            vec![0, 0, 0, 1, 0],
            "no final read recorded"
        );
    }

    #[test]
    fn overlapping_leases_are_caught() {
        let mut h = H::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", "L1", 1, 1005, 2000);
        // Renewed to 4000, then a second lease granted at 3000 without a release.
        h.op(
            1500.0,
            1510.0,
            "w1",
            "renew",
            EventType::Ok,
            json!({ "resource": "kv:a", "lease_id": "L1" }),
            json!({ "lease_id": "L1", "fencing_token": 1, "ttl_ms": 2000, "expires_at_ms": 3505 }),
        );
        h.acquire(2900.0, 3010.0, "w2", "kv:a", "r2", "L2", 2, 3000, 2000);
        let m = h.finish(json!([]));
        let r = check_single_holder(&m);
        assert_eq!(r.violations, 1);
        // The failover extension is not an overlap: granted after the acknowledged expiry.
        let mut h = H::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", "L1", 1, 1005, 2000);
        h.acquire(2900.0, 4010.0, "w2", "kv:a", "r2", "L2", 2, 3005, 2000);
        assert_eq!(check_single_holder(&h.finish(json!([]))).violations, 0);
    }

    #[test]
    fn token_order_is_checked() {
        let mut h = H::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", "L1", 5, 1005, 2000);
        // Sent after L1 was answered, but a smaller token.
        h.acquire(1100.0, 1110.0, "w2", "kv:b", "r2", "L2", 4, 1105, 2000);
        // A repeated token.
        h.acquire(1200.0, 1210.0, "w3", "kv:c", "r3", "L3", 5, 1205, 2000);
        let r = check_tokens(&h.finish(json!([])));
        assert!(r.violations >= 2, "{r:?}");
    }

    #[test]
    fn lost_update_in_the_store_is_caught() {
        let mut h = H::new();
        h.acquire(1000.0, 1010.0, "z1", "kv:a", "r1", "L1", 1, 1005, 1000);
        h.acquire(2100.0, 2110.0, "w1", "kv:a", "r2", "L2", 2, 2105, 2000);
        h.op(
            2200.0,
            2210.0,
            "w1",
            "write",
            EventType::Ok,
            json!({ "key": "a", "value": "w1:t2:n1", "token": 2 }),
            json!({}),
        );
        h.op(
            2300.0,
            2310.0,
            "z1",
            "write",
            EventType::Ok,
            json!({ "key": "a", "value": "z1:t1:n2", "token": 1, "role": "zombie" }),
            json!({}),
        );
        // Refused by the proxy, yet in the log; and a foreign token.
        h.op(
            2400.0,
            2410.0,
            "z1",
            "write",
            EventType::Fail,
            json!({ "key": "b", "value": "z1:t1:n3", "token": 1 }),
            json!({ "status": 412 }),
        );
        let store = json!([
            { "seq": 1, "key": "a", "fence_token": 2, "value": "w1:t2:n1" },
            { "seq": 2, "key": "a", "fence_token": 1, "value": "z1:t1:n2" },
            { "seq": 3, "key": "b", "fence_token": 1, "value": "z1:t1:n3" },
        ]);
        let r = check_store_log(&h.finish(store));
        // lower-after-higher, foreign token, refused-but-landed.
        assert_eq!(r.violations, 3, "{r:#?}");
        assert!(r.first.unwrap()["reason"]
            .as_str()
            .unwrap()
            .contains("lower token"));
    }

    #[test]
    fn lost_acknowledgements_are_caught() {
        let mut h = H::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", "L1", 1, 1005, 5000);
        // lease_lost at wall 2000 although acknowledged until 6005.
        h.op(
            1990.0,
            2000.0,
            "w1",
            "renew",
            EventType::Fail,
            json!({ "resource": "kv:a", "lease_id": "L1" }),
            json!({ "status": 409, "error": "lease_lost" }),
        );
        // A long lease that the final state no longer shows.
        h.acquire(
            1000.0,
            1010.0,
            "w2",
            "hold:w2:1",
            "r2",
            "L2",
            2,
            1005,
            60_000,
        );
        h.op(
            3000.0,
            3010.0,
            "final",
            "final_read",
            EventType::Ok,
            json!({ "resource": "hold:w2:1" }),
            json!({ "resource": "hold:w2:1", "held": false, "fencing_token": 2 }),
        );
        let r = check_acknowledged(&h.finish(json!([])));
        assert_eq!(r.violations, 2, "{r:#?}");
    }

    #[test]
    fn two_leases_for_one_request_id_are_caught() {
        let mut h = H::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", "L1", 1, 1005, 2000);
        h.op(1100.0, 1110.0, "w1", "acquire", EventType::Info, json!({ "resource": "kv:a", "request_id": "r1" }),
            json!({ "error": "response_dropped", "body": { "lease_id": "L9", "fencing_token": 9, "ttl_ms": 2000, "expires_at_ms": 3105 } }));
        let r = check_request_ids(&h.finish(json!([])));
        assert_eq!(r.violations, 1);
    }
}
