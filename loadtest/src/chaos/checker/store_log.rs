//! Invariant 3: the store only ever took current, fenced writes, in token order per key.

use std::collections::{BTreeSet, HashMap};

use lock_core::wire::StoreLogEntry;
use serde_json::json;

use super::model::Op;
use super::{CheckResult, Model};
use crate::chaos::history::{token_in_value, EventType, WriteCall};

/// A write some client sent, with its operation.
type Write<'a> = (WriteCall, &'a Op);

/// Invariant 3 — the store's accepted-write log is token-monotonic per key, and nothing but
/// fenced, current writes reached it: (a) no entry carries a lower token than an earlier
/// entry for its key; (b) every entry's token was issued for that key's resource; (c) every
/// entry is a write some client sent, and not one the proxy definitely refused; (d) every
/// write the proxy acknowledged is in the log (zero lost updates). Counts: log entries plus
/// acknowledged writes.
pub fn check(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        3,
        "store_token_monotonic",
        "the store's accepted-write log is token-monotonic per key, holds only current tokens issued for the key, and loses no acknowledged write",
    );
    let Some(log) = &m.store_log else {
        if !m.cut_short {
            r.violation(
                json!({ "reason": "the store's log was not recorded at the end of the run" }),
            );
        }
        return r;
    };
    let writes: Vec<Write> = m
        .ops
        .iter()
        .filter(|o| o.f == "write")
        .filter_map(|o| Some((o.request::<WriteCall>()?, o)))
        .collect();
    let by_value: HashMap<&str, &Write> = writes.iter().map(|w| (w.0.value.as_str(), w)).collect();
    let mut issued: HashMap<&str, BTreeSet<u64>> = HashMap::new();
    for l in &m.leases {
        issued
            .entry(l.resource.as_str())
            .or_default()
            .insert(l.token);
    }
    let mut highest: HashMap<&str, (u64, &StoreLogEntry)> = HashMap::new();
    // Orders are the idempotent route's effects, checked by invariant 8; they carry no token.
    for entry in log.iter().filter(|e| !e.is_order()) {
        r.count("store_log_entries");
        let key = entry.key.as_str();
        let writer = by_value.get(entry.value.as_str()).map(|(_, o)| o.brief());
        let Some(token) = entry.fence_token else {
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
                    "after_write": by_value.get(high_entry.value.as_str()).map(|(_, o)| o.brief()),
                }));
            }
        }
        if highest.get(key).is_none_or(|(h, _)| token > *h) {
            highest.insert(key, (token, entry));
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
        check_origin(
            &mut r,
            entry,
            token,
            by_value.get(entry.value.as_str()).copied(),
        );
    }
    let landed: BTreeSet<&str> = log.iter().map(|e| e.value.as_str()).collect();
    for (w, o) in writes.iter().filter(|(_, o)| o.is_ok()) {
        r.count("acknowledged_writes");
        if !landed.contains(w.value.as_str()) {
            r.violation(json!({
                "reason": "an acknowledged write is missing from the store's log",
                "write": o.brief(),
            }));
        }
    }
    r
}

/// (c): the entry is what a client sent, and the proxy did not refuse it.
fn check_origin(r: &mut CheckResult, entry: &StoreLogEntry, token: u64, write: Option<&Write>) {
    match write {
        None => r.violation(json!({ "reason": "an entry no client wrote", "entry": entry })),
        Some((_, o)) if o.kind == EventType::Fail => r.violation(json!({
            "reason": "a write the proxy refused reached the store",
            "entry": entry,
            "write": o.brief(),
        })),
        Some((w, o)) if token_in_value(&entry.value) != Some(token) || w.key != entry.key => {
            r.violation(json!({
                "reason": "the entry's token or key differs from what the client sent",
                "entry": entry,
                "write": o.brief(),
            }));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::TestHistory;
    use super::*;

    #[test]
    fn lost_update_in_the_store_is_caught() {
        let mut h = TestHistory::new();
        h.acquire(1000.0, 1010.0, "z1", "kv:a", "r1", 1, 1, 1005, 1000);
        h.acquire(2100.0, 2110.0, "w1", "kv:a", "r2", 2, 2, 2105, 2000);
        h.write(2200.0, 2210.0, "w1", EventType::Ok, "a", 2, "w1:t2:n1");
        h.write(2300.0, 2310.0, "z1", EventType::Ok, "a", 1, "z1:t1:n2");
        // Refused by the proxy, yet in the log; and a foreign token.
        h.write(2400.0, 2410.0, "z1", EventType::Fail, "b", 1, "z1:t1:n3");
        let store = json!([
            { "seq": 1, "key": "a", "fence_token": 2, "value": "w1:t2:n1" },
            { "seq": 2, "key": "a", "fence_token": 1, "value": "z1:t1:n2" },
            { "seq": 3, "key": "b", "fence_token": 1, "value": "z1:t1:n3" },
        ]);
        let r = check(&h.finish(store));
        // lower-after-higher, foreign token, refused-but-landed.
        assert_eq!(r.violations, 3, "{r:#?}");
        let first = r.first.expect("a first violation");
        assert!(first["reason"]
            .as_str()
            .is_some_and(|s| s.contains("lower token")));
    }
}
