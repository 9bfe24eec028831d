//! The bound a global rate limit promises, checked over every window: R·t + B (+ ΣE).
//!
//! An admitted request is known only by an interval: it was admitted after its client `sent` it
//! and before the upstream received it (or the client got the answer), `at`. A window `[x, y]`
//! therefore certainly holds every request sent at or after `x` and received by `y`; counting
//! those never blames the limiter for a slow network or a paused proxy. Every window whose ends
//! are a send time and a receipt time is examined: O(n²) in the admitted requests.

/// One admitted request: sent at `sent`, received at `at` (ms on one clock).
#[derive(Clone, Debug)]
pub struct Admitted {
    pub sent: f64,
    pub at: f64,
}

/// The worst window starting at one send time.
#[derive(Clone, Debug)]
pub struct Window {
    pub from: f64,
    pub to: f64,
    pub count: u64,
    pub bound: f64,
}

impl Window {
    /// Admitted requests above the bound (negative: headroom).
    pub fn excess(&self) -> f64 {
        self.count as f64 - self.bound
    }
}

/// The bound over a window of `span_ms`: R·t + B + `allowance`.
pub fn bound(rate_per_s: u64, burst: u64, allowance: u64, span_ms: f64) -> f64 {
    rate_per_s as f64 * span_ms.max(0.0) / 1000.0 + burst as f64 + allowance as f64
}

/// For each send time `x`, the window `[x, y]` (y a receipt time) with the largest excess of
/// admitted requests over `bound(y − x)`.
pub fn windows(admitted: &[Admitted], bound: impl Fn(f64) -> f64) -> Vec<Window> {
    let mut by_sent: Vec<&Admitted> = admitted.iter().collect();
    by_sent.sort_by(|a, b| b.sent.total_cmp(&a.sent));
    // Receipt times of the requests sent at or after the current start, kept sorted.
    let mut receipts: Vec<f64> = Vec::with_capacity(admitted.len());
    let mut out = Vec::with_capacity(admitted.len());
    for a in by_sent {
        let at = receipts.partition_point(|&t| t <= a.at);
        receipts.insert(at, a.at);
        let x = a.sent;
        let best = receipts
            .iter()
            .enumerate()
            .map(|(i, &y)| Window {
                from: x,
                to: y,
                count: i as u64 + 1,
                bound: bound(y - x),
            })
            .max_by(|p, q| p.excess().total_cmp(&q.excess()));
        out.extend(best);
    }
    out
}

/// The window with the largest excess (the least headroom), if anything was admitted.
pub fn worst(admitted: &[Admitted], bound: impl Fn(f64) -> f64) -> Option<Window> {
    windows(admitted, bound)
        .into_iter()
        .max_by(|p, q| p.excess().total_cmp(&q.excess()))
}
