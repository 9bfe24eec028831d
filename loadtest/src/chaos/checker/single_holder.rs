//! Invariant 1: a resource has one holder at a time.

use serde_json::json;

use super::{CheckResult, Model};

/// Invariant 1 — single holder: no two leases of one resource whose validity intervals, as
/// granted and renewed by the service, overlap. Lease B (newer token) overlaps lease A if B
/// was granted before A's latest acknowledged `expires_at_ms` — unless A's holder had already
/// sent a release before B's grant was seen (then A may have ended early, legitimately).
/// A failover extends A beyond its acknowledged expiry; B is then granted later still, so the
/// extension never causes a false alarm. Counts: pairs of leases on one resource.
pub fn check(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        1,
        "single_holder",
        "no two leases of a resource have overlapping validity intervals [granted_at, latest acknowledged expires_at_ms]",
    );
    m.report_malformed(&mut r);
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

#[cfg(test)]
mod tests {
    use super::super::testkit::TestHistory;
    use super::*;
    use crate::chaos::history::EventType;

    #[test]
    fn overlapping_leases_are_caught() {
        let mut h = TestHistory::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", 1, 1, 1005, 2000);
        // Renewed to 3505, then a second lease granted at 3000 without a release.
        h.renew(
            1500.0,
            1510.0,
            "w1",
            EventType::Ok,
            "kv:a",
            1,
            Some((1, 2000, 3505)),
        );
        h.acquire(2900.0, 3010.0, "w2", "kv:a", "r2", 2, 2, 3000, 2000);
        assert_eq!(check(&h.finish(json!([]))).violations, 1);
    }

    #[test]
    fn a_failover_extension_is_not_an_overlap() {
        // Granted after the acknowledged expiry, answered late.
        let mut h = TestHistory::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", 1, 1, 1005, 2000);
        h.acquire(2900.0, 4010.0, "w2", "kv:a", "r2", 2, 2, 3005, 2000);
        assert_eq!(check(&h.finish(json!([]))).violations, 0);
    }
}
