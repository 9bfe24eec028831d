//! The summary's numbers that come from a window of the recorder and from the poller's
//! server samples.

use std::collections::BTreeMap;

use crate::config::System;
use crate::plot::Series;
use crate::poller::{self, Sample};
use crate::report::{self, HarnessWait, OpSummary, RssSummary, ServerSummary};
use crate::stats::{Op, Window};

/// The client's view of one window.
pub struct ClientSide {
    pub ops: BTreeMap<String, OpSummary>,
    /// Completed lock cycles (successful releases) per second.
    pub lock_cycles_per_s: f64,
    pub measured_s: f64,
    pub cdf: Vec<Series>,
    pub harness_wait: HarnessWait,
}

pub fn client(win: &Window) -> ClientSide {
    ClientSide {
        ops: Op::ALL
            .iter()
            .map(|op| (op.name().to_string(), report::op_summary(win, *op)))
            .collect(),
        lock_cycles_per_s: win.op(Op::Release).ok as f64 / win.secs(),
        measured_s: win.secs(),
        cdf: report::cdf_series(win, ""),
        harness_wait: HarnessWait::of(win),
    }
}

/// The server's view of [from, to] seconds, from the poller's samples.
pub fn server(system: System, samples: &[Sample], from: f64, to: f64) -> ServerSummary {
    let secs = poller::covered(samples, from, to).max(1e-9);
    let sum = system == System::Fencegate;
    let commits = poller::growth(samples, from, to, poller::commits_of, sum);
    let applied = poller::growth(samples, from, to, poller::applied_of, false);
    let snapshots = samples
        .windows(2)
        .map(|w| poller::snapshots_taken(&w[0], &w[1]).count() as u64)
        .sum();
    let max_snap = |s: &Sample| s.snapshot_index.values().max().copied();
    let mut rss: BTreeMap<String, RssSummary> = BTreeMap::new();
    for s in samples {
        for (n, (cur, peak)) in &s.rss_mib {
            let e = rss.entry(format!("node{}", n + 1)).or_default();
            e.last = *cur;
            e.peak = e.peak.max(*peak);
            e.max_sampled = e.max_sampled.max(*cur);
        }
    }
    let last_leader = samples.iter().rev().find(|s| s.active_locks.is_some());
    ServerSummary {
        commits_per_s: commits / secs,
        log_entries_per_s: applied / secs,
        snapshots,
        snapshot_index_first: samples.iter().find_map(max_snap),
        snapshot_index_last: samples.iter().rev().find_map(max_snap),
        purged_index_last: samples
            .iter()
            .rev()
            .find_map(|s| s.purged_index.values().max().copied()),
        rss_mib: rss,
        active_locks_last: last_leader.and_then(|s| s.active_locks),
        resources_last: last_leader.and_then(|s| s.resources),
        dedup_records_last: last_leader.and_then(|s| s.dedup_records),
        last_token: last_leader.and_then(|s| s.last_token),
    }
}
