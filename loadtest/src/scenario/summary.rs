//! The summary's numbers that come from a window of the recorder and from the poller's
//! server samples.

use std::collections::BTreeMap;

use crate::config::System;
use crate::plot::Series;
use crate::poller::{self, Sample};
use crate::report::{
    self, HarnessWait, OpSummary, RssSummary, ServerSummary, SlowSyncSummary, StealSummary,
};
use crate::stats::{self, Op, Recorder, Second, Window};

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

/// A second with more than this share of the CPU, in %, taken by the hypervisor (or the
/// second after one) counts as stolen. Quiet seconds on this project's VMs show 0–1 %.
const STEAL_THRESHOLD_PCT: f64 = 2.0;

/// Fills in each second's steal share and splits the measured seconds `[from, to)` by it;
/// `None` where the machine reports no steal figures.
pub fn steal(
    samples: &[Sample],
    rec: &Recorder,
    timeline: &mut [Second],
    from: f64,
    to: f64,
) -> Option<StealSummary> {
    let per_second = poller::steal_by_second(samples, timeline.len());
    for (sec, pct) in timeline.iter_mut().zip(&per_second) {
        sec.steal_pct = *pct;
    }
    let pct = |t: u64| per_second.get(t as usize).copied().flatten();
    let (from, to) = (from.ceil() as u64, to.floor() as u64);
    let measured: Vec<(u64, f64)> = (from..to).filter_map(|t| Some((t, pct(t)?))).collect();
    if measured.is_empty() {
        return None;
    }
    let stolen = |t: u64| or_after(t, |t| over_threshold(pct(t)));
    let quiet = rec.acquires_in_seconds(from, to, |t| pct(t).is_some() && !stolen(t));
    let taken = rec.acquires_in_seconds(from, to, |t| pct(t).is_some() && stolen(t));
    let (quiet_p50, quiet_p99) = p50_p99(&quiet);
    let (taken_p50, taken_p99) = p50_p99(&taken);
    Some(StealSummary {
        threshold_pct: STEAL_THRESHOLD_PCT,
        mean_pct: measured.iter().map(|(_, p)| p).sum::<f64>() / measured.len() as f64,
        seconds: measured.len() as u64,
        stolen_seconds: measured.iter().filter(|(t, _)| stolen(*t)).count() as u64,
        quiet_acquires: quiet.len(),
        quiet_acquire_p50_ms: quiet_p50,
        quiet_acquire_p99_ms: quiet_p99,
        stolen_acquires: taken.len(),
        stolen_acquire_p50_ms: taken_p50,
        stolen_acquire_p99_ms: taken_p99,
    })
}

/// Splits the measured seconds `[from, to)` by whether a server's log sync took longer than
/// [`poller::SLOW_SYNC_MS`] in them; the calm part is what is left once the stolen seconds
/// (see [`steal`], which fills in the timeline's steal first) are set apart too. `None` where
/// the servers report no sync times.
pub fn slow_syncs(
    rec: &Recorder,
    samples: &[Sample],
    timeline: &[Second],
    from: f64,
    to: f64,
) -> Option<SlowSyncSummary> {
    let sec = |t: u64| timeline.get(t as usize);
    let (from, to) = (from.ceil() as u64, to.floor() as u64);
    let has_figure = |t: u64| sec(t).is_some_and(|s| s.slow_syncs.is_some());
    let measured: Vec<u64> = (from..to).filter(|t| has_figure(*t)).collect();
    if measured.is_empty() {
        return None;
    }
    let slow = |t: u64| sec(t).and_then(|s| s.slow_syncs).unwrap_or(0.0);
    let slowed = |t: u64| or_after(t, |t| slow(t) > 0.0);
    let stolen = |t: u64| or_after(t, |t| over_threshold(sec(t).and_then(|s| s.steal_pct)));
    let disturbed = |t: u64| slowed(t) || stolen(t);
    let calm = rec.acquires_in_seconds(from, to, |t| has_figure(t) && !disturbed(t));
    let (calm_p50, calm_p99) = p50_p99(&calm);
    let (float_from, float_to) = (from as f64, to as f64);
    let syncs = poller::growth(samples, float_from, float_to, |s| &s.syncs, true);
    let sync_seconds = poller::growth(samples, float_from, float_to, |s| &s.sync_seconds, true);
    Some(SlowSyncSummary {
        threshold_ms: poller::SLOW_SYNC_MS,
        syncs: syncs as u64,
        mean_sync_ms: (syncs > 0.0).then(|| 1000.0 * sync_seconds / syncs),
        slow_syncs: measured.iter().map(|t| slow(*t)).sum::<f64>() as u64,
        seconds: measured.len() as u64,
        slowed_seconds: measured.iter().filter(|t| slowed(**t)).count() as u64,
        calm_seconds: measured.iter().filter(|t| !disturbed(**t)).count() as u64,
        calm_acquires: calm.len(),
        calm_acquire_p50_ms: calm_p50,
        calm_acquire_p99_ms: calm_p99,
    })
}

/// Whether a second's steal share counts as stolen.
fn over_threshold(steal_pct: Option<f64>) -> bool {
    steal_pct.is_some_and(|p| p > STEAL_THRESHOLD_PCT)
}

/// Whether `hit` holds for second `t` or the one before it: a disturbed second leaves a queue
/// that drains in the next.
fn or_after(t: u64, hit: impl Fn(u64) -> bool) -> bool {
    hit(t) || (t > 0 && hit(t - 1))
}

/// p50 and p99 of a part, none when no acquire finished in it.
fn p50_p99(h: &hdrhistogram::Histogram<u32>) -> (Option<f64>, Option<f64>) {
    let [p50, _, p99, _] = stats::quantiles_ms(h);
    if h.is_empty() {
        (None, None)
    } else {
        (Some(p50), Some(p99))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::cluster::process::CpuCounters;
    use crate::stats::Outcome;

    /// A recorder with three acquires of >= 20 ms finished in second 5 and that second closed
    /// (its clock waits into second 6), and samples a second apart in which the hypervisor
    /// took `steal[i]` % of second `i`.
    fn run_with(steal: &[u64]) -> (Recorder, Vec<Sample>, Vec<Second>) {
        let rec = Recorder::new(Instant::now() - Duration::from_millis(5_400));
        for _ in 0..3 {
            let intended = Instant::now() - Duration::from_millis(20);
            rec.finish(
                Op::Acquire,
                intended,
                (intended, Duration::ZERO),
                &Outcome::Ok,
                &[],
            );
        }
        let mut cpu = CpuCounters::default();
        let mut samples = vec![Sample {
            t_s: 0.0,
            cpu: Some(cpu),
            ..Default::default()
        }];
        for (i, pct) in steal.iter().enumerate() {
            cpu.total += 100;
            cpu.steal += pct;
            samples.push(Sample {
                t_s: i as f64 + 0.99,
                cpu: Some(cpu),
                ..Default::default()
            });
        }
        std::thread::sleep(Duration::from_millis(700));
        let timeline = rec.timeline();
        (rec, samples, timeline)
    }

    #[test]
    fn seconds_with_steal_and_the_one_after_are_set_apart() {
        // Nothing taken: every acquire is in the quiet part.
        let (rec, samples, mut timeline) = run_with(&[0, 0, 0, 0, 0, 0]);
        let s = steal(&samples, &rec, &mut timeline, 0.0, 6.0).expect("steal figures");
        assert_eq!((s.seconds, s.stolen_seconds), (6, 0));
        assert_eq!((s.quiet_acquires, s.stolen_acquires), (3, 0));
        assert!(s.quiet_acquire_p99_ms >= Some(20.0), "{s:?}");
        assert_eq!(s.stolen_acquire_p99_ms, None);
        assert_eq!(
            s.quiet_part().split(" in the other 6 s ").count(),
            2,
            "{s:?}"
        );

        // 30 % taken in the sample interval [3.99, 4.99] s: the two seconds it overlaps and
        // the one after count as stolen, and the acquires that finished in second 5 with them.
        let (rec, samples, mut timeline) = run_with(&[0, 0, 0, 0, 30, 0]);
        let s = steal(&samples, &rec, &mut timeline, 0.0, 6.0).expect("steal figures");
        assert_eq!((s.seconds, s.stolen_seconds), (6, 3));
        assert_eq!((s.quiet_acquires, s.stolen_acquires), (0, 3));
        assert!(s.stolen_acquire_p99_ms >= Some(20.0), "{s:?}");
        assert_eq!(s.quiet_acquire_p99_ms, None);
        assert_eq!(s.quiet_part(), "no acquire finished in the other 3 s");
        assert!((s.mean_pct - 10.0).abs() < 1e-9, "{}", s.mean_pct);
        let by_second: Vec<_> = timeline.iter().map(|sec| sec.steal_pct).collect();
        let (quiet, taken) = (Some(0.0), Some(30.0));
        assert_eq!(by_second, vec![quiet, quiet, quiet, taken, taken, quiet]);
    }

    #[test]
    fn seconds_with_a_slow_sync_or_steal_are_not_calm() {
        let with_syncs = |timeline: &mut [Second], slow: &[f64]| {
            for (sec, n) in timeline.iter_mut().zip(slow) {
                sec.slow_syncs = Some(*n);
            }
        };
        // No slow sync, no steal: every second is calm, with the three acquires of second 5.
        let (rec, samples, mut timeline) = run_with(&[0, 0, 0, 0, 0, 0]);
        steal(&samples, &rec, &mut timeline, 0.0, 6.0);
        with_syncs(&mut timeline, &[0.0; 6]);
        let d = slow_syncs(&rec, &[], &timeline, 0.0, 6.0).expect("sync figures");
        assert_eq!((d.slow_syncs, d.seconds, d.slowed_seconds), (0, 6, 0));
        assert_eq!((d.calm_seconds, d.calm_acquires), (6, 3));
        assert!(d.calm_acquire_p99_ms >= Some(20.0), "{d:?}");
        assert_eq!((d.syncs, d.mean_sync_ms), (0, None));

        // All syncs and their mean come from the samples' histogram totals, across nodes and
        // across a restart (node 1's counters start again at zero).
        let totals = |t_s: f64, nodes: &[(usize, f64, f64)]| Sample {
            t_s,
            syncs: nodes.iter().map(|&(n, count, _)| (n, count)).collect(),
            sync_seconds: nodes.iter().map(|&(n, _, secs)| (n, secs)).collect(),
            ..Default::default()
        };
        let samples = [
            totals(0.0, &[(0, 100.0, 0.1), (1, 50.0, 0.05)]),
            totals(3.0, &[(0, 400.0, 0.4), (1, 10.0, 0.02)]),
            totals(6.0, &[(0, 500.0, 0.5), (1, 110.0, 0.12)]),
        ];
        let d = slow_syncs(&rec, &samples, &timeline, 0.0, 6.0).expect("sync figures");
        // Node 0: 400 syncs in 0.4 s; node 1: 10 in 0.02 s, then 100 in 0.1 s.
        assert_eq!(d.syncs, 510);
        let mean = d.mean_sync_ms.expect("a mean");
        assert!((mean - 1000.0 * 0.52 / 510.0).abs() < 1e-9, "{mean}");

        // Two slow syncs in second 4: it and second 5 are slowed, its acquires leave the
        // calm part.
        with_syncs(&mut timeline, &[0.0, 0.0, 0.0, 0.0, 2.0, 0.0]);
        let d = slow_syncs(&rec, &[], &timeline, 0.0, 6.0).expect("sync figures");
        assert_eq!((d.slow_syncs, d.slowed_seconds), (2, 2));
        assert_eq!((d.calm_seconds, d.calm_acquires), (4, 0));
        assert_eq!(d.calm_acquire_p99_ms, None);

        // Steal over seconds 1-2 (and so 3) without a slow sync: those are not calm either,
        // while second 5 is.
        let (rec, samples, mut timeline) = run_with(&[0, 0, 30, 0, 0, 0]);
        steal(&samples, &rec, &mut timeline, 0.0, 6.0);
        with_syncs(&mut timeline, &[0.0; 6]);
        let d = slow_syncs(&rec, &[], &timeline, 0.0, 6.0).expect("sync figures");
        assert_eq!(
            (d.slowed_seconds, d.calm_seconds, d.calm_acquires),
            (0, 3, 3)
        );

        // Servers that report no sync times: no split.
        let (rec, _, timeline) = run_with(&[0; 6]);
        assert!(slow_syncs(&rec, &[], &timeline, 0.0, 6.0).is_none());
    }

    #[test]
    fn no_steal_figures_no_split() {
        let (rec, _, mut timeline) = run_with(&[]);
        assert!(steal(&[], &rec, &mut timeline, 0.0, 6.0).is_none());
    }
}
