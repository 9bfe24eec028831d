//! Invariant 6: a token is fenced as soon as its release was acknowledged.

use std::collections::HashSet;

use serde_json::json;

use super::{CheckResult, Model};
use crate::chaos::history::{WriteCall, WriteRole};

/// Invariant 6 — once a release answered `released: true`, no write with that lease's token
/// is forwarded any more, through any proxy (also the one that had just forwarded the holder's
/// writes): (a) a write sent after the acknowledged release is never answered as accepted; (b)
/// its value never appears in the store's log. Counts: such writes.
pub fn check(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        6,
        "released_token_fenced",
        "a write sent after its lease's release was acknowledged is refused and never reaches the store",
    );
    let landed: HashSet<&str> = m
        .store_log
        .iter()
        .flatten()
        .map(|e| e.value.as_str())
        .collect();
    for o in m.ops.iter().filter(|o| o.f == "write") {
        let Some(w) = o.request::<WriteCall>() else {
            continue;
        };
        if w.role != WriteRole::AfterRelease {
            continue;
        }
        // Only writes whose release provably answered `released: true` before they were sent.
        let acknowledged = m.leases.iter().any(|l| {
            l.resource == w.resource
                && l.token == w.token
                && l.releases.iter().any(|(_, done, released)| {
                    *released == Some(true) && done.is_some_and(|d| d < o.t_inv)
                })
        });
        if !acknowledged {
            continue;
        }
        r.count("writes_after_acknowledged_release");
        if o.is_ok() {
            r.violation(json!({
                "reason": "a write with a released token was accepted after the release was acknowledged",
                "write": o.brief(),
            }));
        } else if landed.contains(w.value.as_str()) {
            r.violation(json!({
                "reason": "a write with a released token reached the store after the release was acknowledged",
                "write": o.brief(),
            }));
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::check;
    use crate::chaos::checker::testkit::{lease, TestHistory};
    use crate::chaos::history::EventType;

    /// A holder releases (acknowledged) and writes again with its token; `accepted` says
    /// whether the proxy took that write.
    fn history(accepted: bool) -> TestHistory {
        let mut h = TestHistory::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", 1, 1, 1005, 2000);
        h.write(1100.0, 1110.0, "w1", EventType::Ok, "a", 1, "w1:t1:n1");
        h.op(
            1200.0,
            1210.0,
            "w1",
            "release",
            EventType::Ok,
            json!({ "resource": "kv:a", "lease_id": lease(1) }),
            json!({ "released": true }),
        );
        let kind = if accepted {
            EventType::Ok
        } else {
            EventType::Fail
        };
        let resp = if accepted {
            json!({ "seq": 2 })
        } else {
            json!({ "status": 412, "error": "stale_fencing_token" })
        };
        h.op(
            1220.0,
            1230.0,
            "w1",
            "write",
            kind,
            json!({ "resource": "kv:a", "key": "a", "value": "w1:t1:n2", "token": 1, "role": "after_release" }),
            resp,
        );
        h
    }

    #[test]
    fn a_refused_write_after_release_passes() {
        let store = json!([{ "seq": 1, "key": "a", "fence_token": 1, "value": "w1:t1:n1" }]);
        let r = check(&history(false).finish(store));
        assert_eq!((r.checked, r.violations), (1, 0));
    }

    #[test]
    fn a_write_after_release_that_landed_is_caught() {
        let store = json!([
            { "seq": 1, "key": "a", "fence_token": 1, "value": "w1:t1:n1" },
            { "seq": 2, "key": "a", "fence_token": 1, "value": "w1:t1:n2" },
        ]);
        let r = check(&history(true).finish(store));
        assert_eq!(r.violations, 1);
    }
}
