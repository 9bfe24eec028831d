//! Invariant 5: one `request_id`, one lease.

use std::collections::{BTreeMap, BTreeSet};

use lock_core::wire::{AcquireRequest, AcquireResponse, LeaseId};
use serde_json::json;

use super::model::Op;
use super::{CheckResult, Model};
use crate::chaos::history::LockCall;

/// Invariant 5 — a `request_id` never yields two different leases: every answer to an
/// acquire with one (resource, request_id) — first try, retries after lost answers, retries
/// on other nodes, across failovers — names the same lease and token. Counts: request ids
/// that were granted.
pub fn check(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        5,
        "request_id_single_lease",
        "all answers to acquires with one request_id name the same lease and token",
    );
    let mut by_request: BTreeMap<(String, String), Vec<&Op>> = BTreeMap::new();
    for o in m.ops.iter().filter(|o| o.f == "acquire" && o.answered()) {
        if let Some(call) = o.request::<LockCall<AcquireRequest>>() {
            by_request
                .entry((call.resource, call.body.request_id))
                .or_default()
                .push(o);
        }
    }
    for ((resource, id), answers) in by_request {
        r.count("granted_request_ids");
        // An answer that does not parse counts as one more, different lease.
        let distinct: BTreeSet<Option<(LeaseId, u64)>> = answers
            .iter()
            .map(|o| {
                o.answer::<AcquireResponse>()
                    .map(|a| (a.lease_id, a.fencing_token))
            })
            .collect();
        if distinct.len() > 1 {
            r.violation(json!({
                "resource": resource,
                "request_id": id,
                "leases": distinct.iter().map(|d| json!({
                    "lease_id": d.map(|(l, _)| l),
                    "fencing_token": d.map(|(_, t)| t),
                })).collect::<Vec<_>>(),
                "answers": answers.iter().map(|o| o.brief()).collect::<Vec<_>>(),
            }));
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{lease, TestHistory};
    use super::*;
    use crate::chaos::history::EventType;

    #[test]
    fn two_leases_for_one_request_id_are_caught() {
        let mut h = TestHistory::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", 1, 1, 1005, 2000);
        h.op(
            1100.0,
            1110.0,
            "w1",
            "acquire",
            EventType::Info,
            json!({ "resource": "kv:a", "request_id": "r1" }),
            json!({ "error": "response_dropped", "body": {
                "resource": "kv:a", "lease_id": lease(9), "fencing_token": 9, "ttl_ms": 2000, "expires_at_ms": 3105,
            } }),
        );
        let r = check(&h.finish(json!([])));
        assert_eq!(r.violations, 1);
    }
}
