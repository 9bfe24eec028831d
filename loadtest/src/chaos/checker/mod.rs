//! The checker: one check per invariant, each reading only the history (and the store's
//! accepted-write log and final state recorded at its end), each reporting how much it
//! checked, how many violations it found and the first counter-example.
//!
//! [`model`](mod@model) pairs invocations with completions and gathers every lease the answers name;
//! then one file per invariant:
//!
//! 1. [`single_holder`]: no two leases of a resource overlap.
//! 2. [`tokens`]: fencing tokens never repeat and follow the real-time order of grants.
//! 3. [`store_log`]: the store's accepted writes are token-monotonic per key and complete.
//! 4. [`acknowledged`]: nothing acknowledged is lost, in later answers or the final state.
//! 5. [`request_ids`]: one `request_id`, one lease.
//! 6. [`after_release`]: nothing a holder writes after its acknowledged release lands.
//! 7. [`orders`]: at most one order per (tenant, Idempotency-Key), and every answer names it.
//! 8. [`quota`]: the proxies together admit at most R·t + B + ΣE over any window (runs with a
//!    quota workload).
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

mod acknowledged;
mod after_release;
mod model;
mod orders;
mod quota;
mod request_ids;
mod result;
mod single_holder;
mod stats;
mod store_log;
#[cfg(test)]
mod testkit;
mod tokens;

pub use model::{model, Model};
pub use result::CheckResult;
pub use stats::{stats, Operations};

/// Slack for comparing whole-ms service stamps with µs wall-clock readings.
const EPS_MS: f64 = 5.0;

/// Runs every check.
pub fn check_all(m: &Model) -> Vec<CheckResult> {
    vec![
        single_holder::check(m),
        tokens::check(m),
        store_log::check(m),
        acknowledged::check(m),
        request_ids::check(m),
        after_release::check(m),
        orders::check(m),
        quota::check(m),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::testkit::{lease, TestHistory};
    use super::*;
    use crate::chaos::history::EventType;

    #[test]
    fn clean_history_passes() {
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
        h.acquire(1300.0, 1310.0, "w2", "kv:a", "r2", 2, 2, 1305, 2000);
        h.write(1400.0, 1410.0, "w2", EventType::Ok, "a", 2, "w2:t2:n1");
        let store = json!([
            { "seq": 1, "key": "a", "fence_token": 1, "value": "w1:t1:n1" },
            { "seq": 2, "key": "a", "fence_token": 2, "value": "w2:t2:n1" },
        ]);
        let violations: Vec<u64> = check_all(&h.finish(store))
            .iter()
            .map(|r| r.violations)
            .collect();
        assert_eq!(
            violations,
            vec![0, 0, 0, 1, 0, 0, 0, 0],
            "no final read recorded"
        );
    }

    fn history_without_its_end() -> TestHistory {
        let mut h = TestHistory::new();
        h.acquire(1000.0, 1010.0, "w1", "kv:a", "r1", 1, 1, 1005, 2000);
        h.write(1020.0, 1030.0, "w1", EventType::Ok, "a", 1, "v1");
        h
    }

    fn violations(m: &Model) -> u64 {
        check_all(m).iter().map(|r| r.violations).sum()
    }

    #[test]
    fn a_history_missing_its_end_reads_fails_unless_the_run_was_cut_short() {
        // A run that reached its end must have read the store's log and the final state.
        let whole = history_without_its_end().unfinished();
        assert!(violations(&whole) > 0);
        // One cut short never got there: that alone is no violation.
        assert_eq!(violations(&history_without_its_end().cut_short()), 0);
    }

    #[test]
    fn a_run_cut_short_is_still_checked_for_what_its_history_holds() {
        let mut h = history_without_its_end();
        // A second lease on kv:a inside the first one's validity.
        h.acquire(1500.0, 1510.0, "w2", "kv:a", "r2", 2, 2, 1505, 2000);
        assert!(violations(&h.cut_short()) > 0);
    }
}
