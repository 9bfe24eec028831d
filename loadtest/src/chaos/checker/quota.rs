//! Invariant 9: together, the proxies admit at most R·t + B + ΣE requests of a tenant over any
//! window of length t.
//!
//! **What counts as admitted** is the store's record (`GET /limited-log`): every request that
//! reached the upstream, whatever its client heard (a client may time out on a request the
//! store answered). **When** is judged without trusting any proxy's clock: a request was
//! admitted after its client sent it (the history's invocation time) and before the store
//! received it (the store's own clock; both are the wall clock of one host). So a window
//! `[x, y]` certainly holds every request invoked at or after `x` and received by `y`; a
//! paused proxy that forwards an old admission late, or a slow network, cannot make the check
//! fire falsely, and any count above `R·(y − x) + B + ΣE` is a real overshoot.
//!
//! Every window whose ends are an invocation and a receipt is examined ([`quota_window`]; a
//! few thousand admitted requests in a chaos run); the worst one is the first counter-example.

use std::collections::HashMap;

use lock_core::wire::LimitedLogEntry;
use serde_json::json;

use super::{CheckResult, Model};
use crate::chaos::history::LimitedCall;
use crate::quota_window::{self, Admitted, Window};

pub fn check(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        9,
        "quota_window",
        "over every window of length t the store received at most R·t + B + ΣE rate-limited requests that were sent within the window",
    );
    let Some(quota) = &m.quota else {
        // No quota workload in this run: nothing to check.
        return r;
    };
    let Some(log) = m
        .ops
        .iter()
        .filter(|o| o.f == "limited_log" && o.is_ok())
        .find_map(|o| o.answer::<Vec<LimitedLogEntry>>())
    else {
        if !m.cut_short {
            r.violation(json!({ "reason": "the store's log of rate-limited requests was not recorded at the end of the run" }));
        }
        return r;
    };
    let sent: HashMap<String, f64> = m
        .ops
        .iter()
        .filter(|o| o.f == "limited")
        .filter_map(|o| Some((o.request::<LimitedCall>()?.key, o.t_inv)))
        .collect();
    let mut admitted: Vec<Admitted> = Vec::new();
    let mut keys = Vec::new();
    for e in &log {
        r.count("store_entries");
        match sent.get(&e.key) {
            Some(&t) => {
                admitted.push(Admitted {
                    sent: t,
                    at: e.at_ms,
                });
                keys.push(e.key.as_str());
            }
            None => r.violation(json!({
                "reason": "the store received a rate-limited request no client sent",
                "entry": e,
            })),
        }
    }
    let allowance = quota.allowance * quota.proxies;
    let bound = |span| quota_window::bound(quota.rate_per_s, quota.burst, allowance, span);
    let mut worst: Vec<Window> = Vec::new();
    for w in quota_window::windows(&admitted, bound) {
        r.count("windows");
        if w.excess() > 0.0 {
            worst.push(w);
        }
    }
    worst.sort_by(|a, b| b.excess().total_cmp(&a.excess()));
    for w in worst {
        let inside: Vec<&str> = admitted
            .iter()
            .zip(&keys)
            .filter(|(a, _)| a.sent >= w.from && a.at <= w.to)
            .map(|(_, k)| *k)
            .take(5)
            .collect();
        r.violation(json!({
            "reason": "the proxies together admitted more than R·t + B + ΣE in a window",
            "window_from_ms": w.from,
            "window_to_ms": w.to,
            "window_s": (w.to - w.from) / 1000.0,
            "admitted": w.count,
            "bound": w.bound,
            "rate_per_s": quota.rate_per_s,
            "burst": quota.burst,
            "allowance_total": allowance,
            "unsafe_refill_on_renew": quota.unsafe_refill_on_renew,
            "first_keys": inside,
        }));
    }
    r
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::super::testkit::TestHistory;
    use super::*;
    use crate::chaos::history::{EventType, QuotaNote};

    fn note(rate: u64, burst: u64) -> QuotaNote {
        QuotaNote {
            rate_per_s: rate,
            burst,
            allowance: 0,
            proxies: 3,
            lease_ms: 1_000,
            unsafe_refill_on_renew: false,
        }
    }

    /// Requests sent every `every_ms` from `t0`, each received 2 ms later.
    fn history(n: u64, t0: f64, every_ms: f64) -> (TestHistory, Value) {
        let mut h = TestHistory::new();
        let mut log = Vec::new();
        for i in 0..n {
            let t = t0 + i as f64 * every_ms;
            let key = format!("q-{i}");
            h.op(
                t,
                t + 3.0,
                "q1",
                "limited",
                EventType::Ok,
                json!({ "key": key, "tenant": "chaos" }),
                json!("ok"),
            );
            log.push(json!({ "seq": i + 1, "key": key, "tenant": "chaos", "at_ms": t + 2.0 }));
        }
        (h, Value::Array(log))
    }

    fn run(h: TestHistory, log: Value, q: QuotaNote) -> CheckResult {
        let mut h = h;
        h.op(
            1e9,
            1e9 + 1.0,
            "final",
            "limited_log",
            EventType::Ok,
            json!({ "url": "x" }),
            log,
        );
        let mut m = h.finish(json!([]));
        m.quota = Some(q);
        check(&m)
    }

    /// 10/s with a burst of 20 over 10 s: the bound is 120, and 110 requests at 11/s fit.
    #[test]
    fn within_the_bound_passes() {
        let (h, log) = history(110, 1_000.0, 1000.0 / 11.0);
        let r = run(h, log, note(10, 20));
        assert_eq!(r.violations, 0, "{r:#?}");
        assert_eq!(r.parts["store_entries"], 110);
    }

    /// 20/s for 10 s against 10/s + 20: the worst window is the whole run (200 vs ~120).
    #[test]
    fn overshoot_is_caught_with_the_worst_window() {
        let (h, log) = history(200, 1_000.0, 50.0);
        let r = run(h, log, note(10, 20));
        assert!(r.violations > 0);
        let first = r.first.expect("a counter-example");
        assert_eq!(first["admitted"], 200, "{first}");
        assert!(
            first["bound"].as_f64().is_some_and(|b| b < 125.0),
            "{first}"
        );
    }

    /// A burst of B + 1 requests sent at once is one too many, however short the window.
    #[test]
    fn one_over_the_burst_is_caught() {
        let (h, log) = history(21, 1_000.0, 0.0);
        let r = run(h, log, note(10, 20));
        assert!(r.violations > 0, "{r:#?}");
    }

    /// Requests sent long before they reach the store (a paused proxy) do not count in a
    /// short window: their admission may have been anywhere since they were sent.
    #[test]
    fn late_deliveries_do_not_fire_falsely() {
        let (mut h, _) = history(0, 0.0, 0.0);
        let mut log = Vec::new();
        for i in 0..40u64 {
            // Twenty sent at 1 s (admitted then, from a full bucket), delivered at 5 s after a
            // pause; twenty more sent and delivered at 5 s (the bucket refilled meanwhile).
            let t = if i < 20 { 1_000.0 } else { 5_000.0 };
            let key = format!("q-{i}");
            h.op(
                t,
                5_001.0,
                "q1",
                "limited",
                EventType::Ok,
                json!({ "key": key, "tenant": "chaos" }),
                json!("ok"),
            );
            log.push(json!({ "seq": i + 1, "key": key, "tenant": "chaos", "at_ms": 5_000.5 }));
        }
        let r = run(h, Value::Array(log), note(10, 20));
        assert_eq!(r.violations, 0, "{r:#?}");
    }
}
