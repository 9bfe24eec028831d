//! Server-side view during a run, sampled every second: commit counters from `/metrics`,
//! snapshot / purge indexes and the leader from `/v1/cluster`, RSS of local processes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::cluster::process::{
    cpu_counters, disk_counters, rss_mib, write_bytes, CpuCounters, DiskCounters,
};
use crate::cluster::status::{self, READ_TIMEOUT};
use crate::config::System;
use crate::stats::Recorder;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    pub t_s: f64,
    /// Committed proposals (fencegate: `fencegate_raft_commit_seconds_count`, counted on the
    /// leader; etcd: `etcd_server_proposals_committed_total`) per node.
    pub commits: BTreeMap<usize, f64>,
    /// Applied log index per node (fencegate: `fencegate_raft_last_applied`; includes the
    /// leader's sweeper ticks and blank entries).
    pub applied: BTreeMap<usize, f64>,
    /// Syncs of the raft log to disk that took longer than [`SLOW_SYNC_MS`], so far, per node
    /// (fencegate: `fencegate_raft_log_sync_seconds`; etcd: its WAL's
    /// `etcd_disk_wal_fsync_duration_seconds`).
    pub slow_syncs: BTreeMap<usize, f64>,
    /// Syncs of the raft log so far, and the seconds they took together, per node (the same
    /// histograms).
    pub syncs: BTreeMap<usize, f64>,
    pub sync_seconds: BTreeMap<usize, f64>,
    pub snapshot_index: BTreeMap<usize, u64>,
    pub purged_index: BTreeMap<usize, u64>,
    pub leader: Option<u64>,
    /// (VmRSS, VmHWM) in MiB per node.
    pub rss_mib: BTreeMap<usize, (f64, f64)>,
    /// Bytes written to storage so far, per local node process.
    pub write_bytes: BTreeMap<usize, u64>,
    /// The machine's disk counters, to tell a slow second's disk from its CPU.
    pub disk: Option<DiskCounters>,
    /// The machine's CPU time, to tell a slow second the servers caused from one in which the
    /// hypervisor ran other guests on this one's CPUs.
    pub cpu: Option<CpuCounters>,
    pub active_locks: Option<u64>,
    pub resources: Option<u64>,
    pub dedup_records: Option<u64>,
    pub last_token: Option<u64>,
}

/// PIDs of local server processes by node index, shared with whoever stops and restarts
/// them.
#[derive(Clone, Default)]
pub struct Pids(Arc<Mutex<BTreeMap<usize, u32>>>);

impl Pids {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, u32>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn replace(&self, pids: BTreeMap<usize, u32>) {
        *self.lock() = pids;
    }

    /// Node `idx` is down (`None`) or runs as `pid`.
    pub fn set(&self, idx: usize, pid: Option<u32>) {
        match pid {
            Some(pid) => self.lock().insert(idx, pid),
            None => self.lock().remove(&idx),
        };
    }

    pub fn snapshot(&self) -> BTreeMap<usize, u32> {
        self.lock().clone()
    }
}

pub struct Poller {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Poller {
    pub fn start(
        system: System,
        bases: Vec<String>,
        pids: Pids,
        rec: Arc<Recorder>,
        every: Duration,
    ) -> Self {
        let (stop, mut rx) = watch::channel(false);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(900))
            .build()
            .unwrap_or_default();
        let task = tokio::spawn(async move {
            let mut samples: Vec<Sample> = Vec::new();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = rx.changed() => break,
                }
                let s = sample(system, &http, &bases, &pids, &rec).await;
                if let Some(prev) = samples.last() {
                    for (node, idx) in snapshots_taken(prev, &s) {
                        rec.event(format!("snapshot node {} @{idx}", node + 1));
                    }
                    if prev.leader.is_some() && s.leader.is_some() && prev.leader != s.leader {
                        rec.event(format!("leader is now node {}", s.leader.unwrap_or(0)));
                    }
                }
                samples.push(s);
            }
            // One last sample so rates cover the very end.
            samples.push(sample(system, &http, &bases, &pids, &rec).await);
            samples
        });
        Poller { stop, task }
    }

    pub async fn finish(self) -> Vec<Sample> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

async fn sample(
    system: System,
    http: &reqwest::Client,
    bases: &[String],
    pids: &Pids,
    rec: &Recorder,
) -> Sample {
    let mut s = Sample {
        t_s: rec.t0.elapsed().as_secs_f64(),
        ..Default::default()
    };
    let (commit_metric, applied_metric, sync_metric) = match system {
        System::Fencegate => (
            "fencegate_raft_commit_seconds_count",
            "fencegate_raft_last_applied",
            "fencegate_raft_log_sync_seconds",
        ),
        System::Etcd => (
            "etcd_server_proposals_committed_total",
            "etcd_server_proposals_applied_total",
            "etcd_disk_wal_fsync_duration_seconds",
        ),
    };
    for (i, b) in bases.iter().enumerate() {
        if let Ok(r) = http.get(format!("{b}/metrics")).send().await {
            if let Ok(text) = r.text().await {
                if let Some(v) = metric_value(&text, commit_metric) {
                    s.commits.insert(i, v);
                }
                if let Some(v) = metric_value(&text, applied_metric) {
                    s.applied.insert(i, v);
                }
                if let Some(v) = slow_syncs(&text, sync_metric) {
                    s.slow_syncs.insert(i, v);
                }
                if let (Some(n), Some(secs)) = (
                    metric_value(&text, &format!("{sync_metric}_count")),
                    metric_value(&text, &format!("{sync_metric}_sum")),
                ) {
                    s.syncs.insert(i, n);
                    s.sync_seconds.insert(i, secs);
                }
            }
        }
        if system == System::Fencegate {
            if let Ok(st) = status::fetch(http, b, READ_TIMEOUT).await {
                if let Some(x) = st.snapshot_index {
                    s.snapshot_index.insert(i, x);
                }
                if let Some(x) = st.purged_index {
                    s.purged_index.insert(i, x);
                }
                if st.is_leader() {
                    s.leader = Some(st.node_id);
                    s.active_locks = Some(st.locks.active_locks);
                    s.resources = Some(st.locks.resources);
                    s.dedup_records = Some(st.locks.dedup_records);
                    s.last_token = Some(st.locks.last_token);
                }
            }
        }
    }
    for (i, pid) in pids.snapshot() {
        if let Some(r) = rss_mib(pid) {
            s.rss_mib.insert(i, r);
        }
        if let Some(w) = write_bytes(pid) {
            s.write_bytes.insert(i, w);
        }
    }
    s.disk = disk_counters();
    s.cpu = cpu_counters();
    s
}

/// The share of the machine's CPU time, in %, that the hypervisor gave to something else in
/// each of the first `seconds` seconds of the run (second `i` is [i, i + 1) s after the
/// start): the highest share over the sample intervals that overlap it, `None` where no
/// interval does.
pub fn steal_by_second(samples: &[Sample], seconds: usize) -> Vec<Option<f64>> {
    let mut out = vec![None; seconds];
    for w in samples.windows(2) {
        let (Some(a), Some(b)) = (w[0].cpu, w[1].cpu) else {
            continue;
        };
        let total = b.total.saturating_sub(a.total);
        if total == 0 {
            continue;
        }
        let pct = 100.0 * b.steal.saturating_sub(a.steal) as f64 / total as f64;
        let first = w[0].t_s.max(0.0) as usize;
        let last = (w[1].t_s.max(0.0) as usize).min(seconds.saturating_sub(1));
        for slot in out.iter_mut().take(last + 1).skip(first) {
            *slot = Some(slot.map_or(pct, |p: f64| p.max(pct)));
        }
    }
    out
}

/// The snapshots nodes took between two samples: (node index, snapshot index). A node's
/// first snapshot shows as none -> some (unless the node was down at `prev`).
pub fn snapshots_taken<'a>(
    prev: &'a Sample,
    cur: &'a Sample,
) -> impl Iterator<Item = (usize, u64)> + 'a {
    cur.snapshot_index.iter().filter_map(move |(node, idx)| {
        let was = prev.snapshot_index.get(node);
        (was != Some(idx) && (was.is_some() || prev.commits.contains_key(node)))
            .then_some((*node, *idx))
    })
}

/// The value of an unlabelled-or-single-series metric in Prometheus text format (summed if
/// several series share the name).
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// A sync of the log slower than this, in ms, counts as slow: at a commit bound of 10 ms one
/// such sync alone puts the commands waiting on it over the bound. Both systems' histograms
/// have a bucket boundary here ([`SYNC_BUCKET_LE`]).
pub const SLOW_SYNC_MS: f64 = 8.0;
const SYNC_BUCKET_LE: &str = "le=\"0.008\"";

/// How many observations of the histogram `name` are above [`SLOW_SYNC_MS`]: its count minus
/// its bucket at that bound. `None` if the text lacks either.
fn slow_syncs(text: &str, name: &str) -> Option<f64> {
    let count = metric_value(text, &format!("{name}_count"))?;
    let bucket = format!("{name}_bucket{{");
    let within = text
        .lines()
        .filter(|l| l.starts_with(&bucket) && l.contains(SYNC_BUCKET_LE))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)?;
    Some((count - within).max(0.0))
}

/// A counter's growth in each of the first `seconds` seconds of the run: between consecutive
/// samples, each node's growth (a restarted node's counter starts again at zero), summed or
/// taken at its highest across nodes as for [`growth`], counted in the second the later
/// sample was taken in. A second stays `None` when no node reported the counter around it.
pub fn counter_by_second(
    samples: &[Sample],
    seconds: usize,
    pick: fn(&Sample) -> &BTreeMap<usize, f64>,
    sum: bool,
) -> Vec<Option<f64>> {
    let mut out = vec![None; seconds];
    for w in samples.windows(2) {
        let deltas: Vec<f64> = pick(&w[1])
            .iter()
            .filter_map(|(node, b)| {
                let a = pick(&w[0]).get(node)?;
                Some(if b >= a { b - a } else { *b })
            })
            .collect();
        // No node reported the counter in both samples: nothing is known of that interval.
        if deltas.is_empty() {
            continue;
        }
        let delta = if sum {
            deltas.iter().sum()
        } else {
            deltas.iter().copied().fold(0.0, f64::max)
        };
        if let Some(slot) = out.get_mut(w[1].t_s.max(0.0) as usize) {
            *slot = Some(slot.unwrap_or(0.0) + delta);
        }
    }
    out
}

/// Counter growth over [from, to] seconds: per node, the sum of positive deltas between
/// consecutive samples (a restarted node's counter starts again at zero); across nodes
/// `sum` (fencegate counts commits on the leader only) or `max` (etcd: every member reports
/// the same committed index).
pub fn growth(
    samples: &[Sample],
    from: f64,
    to: f64,
    pick: fn(&Sample) -> &BTreeMap<usize, f64>,
    sum: bool,
) -> f64 {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t_s >= from - 0.5 && s.t_s <= to + 0.5)
        .collect();
    let mut per_node: BTreeMap<usize, f64> = BTreeMap::new();
    for w in inside.windows(2) {
        for (node, v) in pick(w[1]) {
            if let Some(p) = pick(w[0]).get(node) {
                *per_node.entry(*node).or_default() += if v >= p { v - p } else { *v };
            }
        }
    }
    if sum {
        per_node.values().sum()
    } else {
        per_node.values().cloned().fold(0.0, f64::max)
    }
}

/// Seconds actually covered by the samples used for `growth` over [from, to].
pub fn covered(samples: &[Sample], from: f64, to: f64) -> f64 {
    let inside: Vec<f64> = samples
        .iter()
        .filter(|s| s.t_s >= from - 0.5 && s.t_s <= to + 0.5)
        .map(|s| s.t_s)
        .collect();
    match (inside.first(), inside.last()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => 0.0,
    }
}

pub fn commits_of(s: &Sample) -> &BTreeMap<usize, f64> {
    &s.commits
}

pub fn applied_of(s: &Sample) -> &BTreeMap<usize, f64> {
    &s.applied
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prometheus_text() {
        let t = "# HELP x\nfencegate_raft_commit_seconds_count{node=\"1\"} 42\nfencegate_raft_commit_seconds_sum{node=\"1\"} 0.5\nfoo 1\n";
        assert_eq!(
            metric_value(t, "fencegate_raft_commit_seconds_count"),
            Some(42.0)
        );
        assert_eq!(metric_value(t, "foo"), Some(1.0));
        assert_eq!(metric_value(t, "fo"), None);
    }

    #[test]
    fn slow_syncs_are_the_count_above_the_8_ms_bucket() {
        let fencegate = "\
# TYPE fencegate_raft_log_sync_seconds histogram
fencegate_raft_log_sync_seconds_bucket{node=\"2\",le=\"0.004\"} 950
fencegate_raft_log_sync_seconds_bucket{node=\"2\",le=\"0.008\"} 990
fencegate_raft_log_sync_seconds_bucket{node=\"2\",le=\"0.016\"} 997
fencegate_raft_log_sync_seconds_bucket{node=\"2\",le=\"+Inf\"} 1000
fencegate_raft_log_sync_seconds_sum{node=\"2\"} 0.9
fencegate_raft_log_sync_seconds_count{node=\"2\"} 1000
";
        let name = "fencegate_raft_log_sync_seconds";
        assert_eq!(slow_syncs(fencegate, name), Some(10.0));
        // etcd's WAL histogram has no node label and more buckets.
        let etcd = "\
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.004\"} 70
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.008\"} 75
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"+Inf\"} 77
etcd_disk_wal_fsync_duration_seconds_count 77
";
        let name = "etcd_disk_wal_fsync_duration_seconds";
        assert_eq!(slow_syncs(etcd, name), Some(2.0));
        // A server without the histogram (an older fencegate) reports nothing.
        assert_eq!(slow_syncs("foo 1\n", name), None);
    }

    #[test]
    fn growth_survives_restarts() {
        let mk = |t: f64, v: f64| Sample {
            t_s: t,
            commits: [(0usize, v)].into(),
            ..Default::default()
        };
        // 0 -> 100, restart (counter back to 0), 0 -> 50.
        let s = vec![mk(0.0, 0.0), mk(1.0, 100.0), mk(2.0, 0.0), mk(3.0, 50.0)];
        assert_eq!(growth(&s, 0.0, 3.0, commits_of, true), 150.0);
    }

    #[test]
    fn steal_is_spread_over_the_seconds_its_interval_overlaps() {
        let mk = |t: f64, total: u64, steal: u64| Sample {
            t_s: t,
            cpu: Some(CpuCounters { total, steal }),
            ..Default::default()
        };
        // [0.1, 1.1]: 2 % stolen; [1.1, 2.6]: 30 %; [2.6, 3.1]: none; no samples after 3.1.
        let s = vec![
            mk(0.1, 0, 0),
            mk(1.1, 200, 4),
            mk(2.6, 500, 94),
            mk(3.1, 600, 94),
        ];
        let steal = steal_by_second(&s, 5);
        assert_eq!(
            steal,
            vec![Some(2.0), Some(30.0), Some(30.0), Some(0.0), None]
        );
    }

    #[test]
    fn commits_land_in_the_second_of_the_later_sample() {
        let mk = |t: f64, c: &[(usize, f64)]| Sample {
            t_s: t,
            commits: c.iter().copied().collect(),
            ..Default::default()
        };
        // Node 0 commits 100 then restarts (counter back to 0) and commits 30; node 1 starts
        // reporting late.
        let s = vec![
            mk(0.2, &[(0, 0.0)]),
            mk(1.2, &[(0, 100.0)]),
            mk(2.2, &[(0, 0.0), (1, 5.0)]),
            mk(2.9, &[(0, 30.0), (1, 15.0)]),
        ];
        assert_eq!(
            counter_by_second(&s, 4, commits_of, true),
            vec![None, Some(100.0), Some(40.0), None]
        );
        assert_eq!(
            counter_by_second(&s, 4, commits_of, false),
            vec![None, Some(100.0), Some(30.0), None]
        );
        // Servers that do not report a counter (an older build without the sync histogram)
        // leave every second unknown rather than zero.
        assert_eq!(counter_by_second(&s, 4, |s| &s.slow_syncs, true), [None; 4]);
    }
}
