//! The metrics time series behind the admin UI's charts: once a second the node turns its own
//! Prometheus metrics into one sample (latency quantiles of the calls finished in that second,
//! commits per second, active locks, waiters, fencing decisions) and keeps the last ten
//! minutes, so the page has a history without a Prometheus server.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::proto::MetricFamily;

use crate::node::Node;
use crate::wire::{MetricsSample, Quantiles};

const EVERY: Duration = Duration::from_secs(1);
const KEEP: usize = 600;
/// The operations charted (the lock calls whose latency an operator watches).
const OPS: &[&str] = &["acquire", "renew", "release"];
const OP_SECONDS: &str = "fencegate_op_seconds";
const FENCE_DECISIONS: &str = "fencegate_proxy_fence_decisions_total";

#[derive(Default)]
pub struct Series {
    samples: Mutex<VecDeque<MetricsSample>>,
}

impl Series {
    /// Samples taken after `since_ms` (all kept ones for 0), oldest first.
    pub fn since(&self, since_ms: u64) -> Vec<MetricsSample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .filter(|s| s.at_ms > since_ms)
            .cloned()
            .collect()
    }

    fn push(&self, sample: MetricsSample) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() == KEEP {
            samples.pop_front();
        }
        samples.push_back(sample);
    }
}

/// Cumulative counters as of one gather, to diff against the next.
#[derive(Default)]
struct Totals {
    /// op -> cumulative bucket counts (upper bound in s, count) and the total count.
    buckets: BTreeMap<String, (Vec<(f64, u64)>, u64)>,
    fence: BTreeMap<String, u64>,
    applied: u64,
}

pub(in crate::node) async fn run(node: Arc<Node>) {
    let mut interval = tokio::time::interval(EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut prev: Option<(Instant, Totals)> = None;
    loop {
        interval.tick().await;
        let now = Instant::now();
        let totals = totals(&node);
        if let Some((then, before)) = &prev {
            let secs = now.duration_since(*then).as_secs_f64().max(0.001);
            node.ops.series.push(sample(&node, before, &totals, secs));
        }
        prev = Some((now, totals));
    }
}

fn totals(node: &Node) -> Totals {
    let mut t = Totals {
        applied: node
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map_or(0, |l| l.index),
        ..Totals::default()
    };
    for family in node.metrics.registry.gather() {
        read_family(&family, &mut t);
    }
    t
}

fn label<'a>(m: &'a prometheus::proto::Metric, name: &str) -> &'a str {
    m.get_label()
        .iter()
        .find(|l| l.name() == name)
        .map_or("", |l| l.value())
}

fn read_family(family: &MetricFamily, t: &mut Totals) {
    match family.name() {
        OP_SECONDS => {
            for m in family.get_metric() {
                let op = label(m, "op");
                if !OPS.contains(&op) {
                    continue;
                }
                let h = m.get_histogram();
                let buckets = h
                    .get_bucket()
                    .iter()
                    .map(|b| (b.upper_bound(), b.cumulative_count()))
                    .collect();
                t.buckets
                    .insert(op.to_string(), (buckets, h.get_sample_count()));
            }
        }
        FENCE_DECISIONS => {
            for m in family.get_metric() {
                let key = format!("{}/{}", label(m, "outcome"), label(m, "reason"));
                t.fence.insert(key, m.get_counter().get_value() as u64);
            }
        }
        _ => {}
    }
}

fn sample(node: &Node, before: &Totals, now: &Totals, secs: f64) -> MetricsSample {
    let latency = OPS
        .iter()
        .map(|op| {
            let q = match (before.buckets.get(*op), now.buckets.get(*op)) {
                (Some(b), Some(n)) => quantiles(b, n),
                (None, Some(n)) => quantiles(&(Vec::new(), 0), n),
                _ => Quantiles::default(),
            };
            (op.to_string(), q)
        })
        .collect();
    let fence = now
        .fence
        .iter()
        .map(|(k, v)| (k.clone(), v - before.fence.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let stats = node.machine.read(|m| m.stats());
    let m = node.raft.metrics().borrow().clone();
    MetricsSample {
        at_ms: node.wall_ms(),
        latency,
        commits_per_s: now.applied.saturating_sub(before.applied) as f64 / secs,
        active_locks: stats.active_locks,
        waiters: stats.waiters,
        fence,
        leader_id: m.current_leader,
        term: m.current_term,
    }
}

/// Quantiles of the observations between two cumulative histograms, each taken as the upper
/// bound of the bucket it falls in (the largest bound when it is beyond them all).
fn quantiles(before: &(Vec<(f64, u64)>, u64), now: &(Vec<(f64, u64)>, u64)) -> Quantiles {
    let count = now.1.saturating_sub(before.1);
    if count == 0 {
        return Quantiles::default();
    }
    let delta: Vec<(f64, u64)> = now
        .0
        .iter()
        .map(|(bound, c)| {
            let was = before
                .0
                .iter()
                .find(|(b, _)| b == bound)
                .map_or(0, |(_, c)| *c);
            (*bound, c.saturating_sub(was))
        })
        .collect();
    let at = |q: f64| {
        let want = (q * count as f64).ceil() as u64;
        delta
            .iter()
            .find(|(_, c)| *c >= want)
            .or(delta.last())
            .map_or(0.0, |(bound, _)| bound * 1000.0)
    };
    Quantiles {
        count,
        p50_ms: at(0.50),
        p95_ms: at(0.95),
        p99_ms: at(0.99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_difference_of_two_histograms() {
        let before = (vec![(0.001, 10), (0.01, 10), (0.1, 10)], 10);
        // 100 new: 90 under 1 ms, 8 under 10 ms, 1 under 100 ms, 1 beyond.
        let now = (vec![(0.001, 100), (0.01, 108), (0.1, 109)], 110);
        let q = quantiles(&before, &now);
        assert_eq!(q.count, 100);
        assert_eq!(q.p50_ms, 1.0);
        assert_eq!(q.p95_ms, 10.0);
        assert_eq!(q.p99_ms, 100.0);
        assert_eq!(quantiles(&now, &now), Quantiles::default());
    }
}
