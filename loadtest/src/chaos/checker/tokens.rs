//! Invariant 2: fencing tokens are unique and increase, in real time and in every replica.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::json;

use super::model::LeaseRec;
use super::{CheckResult, Model};

/// Invariant 2 — tokens strictly increase and never repeat: every token names one lease and
/// every lease one token; a lease granted (answered) before another's acquire was first sent
/// has a smaller token (tokens follow real-time order, globally); the replicas agree on the
/// token counter at the end and it covers every token handed out. Counts: leases.
pub fn check(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        2,
        "tokens_monotonic",
        "fencing tokens never repeat, follow the real-time order of grants, and the counter never goes backwards",
    );
    m.report_malformed(&mut r);
    unique(m, &mut r);
    real_time_order(m, &mut r);
    replica_counters(m, &mut r);
    r
}

fn unique(m: &Model, r: &mut CheckResult) {
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
}

/// Sorted by when each lease was first seen: for each lease B, every lease seen before B's
/// acquire was first sent must have a smaller token.
fn real_time_order(m: &Model, r: &mut CheckResult) {
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
}

/// The replicas' counters at the end: equal between nodes at the same applied index, and the
/// most advanced replica's counter covers every token handed out (a lagging replica may
/// legitimately be behind).
fn replica_counters(m: &Model, r: &mut CheckResult) {
    let max_token = m.leases.iter().map(|l| l.token).max().unwrap_or(0);
    let most_applied = m.final_cluster.iter().map(|s| s.last_applied).max();
    let mut by_applied: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for s in &m.final_cluster {
        let (applied, last) = (s.last_applied, s.locks.last_token);
        r.count("replica_counters");
        by_applied.entry(applied).or_default().insert(last);
        if Some(applied) == most_applied && last < max_token {
            r.violation(json!({
                "reason": "the most advanced replica's token counter is below a token it handed out",
                "node": s.node_id,
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
}

#[cfg(test)]
mod tests {
    use super::super::testkit::TestHistory;
    use super::*;

    #[test]
    fn token_order_is_checked() {
        let mut h = TestHistory::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", 1, 5, 1005, 2000);
        // Sent after L1 was answered, but a smaller token.
        h.acquire(1100.0, 1110.0, "w2", "kv:b", "r2", 2, 4, 1105, 2000);
        // A repeated token.
        h.acquire(1200.0, 1210.0, "w3", "kv:c", "r3", 3, 5, 1205, 2000);
        let r = check(&h.finish(json!([])));
        assert!(r.violations >= 2, "{r:?}");
    }
}
