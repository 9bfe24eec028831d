//! What a run records: per-operation HDR histograms over measurement windows, errors by code,
//! a per-second timeline and fault events.
//!
//! Latency is measured from an operation's *intended* start (its slot in the open-loop
//! schedule), not from when the request was sent, so a slow server cannot hide its slowness
//! by delaying our arrivals (coordinated omission).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Acquire,
    Renew,
    Release,
    Write,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Acquire, Op::Renew, Op::Release, Op::Write];
    /// The operations that are state commits on the lock service.
    pub const LOCK_OPS: [Op; 3] = [Op::Acquire, Op::Renew, Op::Release];

    pub fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
            Op::Write => "write",
        }
    }

    fn idx(self) -> usize {
        self as usize
    }
}

/// Latencies in microseconds, 1 µs .. 10 min, 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// One second's latencies (two significant digits; the acquires' are kept for the whole run):
/// grows only as far as the second's slowest operation, so a quiet second stays a few KiB.
fn new_second_hist() -> Histogram<u32> {
    Histogram::new(2).expect("valid histogram precision")
}

/// How one operation ended, as seen by the client after its retries.
#[derive(Clone, Debug)]
pub enum Outcome {
    Ok,
    /// A definite refusal that is part of the workload (lock_held on a contended acquire).
    Conflict(String),
    /// Anything else: the final error code.
    Failed(String),
}

/// Per-operation totals over a window.
pub struct OpStats {
    pub hist: Histogram<u64>,
    pub ok: u64,
    pub conflicts: u64,
    pub failed: u64,
    /// Every failed attempt, retried or not, by error code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Final outcomes other than success, by code.
    pub final_by_code: BTreeMap<String, u64>,
}

impl OpStats {
    fn new() -> Self {
        OpStats {
            hist: new_hist(),
            ok: 0,
            conflicts: 0,
            failed: 0,
            errors_by_code: BTreeMap::new(),
            final_by_code: BTreeMap::new(),
        }
    }
}

/// A measurement window: ops whose intended start falls in [start, end).
pub struct Window {
    pub start: Duration,
    pub end: Duration,
    pub ops: [OpStats; 4],
    /// All lock operations together (for the ramp's bound).
    pub all: Histogram<u64>,
    /// How long lock operations waited in the harness before their first request went out
    /// (for a free connection, or for the harness's own threads): the part of the latency
    /// that is the client's, not the server's.
    pub harness_wait: Histogram<u64>,
    /// The part of `harness_wait` spent waiting for a free connection.
    pub connection_wait: Histogram<u64>,
    /// Operations started in the window and not finished yet.
    pub in_flight: u64,
}

impl Window {
    pub fn new(start: Duration, end: Duration) -> Self {
        Window {
            start,
            end,
            ops: [
                OpStats::new(),
                OpStats::new(),
                OpStats::new(),
                OpStats::new(),
            ],
            all: new_hist(),
            harness_wait: new_hist(),
            connection_wait: new_hist(),
            in_flight: 0,
        }
    }

    pub fn op(&self, op: Op) -> &OpStats {
        &self.ops[op.idx()]
    }

    fn contains(&self, t: Duration) -> bool {
        t >= self.start && t < self.end
    }

    pub fn secs(&self) -> f64 {
        self.end.saturating_sub(self.start).as_secs_f64()
    }
}

/// One second of the timeline (by completion time).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Second {
    pub t: u64,
    /// Successful operations per op, in Op order.
    pub ok: [u64; 4],
    pub errors: u64,
    /// p99 in ms per op (0 when no sample).
    pub p99_ms: [f64; 4],
    /// Server-side commits in this second (filled in from the metrics poller).
    pub server_commits: Option<f64>,
    /// The share of the machine's CPU, in %, that the hypervisor gave to something else in
    /// this second (filled in from the poller's samples).
    pub steal_pct: Option<f64>,
    /// Syncs of the servers' logs to disk that finished in this second and took longer than
    /// 8 ms, summed over the nodes (filled in from the poller's samples).
    pub slow_syncs: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Event {
    pub t_s: f64,
    pub what: String,
}

struct Inner {
    windows: Vec<Window>,
    cur_sec: u64,
    cur_hist: [Histogram<u32>; 4],
    cur: Second,
    timeline: Vec<Second>,
    /// Every closed second's acquire latencies, to set the seconds a hypervisor took CPU in
    /// apart from the others once the poller has seen which ones those were.
    acquire_seconds: Vec<Histogram<u32>>,
    events: Vec<Event>,
    /// Completion times of successful ops started after a fault (for recovery time).
    first_ok_after: Vec<(Duration, Option<Duration>)>,
}

/// Thread-safe recorder shared by every load task.
pub struct Recorder {
    pub t0: Instant,
    inner: Mutex<Inner>,
}

impl Recorder {
    pub fn new(t0: Instant) -> Self {
        Recorder {
            t0,
            inner: Mutex::new(Inner {
                windows: Vec::new(),
                cur_sec: 0,
                cur_hist: [
                    new_second_hist(),
                    new_second_hist(),
                    new_second_hist(),
                    new_second_hist(),
                ],
                cur: Second::default(),
                timeline: Vec::new(),
                acquire_seconds: Vec::new(),
                events: Vec::new(),
                first_ok_after: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn add_window(&self, w: Window) -> usize {
        let mut g = self.lock();
        g.windows.push(w);
        g.windows.len() - 1
    }

    pub fn event(&self, what: impl Into<String>) -> f64 {
        let t_s = self.t0.elapsed().as_secs_f64();
        let what = what.into();
        self.lock().events.push(Event { t_s, what });
        t_s
    }

    /// Starts tracking the first success of an op intended after now; returns its slot.
    pub fn watch_recovery(&self) -> usize {
        let now = self.t0.elapsed();
        let mut g = self.lock();
        g.first_ok_after.push((now, None));
        g.first_ok_after.len() - 1
    }

    pub fn recovery(&self, slot: usize) -> Option<(Duration, Duration)> {
        let g = self.lock();
        g.first_ok_after
            .get(slot)
            .and_then(|(from, at)| at.map(|a| (*from, a)))
    }

    /// Marks an operation as started (for the windows' in-flight counts).
    pub fn begin(&self, intended: Instant) {
        let t = intended.saturating_duration_since(self.t0);
        let mut g = self.lock();
        for w in g.windows.iter_mut().filter(|w| w.contains(t)) {
            w.in_flight += 1;
        }
    }

    /// Records a finished operation. `intended` is its slot in the schedule, `sent` when its
    /// first request went out and how long that waited for a connection; `errors` are the
    /// codes of every failed attempt.
    pub fn finish(
        &self,
        op: Op,
        intended: Instant,
        sent: (Instant, Duration),
        outcome: &Outcome,
        errors: &[String],
    ) {
        let now = Instant::now();
        let us = |d: Duration| d.as_micros().max(1) as u64;
        let latency_us = us(now.saturating_duration_since(intended));
        let wait_us = us(sent.0.saturating_duration_since(intended));
        let connection_us = us(sent.1);
        let t_int = intended.saturating_duration_since(self.t0);
        let t_done = now.saturating_duration_since(self.t0);
        let mut g = self.lock();
        let g = &mut *g;
        for w in g.windows.iter_mut().filter(|w| w.contains(t_int)) {
            w.in_flight = w.in_flight.saturating_sub(1);
            if op != Op::Write {
                let _ = w.harness_wait.record(wait_us);
                let _ = w.connection_wait.record(connection_us);
            }
            let s = &mut w.ops[op.idx()];
            for e in errors {
                *s.errors_by_code.entry(e.clone()).or_default() += 1;
            }
            match outcome {
                Outcome::Ok => {
                    s.ok += 1;
                    let _ = s.hist.record(latency_us);
                    if op != Op::Write {
                        let _ = w.all.record(latency_us);
                    }
                }
                Outcome::Conflict(code) => {
                    s.conflicts += 1;
                    *s.final_by_code.entry(code.clone()).or_default() += 1;
                }
                Outcome::Failed(code) => {
                    s.failed += 1;
                    *s.final_by_code.entry(code.clone()).or_default() += 1;
                }
            }
        }
        if matches!(outcome, Outcome::Ok) && op != Op::Write {
            for (from, at) in g.first_ok_after.iter_mut() {
                if at.is_none() && t_int >= *from {
                    *at = Some(t_done);
                }
            }
        }
        // Timeline by completion second.
        let sec = t_done.as_secs();
        while sec > g.cur_sec {
            Self::close_second(g);
        }
        match outcome {
            Outcome::Ok => {
                g.cur.ok[op.idx()] += 1;
                let _ = g.cur_hist[op.idx()].record(latency_us);
            }
            Outcome::Conflict(_) => {}
            Outcome::Failed(_) => g.cur.errors += 1,
        }
        if !errors.is_empty() && matches!(outcome, Outcome::Ok) {
            g.cur.errors += errors.len() as u64;
        }
    }

    fn close_second(g: &mut Inner) {
        let mut s = std::mem::take(&mut g.cur);
        s.t = g.cur_sec;
        for (i, h) in g.cur_hist.iter_mut().enumerate() {
            if !h.is_empty() {
                s.p99_ms[i] = h.value_at_quantile(0.99) as f64 / 1000.0;
            }
            if i == Op::Acquire.idx() {
                g.acquire_seconds
                    .push(std::mem::replace(h, new_second_hist()));
            } else {
                h.reset();
            }
        }
        g.timeline.push(s);
        g.cur_sec += 1;
    }

    /// Runs `f` on a window (e.g. to summarize it).
    pub fn with_window<R>(&self, idx: usize, f: impl FnOnce(&Window) -> R) -> R {
        let g = self.lock();
        f(&g.windows[idx])
    }

    /// Ends a window early (a ramp that stopped).
    pub fn set_window_end(&self, idx: usize, end: Duration) {
        let mut g = self.lock();
        let w = &mut g.windows[idx];
        w.end = end.max(w.start + Duration::from_millis(1));
    }

    pub fn in_flight(&self, idx: usize) -> u64 {
        self.lock().windows[idx].in_flight
    }

    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// The acquire latencies of the closed seconds `[from, to)` whose `keep` is true, merged.
    pub fn acquires_in_seconds(
        &self,
        from: u64,
        to: u64,
        keep: impl Fn(u64) -> bool,
    ) -> Histogram<u32> {
        let g = self.lock();
        let mut merged = new_second_hist();
        for (t, h) in g.acquire_seconds.iter().enumerate() {
            let t = t as u64;
            if (from..to).contains(&t) && keep(t) {
                let _ = merged.add(h);
            }
        }
        merged
    }

    /// The timeline up to now (the current second closed).
    pub fn timeline(&self) -> Vec<Second> {
        let mut g = self.lock();
        let now = self.t0.elapsed().as_secs();
        while now > g.cur_sec {
            Self::close_second(&mut g);
        }
        g.timeline.clone()
    }
}

/// p50/p95/p99/max of a histogram in ms.
pub fn quantiles_ms<T: hdrhistogram::Counter>(h: &Histogram<T>) -> [f64; 4] {
    if h.is_empty() {
        return [0.0; 4];
    }
    [
        h.value_at_quantile(0.50) as f64 / 1000.0,
        h.value_at_quantile(0.95) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0,
    ]
}

/// The CDF of a histogram as (quantile, latency ms) points for plotting.
pub fn cdf_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut pts = Vec::new();
    for q in [
        0.0, 0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999, 0.9995, 0.9999,
        0.99999, 1.0,
    ] {
        let v = if q >= 1.0 {
            h.max()
        } else {
            h.value_at_quantile(q)
        };
        pts.push((q, v as f64 / 1000.0));
    }
    pts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_counts_from_intended_start() {
        let t0 = Instant::now();
        let r = Recorder::new(t0);
        let w = r.add_window(Window::new(Duration::ZERO, Duration::from_secs(60)));
        // An op that was due 50 ms ago and finishes now took >= 50 ms, however fast the
        // request itself was.
        let intended = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let sent = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        r.begin(intended);
        r.finish(
            Op::Acquire,
            intended,
            (sent, Duration::from_millis(10)),
            &Outcome::Ok,
            &["no_quorum".into()],
        );
        r.with_window(w, |w| {
            let s = w.op(Op::Acquire);
            assert_eq!(s.ok, 1);
            assert!(s.hist.min() >= 50_000);
            // Of those, the 30 ms before the request went out were spent in the harness.
            let waited = w.harness_wait.max();
            assert!(waited >= 30_000 && waited < s.hist.min(), "{waited}");
            assert_eq!(w.connection_wait.max() / 1_000, 10);
            assert_eq!(s.errors_by_code.get("no_quorum"), Some(&1));
            assert_eq!(w.in_flight, 0);
        });
    }
}
