//! Invariant 4: what the service acknowledged stays true, in later answers and at the end.

use lock_core::wire::{ErrorCode, LockView};
use serde_json::json;

use super::{CheckResult, Model, EPS_MS};
use crate::chaos::history::{EventType, ReadCall};

/// Invariant 4 — nothing acknowledged is lost: (a) a renew never answers `lease_lost` while
/// an acknowledged expiry is provably still ahead (log time ≤ wall time + the largest
/// forward clock offset injected) unless the holder had sent a release; (b) a renew never
/// succeeds after a release of that lease answered `released: true`; (c) in the final state
/// every lease that must still be live (acknowledged expiry beyond the final log time, never
/// released) is held with its token and at least its acknowledged expiry, no lease whose
/// release was acknowledged is held, and each resource's token is at least every token
/// handed out for it. Counts: renew answers, releases and final-state facts checked.
pub fn check(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        4,
        "acknowledged_not_lost",
        "every acknowledged acquire, renew and release is reflected in later answers and in the final state",
    );
    m.report_malformed(&mut r);
    renewals(m, &mut r);
    final_state(m, &mut r);
    r
}

/// (a) and (b).
fn renewals(m: &Model, r: &mut CheckResult) {
    let off = m.max_forward_offset_ms;
    let lease_lost = |o: &super::model::Op| {
        o.trouble()
            .is_some_and(|t| t.error == ErrorCode::LeaseLost.as_str())
    };
    for o in m.ops.iter().filter(|o| o.f == "renew") {
        let Some(l) = m.lease_of(o) else {
            continue;
        };
        match o.kind {
            EventType::Fail if lease_lost(o) => {
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
}

/// (c), from the linearizable reads of every touched resource after the run.
fn final_state(m: &Model, r: &mut CheckResult) {
    let off = m.max_forward_offset_ms;
    let final_now = m.final_log_now();
    let by_resource = m.leases_by_resource();
    let mut final_reads = 0;
    for o in m.ops.iter().filter(|o| o.f == "final_read" && o.is_ok()) {
        final_reads += 1;
        let Some(ReadCall::Resource(resource)) = o.request::<ReadCall>() else {
            continue;
        };
        let Some(leases) = by_resource.get(resource.as_str()) else {
            continue;
        };
        let Some(view) = o.answer::<LockView>() else {
            continue;
        };
        let done = o.t_done.unwrap_or(o.t_inv);
        let bound = final_now.map_or(done + off, |n| n.min(done + off));
        if let (Some(t), Some(max)) = (view.fencing_token, leases.iter().map(|l| l.token).max()) {
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
            let holds_it = view.held && view.fencing_token == Some(l.token);
            if l.releases.iter().any(|(_, _, rel)| *rel == Some(true)) {
                r.count("final_released_leases");
                if holds_it {
                    r.violation(json!({
                        "reason": "a lease whose release was acknowledged is still held at the end",
                        "lease": l.brief(),
                        "final": o.brief(),
                    }));
                }
            } else if l.releases.is_empty() && l.acked_until as f64 > bound + EPS_MS {
                r.count("final_live_leases");
                if !(holds_it && view.expires_at_ms.is_some_and(|e| e >= l.acked_until)) {
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
    if final_reads == 0 && !m.leases.is_empty() && !m.cut_short {
        r.violation(json!({ "reason": "the final state was not read at the end of the run" }));
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::TestHistory;
    use super::*;

    #[test]
    fn lost_acknowledgements_are_caught() {
        let mut h = TestHistory::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", 1, 1, 1005, 5000);
        // lease_lost at wall 2000 although acknowledged until 6005.
        h.renew(1990.0, 2000.0, "w1", EventType::Fail, "kv:a", 1, None);
        // A long lease that the final state no longer shows.
        h.acquire(1000.0, 1010.0, "w2", "hold:w2:1", "r2", 2, 2, 1005, 60_000);
        h.op(
            3000.0,
            3010.0,
            "final",
            "final_read",
            EventType::Ok,
            json!({ "resource": "hold:w2:1" }),
            json!({ "resource": "hold:w2:1", "held": false, "holder": null, "fencing_token": 2, "expires_at_ms": null, "waiters": 0 }),
        );
        let r = check(&h.finish(json!([])));
        assert_eq!(r.violations, 2, "{r:#?}");
    }
}
