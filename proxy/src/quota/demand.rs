//! The demand a proxy reports for one (quota, tenant) pool with each lease request: requests
//! offered per second (admitted or not) over the last lease duration. Pure: time is an input.
//!
//! The ledger keeps only each proxy's latest report and splits the pool by them, so a report
//! must stand for the proxy's load, not for the few milliseconds since its previous request:
//! a proxy that asks often (it holds less than its target) would otherwise report 0 or a
//! spike at random, and a pool's first request, measured over a millisecond, would claim a
//! thousand requests per second. Hence a sliding window of one lease duration, never shorter:
//! a pool younger than the window counts as quiet before its first request.

use std::collections::VecDeque;

/// Intervals kept at most (the lessor asks a few times per lease duration; this only bounds
/// memory if it asks more often, e.g. while the cluster is unreachable): beyond it the two
/// oldest are merged, so no request goes uncounted.
const MAX_INTERVALS: usize = 64;

#[derive(Clone, Debug)]
pub struct DemandMeter {
    /// Start of the interval being counted.
    since_ms: u64,
    /// Weighted requests offered since `since_ms`.
    current: u64,
    /// Earlier intervals: (from, until, offered).
    past: VecDeque<(u64, u64, u64)>,
}

impl DemandMeter {
    pub fn new(now_ms: u64) -> Self {
        DemandMeter {
            since_ms: now_ms,
            current: 0,
            past: VecDeque::new(),
        }
    }

    /// Counts a request of weight `cost` as offered.
    pub fn offer(&mut self, cost: u64) {
        self.current = self.current.saturating_add(cost);
    }

    /// Closes the interval being counted at `now_ms` and returns the demand in
    /// milli-requests per second: the requests offered in the intervals that reach into the
    /// last `window_ms`, over their span, which is never taken shorter than `window_ms`.
    pub fn report(&mut self, now_ms: u64, window_ms: u64) -> u64 {
        let now_ms = now_ms.max(self.since_ms);
        self.past.push_back((self.since_ms, now_ms, self.current));
        self.since_ms = now_ms;
        self.current = 0;
        let start = now_ms.saturating_sub(window_ms);
        while self.past.len() > 1 && self.past.front().is_some_and(|p| p.1 <= start) {
            self.past.pop_front();
        }
        if self.past.len() > MAX_INTERVALS {
            if let (Some(a), Some(b)) = (self.past.pop_front(), self.past.pop_front()) {
                self.past.push_front((a.0, b.1, a.2.saturating_add(b.2)));
            }
        }
        let from = self.past.front().map_or(now_ms, |p| p.0);
        let offered = self
            .past
            .iter()
            .map(|p| p.2)
            .fold(0u64, u64::saturating_add);
        let span = now_ms.saturating_sub(from).max(window_ms).max(1);
        // Requests per millisecond × 1000 ms/s × 1000 milli.
        offered.saturating_mul(1_000_000) / span
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: u64 = 1_000;

    /// 1 request/s in milli-requests per second.
    const PER_S: u64 = 1_000;

    #[test]
    fn a_first_request_is_not_a_thousand_per_second() {
        let mut m = DemandMeter::new(0);
        m.offer(1);
        assert_eq!(
            m.report(1, LEASE),
            PER_S,
            "one request over one lease duration"
        );
    }

    /// A proxy asking every 10 ms (or every quarter lease) under a steady 10/s reports about
    /// 10/s every time, not 0 most times and 100/s now and then.
    #[test]
    fn frequent_reports_of_a_steady_load_are_steady() {
        for every in [10, 250] {
            let mut m = DemandMeter::new(0);
            let mut reports = Vec::new();
            for t in 1..=5_000u64 {
                if t % 100 == 0 {
                    m.offer(1);
                }
                if t % every == 0 {
                    reports.push((t, m.report(t, LEASE)));
                }
            }
            for (t, d) in reports.into_iter().filter(|(t, _)| *t >= 2 * LEASE) {
                assert!(
                    (9 * PER_S..=11 * PER_S).contains(&d),
                    "asking every {every} ms: {d} milli/s at {t} ms"
                );
            }
        }
    }

    #[test]
    fn old_load_leaves_the_window() {
        let mut m = DemandMeter::new(0);
        for _ in 0..100 {
            m.offer(1);
        }
        assert_eq!(m.report(1_000, LEASE), 100 * PER_S);
        // The interval that reaches into the window counts whole: 100 over 1.5 s.
        assert_eq!(
            m.report(1_500, LEASE),
            100 * PER_S * 2 / 3,
            "still in the window"
        );
        assert_eq!(m.report(2_600, LEASE), 0, "gone a window later");
    }

    #[test]
    fn weighted_requests_count_their_cost() {
        let mut m = DemandMeter::new(0);
        m.offer(5);
        m.offer(5);
        assert_eq!(m.report(2_000, 2_000), 5 * PER_S);
    }
}
