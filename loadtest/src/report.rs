//! summary.json, the terminal table and the plots of a run.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::config::Workload;
use crate::ledger::LedgerReport;
use crate::plot::{self, Series};
use crate::poller::Sample;
use crate::stats::{cdf_points, quantiles_ms, Event, Op, Second, Window};

#[derive(Clone, Debug, Serialize)]
pub struct OpSummary {
    /// Operations started in the window.
    pub count: u64,
    pub ok: u64,
    /// Definite refusals that are part of the workload (lock_held on contended acquires).
    pub conflicts: u64,
    /// Operations that ended in an error after their retries.
    pub errors: u64,
    /// Every failed attempt by error code (retried ones included).
    pub errors_by_code: BTreeMap<String, u64>,
    /// How the operations that did not succeed ended, by code (conflicts included).
    pub final_by_code: BTreeMap<String, u64>,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Successful operations per second.
    pub rate_per_s: f64,
}

pub fn op_summary(w: &Window, op: Op) -> OpSummary {
    let s = w.op(op);
    let [p50, p95, p99, max] = quantiles_ms(&s.hist);
    OpSummary {
        count: s.ok + s.conflicts + s.failed,
        ok: s.ok,
        conflicts: s.conflicts,
        errors: s.failed,
        errors_by_code: s.errors_by_code.clone(),
        final_by_code: s.final_by_code.clone(),
        p50_ms: p50,
        p95_ms: p95,
        p99_ms: p99,
        max_ms: max,
        rate_per_s: s.ok as f64 / w.secs(),
    }
}

/// How long lock calls waited inside the harness before their first request went out: for a
/// free connection (`--connections` per node) or for the harness's own threads. It is part of
/// every latency above, since latency counts from the intended start.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HarnessWait {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// p99 of the part spent waiting for a free connection (the rest is the harness's own
    /// scheduling: a task that woke late, on a machine whose cores the cluster also uses).
    pub connection_p99_ms: f64,
    /// p99 of acquire, renew and release together, for comparison.
    pub lock_ops_p99_ms: f64,
}

impl HarnessWait {
    pub fn of(w: &Window) -> Self {
        let [p50, _, p99, max] = quantiles_ms(&w.harness_wait);
        HarnessWait {
            p50_ms: p50,
            p99_ms: p99,
            max_ms: max,
            connection_p99_ms: quantiles_ms(&w.connection_wait)[2],
            lock_ops_p99_ms: quantiles_ms(&w.all)[2],
        }
    }

    /// A warning when a good part of the tail latency was spent in the harness, so the run
    /// measured the client more than the servers. `connections` is the per-node bound.
    pub fn warning(&self, connections: usize, leader_only: bool) -> Option<String> {
        // Under a millisecond is the harness's normal scheduling; a fifth of the p99 is where
        // it starts to change the numbers a reader takes away.
        if self.p99_ms < 1.0 || self.p99_ms < 0.2 * self.lock_ops_p99_ms {
            return None;
        }
        let cause = if self.connection_p99_ms < 0.5 * self.p99_ms {
            "mostly the harness's own tasks starting late: it lacked CPU next to the cluster"
                .to_string()
        } else if leader_only {
            format!(
                "mostly waiting for a connection: with --leader-only every call shares the \
                 leader's {connections} connections, so the offered rate is capped at \
                 {connections} / latency; raise --connections"
            )
        } else {
            format!(
                "mostly waiting for a connection: {connections} connections per node were too \
                 few; raise --connections"
            )
        };
        Some(format!(
            "lock calls waited in the harness before they were sent: p99 {:.1} ms of a lock-call \
             p99 of {:.1} ms, {cause}. That part of the latencies above is the harness's, not \
             the servers'",
            self.p99_ms, self.lock_ops_p99_ms
        ))
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub nproc: usize,
    pub mem_total_mib: u64,
    pub load_avg_at_start: String,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total_mib = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024);
        Machine {
            cpu,
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            mem_total_mib,
            load_avg_at_start: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerSummary {
    /// Committed proposals per second over the measured window (fencegate: lock commands
    /// proposed through raft, sweeper ticks included; etcd: proposals committed).
    pub commits_per_s: f64,
    /// Raft log entries applied per second (fencegate) / proposals applied (etcd).
    pub log_entries_per_s: f64,
    /// Snapshots seen during the whole run (changes of a node's snapshot index).
    pub snapshots: u64,
    pub snapshot_index_first: Option<u64>,
    pub snapshot_index_last: Option<u64>,
    pub purged_index_last: Option<u64>,
    /// Per node (1-based): last VmRSS and peak VmHWM in MiB.
    pub rss_mib: BTreeMap<String, RssSummary>,
    pub active_locks_last: Option<u64>,
    pub resources_last: Option<u64>,
    pub dedup_records_last: Option<u64>,
    pub last_token: Option<u64>,
}

/// The measured seconds split by whether the hypervisor ran something else on this machine's
/// CPUs in them ("steal" in /proc/stat). On a shared VM that is the usual cause of a stretch of
/// slow seconds nothing in the servers explains: the latencies of the other seconds are what
/// the servers do on the machine when it is theirs.
#[derive(Clone, Debug, Serialize)]
pub struct StealSummary {
    /// A second counts as stolen when more than this share of the CPU, in %, went elsewhere
    /// in it or in the second before (the queue a stolen second leaves drains in the next).
    pub threshold_pct: f64,
    /// Mean share of the CPU, in %, taken over the measured seconds.
    pub mean_pct: f64,
    /// Measured seconds with a steal figure, and how many of them count as stolen.
    pub seconds: u64,
    pub stolen_seconds: u64,
    /// Acquires completed in the other seconds, and their latencies (none without acquires).
    pub quiet_acquires: u64,
    pub quiet_acquire_p50_ms: Option<f64>,
    pub quiet_acquire_p99_ms: Option<f64>,
    /// Acquires completed in the stolen seconds, and their latencies (none without acquires).
    pub stolen_acquires: u64,
    pub stolen_acquire_p50_ms: Option<f64>,
    pub stolen_acquire_p99_ms: Option<f64>,
}

impl StealSummary {
    /// "acquire p50 / p99 in the other N s …", or that no second was free of steal.
    pub fn quiet_part(&self) -> String {
        let quiet = self.seconds - self.stolen_seconds;
        match (self.quiet_acquire_p50_ms, self.quiet_acquire_p99_ms) {
            (Some(p50), Some(p99)) => {
                format!("acquire p50 / p99 in the other {quiet} s {p50:.2} / {p99:.2} ms")
            }
            _ if quiet == 0 => "no second without it".to_string(),
            _ => format!("no acquire finished in the other {quiet} s"),
        }
    }
}

/// The measured seconds split by whether a server's log sync to disk took longer than
/// `threshold_ms` in them (or in the second before). A slow sync holds up every command
/// waiting on it; the calm seconds, with neither a slow sync nor steal, show what the servers
/// do when the machine's CPUs and disk are theirs.
#[derive(Clone, Debug, Serialize)]
pub struct SlowSyncSummary {
    pub threshold_ms: f64,
    /// Syncs in the measured seconds, all nodes together, and how long one took on average
    /// (none if the servers report no sync times).
    pub syncs: u64,
    pub mean_sync_ms: Option<f64>,
    /// Syncs over the threshold in the measured seconds, all nodes together.
    pub slow_syncs: u64,
    /// Measured seconds with sync figures, those with a slow sync (or right after one), and
    /// those with neither a slow sync nor steal.
    pub seconds: u64,
    pub slowed_seconds: u64,
    pub calm_seconds: u64,
    /// Acquires completed in the calm seconds, and their latencies (none without acquires).
    pub calm_acquires: u64,
    pub calm_acquire_p50_ms: Option<f64>,
    pub calm_acquire_p99_ms: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RssSummary {
    pub last: f64,
    pub peak: f64,
    /// Highest VmRSS seen while polling (VmHWM also counts start-up).
    pub max_sampled: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LeaderKillReport {
    pub killed_node: u64,
    pub killed_at_s: f64,
    /// Kill until a surviving node reports a new leader.
    pub new_leader_after_ms: Option<u64>,
    pub new_leader: Option<u64>,
    /// Kill until the first successful lock operation that was scheduled after the kill.
    pub first_success_after_ms: Option<u64>,
    /// Longest stretch of whole seconds with no successful acquire, from the kill on.
    pub seconds_without_acquires: u64,
    pub restarted_at_s: Option<f64>,
    /// Restart until the restarted node has applied the leader's log index at restart.
    pub caught_up_after_ms: Option<u64>,
    /// Failed attempts by op and code (retried ones included), for ops scheduled from the
    /// kill until 10 s after the restart.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Operations in that window that failed after their retries.
    pub failed_ops: u64,
    #[serde(skip)]
    pub fault_window: Option<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RampStep {
    pub target_rate: f64,
    pub achieved_acquires_per_s: f64,
    pub lock_ops_per_s: f64,
    pub commits_per_s: f64,
    pub p99_ms: BTreeMap<String, f64>,
    /// p99 of acquire, renew and release together.
    pub all_p99_ms: f64,
    pub errors: u64,
    pub sustained: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RampReport {
    pub bound_ms: f64,
    pub tight_bound_ms: f64,
    pub steps: Vec<RampStep>,
    /// Highest offered rate sustained (achieved ≥ 95%, errors < 1%) with p99 under the bound.
    pub max_rate_under_bound: Option<f64>,
    pub max_commits_per_s_under_bound: Option<f64>,
    pub max_rate_under_tight_bound: Option<f64>,
    pub max_commits_per_s_under_tight_bound: Option<f64>,
    pub stopped_because: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub system: String,
    pub scenario: String,
    pub profile: String,
    pub cluster: String,
    pub machine: Machine,
    pub workload: Workload,
    /// Seconds measured: the main window as it ran (shorter than asked if `cut_short`).
    pub measured_s: f64,
    /// `--max-total-s` stopped the run before its planned end.
    pub cut_short: bool,
    pub max_total_s: u64,
    pub ops: BTreeMap<String, OpSummary>,
    /// Operations of the measured window still waiting for an answer when the report was
    /// made (bounded wait after the window): under overload, the client-side backlog.
    pub unfinished_ops: u64,
    /// CPU the harness itself used during the run, in cores (it shares the machine with the
    /// servers).
    pub client_cpu_cores: f64,
    pub harness_wait: HarnessWait,
    /// Completed lock cycles (successful releases) per second.
    pub lock_cycles_per_s: f64,
    pub server: ServerSummary,
    /// How much CPU the hypervisor took from this machine during the run, and the acquire
    /// latencies of the seconds it took some apart from the others (Linux guests only).
    pub steal: Option<StealSummary>,
    pub slow_syncs: Option<SlowSyncSummary>,
    pub invariants: LedgerReport,
    /// The server's last token is at least the highest token the client saw.
    pub server_token_consistent: Option<bool>,
    pub dropped_arrivals: u64,
    pub events: Vec<Event>,
    pub leader_kill: Option<LeaderKillReport>,
    pub ramp: Option<RampReport>,
    /// `replica-down`: the stopped follower, restarted after the run, catching up.
    pub catch_up: Option<crate::scenario::CatchUp>,
    pub node_failures: Vec<String>,
    pub warnings: Vec<String>,
}

/// Everything needed to draw the run.
pub struct Artifacts<'a> {
    pub summary: &'a Summary,
    pub cdf: &'a [Series],
    pub timeline: &'a [Second],
    pub samples: &'a [Sample],
}

pub fn cdf_series(w: &Window, prefix: &str) -> Vec<Series> {
    Op::ALL
        .iter()
        .filter(|op| w.op(**op).ok > 0)
        .map(|op| Series {
            label: format!("{prefix}{}", op.name()),
            points: cdf_points(&w.op(*op).hist),
        })
        .collect()
}

pub fn print_table(s: &Summary) {
    println!();
    println!(
        "{} · {} · profile {} · {} · {:.0} s measured{} · offered {:.0} acquires/s",
        s.system,
        s.scenario,
        s.profile,
        s.cluster,
        s.measured_s,
        if s.cut_short {
            " (CUT SHORT by --max-total-s)"
        } else {
            ""
        },
        s.workload.rate
    );
    println!(
        "{:<8} {:>9} {:>9} {:>7} {:>7} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "op", "count", "ok", "errors", "confl", "p50 ms", "p95 ms", "p99 ms", "max ms", "ok/s"
    );
    for op in Op::ALL {
        if let Some(o) = s.ops.get(op.name()) {
            if o.count == 0 {
                continue;
            }
            println!(
                "{:<8} {:>9} {:>9} {:>7} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>9.1} {:>9.0}",
                op.name(),
                o.count,
                o.ok,
                o.errors,
                o.conflicts,
                o.p50_ms,
                o.p95_ms,
                o.p99_ms,
                o.max_ms,
                o.rate_per_s
            );
        }
    }
    let errs: Vec<String> = s
        .ops
        .iter()
        .flat_map(|(op, o)| {
            o.errors_by_code
                .iter()
                .map(move |(c, n)| format!("{op}:{c}×{n}"))
        })
        .collect();
    if !errs.is_empty() {
        println!("failed attempts: {}", errs.join(", "));
    }
    println!(
        "lock cycles/s {:.0} · server commits/s {:.0} · log entries/s {:.0} · snapshots {} · harness CPU {:.2} cores · waited in the harness p50 {:.2} / p99 {:.2} ms (for a connection: p99 {:.2}){}",
        s.lock_cycles_per_s,
        s.server.commits_per_s,
        s.server.log_entries_per_s,
        s.server.snapshots,
        s.client_cpu_cores,
        s.harness_wait.p50_ms,
        s.harness_wait.p99_ms,
        s.harness_wait.connection_p99_ms,
        if s.unfinished_ops > 0 {
            format!(" · {} ops still unanswered at report time", s.unfinished_ops)
        } else {
            String::new()
        }
    );
    if !s.server.rss_mib.is_empty() {
        let rss: Vec<String> = s
            .server
            .rss_mib
            .iter()
            .map(|(n, r)| format!("{n} {:.0} MiB (peak {:.0})", r.last, r.peak))
            .collect();
        println!("RSS: {}", rss.join(", "));
    }
    if let Some(st) = &s.steal {
        let stolen = match (st.stolen_acquire_p50_ms, st.stolen_acquire_p99_ms) {
            (Some(p50), Some(p99)) => format!(", in those {p50:.2} / {p99:.2} ms"),
            _ => String::new(),
        };
        println!(
            "hypervisor steal: {:.1} % of the CPU on average; {} of {} s above {:.0} % (or right after one) · {}{stolen}",
            st.mean_pct,
            st.stolen_seconds,
            st.seconds,
            st.threshold_pct,
            st.quiet_part(),
        );
    }
    if let Some(d) = &s.slow_syncs {
        let calm = match (d.calm_acquire_p50_ms, d.calm_acquire_p99_ms) {
            (Some(p50), Some(p99)) => format!("acquire p50 / p99 {p50:.2} / {p99:.2} ms"),
            _ => "no acquire".to_string(),
        };
        let mean = d
            .mean_sync_ms
            .map_or(String::new(), |m| format!(" (mean {m:.3} ms)"));
        println!(
            "log syncs: {}{mean}; over {:.0} ms: {} in {} of {} s (or right after one) · in the {} s with neither such a sync nor steal {calm}",
            d.syncs, d.threshold_ms, d.slow_syncs, d.slowed_seconds, d.seconds, d.calm_seconds,
        );
    }
    let i = &s.invariants;
    println!(
        "invariants: {} grants · duplicate tokens {} · duplicate leases {} · non-monotonic {} · lost leases {} · expired {}{}",
        i.grants,
        i.duplicate_tokens,
        i.duplicate_leases,
        i.non_monotonic_tokens,
        i.lost_leases,
        i.expired_leases,
        match s.server_token_consistent {
            Some(false) => " · SERVER last_token BELOW a token we were granted",
            _ => "",
        }
    );
    if i.releases_not_current > 0 {
        println!(
            "releases answered released=false while still valid (ambiguous, see summary.json): {}",
            i.releases_not_current
        );
    }
    if i.unexpected_lock_held > 0 {
        println!(
            "anomalies: {} lock_held answers on resources the harness believed free",
            i.unexpected_lock_held
        );
    }
    for v in &i.violations {
        if v.starts_with("(anomaly)") {
            println!("  {v}");
        } else {
            println!("  VIOLATION: {v}");
        }
    }
    if let Some(k) = &s.leader_kill {
        println!(
            "leader kill: node {} at {:.1}s · new leader after {} · first success after {} · {} s without acquires · restarted node caught up after {}",
            k.killed_node,
            k.killed_at_s,
            ms_opt(k.new_leader_after_ms),
            ms_opt(k.first_success_after_ms),
            k.seconds_without_acquires,
            ms_opt(k.caught_up_after_ms),
        );
    }
    if let Some(r) = &s.ramp {
        println!(
            "{:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>7}",
            "offered/s", "acq ok/s", "ops/s", "commits/s", "acq p99", "all p99", "errors", "ok?"
        );
        for st in &r.steps {
            println!(
                "{:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>9.2} {:>9.2} {:>9} {:>7}",
                st.target_rate,
                st.achieved_acquires_per_s,
                st.lock_ops_per_s,
                st.commits_per_s,
                st.p99_ms.get("acquire").cloned().unwrap_or(0.0),
                st.all_p99_ms,
                st.errors,
                if st.sustained { "yes" } else { "no" }
            );
        }
        println!(
            "highest sustained: {} acquires/s ({} commits/s) under {} ms p99; {} acquires/s ({} commits/s) under {} ms. Stopped: {}",
            f_opt(r.max_rate_under_bound),
            f_opt(r.max_commits_per_s_under_bound),
            r.bound_ms,
            f_opt(r.max_rate_under_tight_bound),
            f_opt(r.max_commits_per_s_under_tight_bound),
            r.tight_bound_ms,
            r.stopped_because
        );
    }
    for e in &s.node_failures {
        println!("NODE FAILURE: {e}");
    }
    for w in &s.warnings {
        println!("warning: {w}");
    }
}

fn ms_opt(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| format!("{v} ms"))
}

fn f_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

/// Writes `bytes` to `path`; an error names the path.
pub fn write_file(path: &Path, bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("write {}", path.display()))
}

/// summary.json, timeline.json and the SVGs.
pub fn write_out(dir: &Path, a: &Artifacts<'_>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let s = a.summary;
    write_file(&dir.join("summary.json"), serde_json::to_vec_pretty(s)?)?;
    write_file(
        &dir.join("timeline.json"),
        serde_json::to_vec(
            &serde_json::json!({ "seconds": a.timeline, "server_samples": a.samples }),
        )?,
    )?;
    let title = format!("{} · {}", s.system, s.scenario);
    if !a.cdf.is_empty() {
        plot::latency_cdf(
            &dir.join("latency_cdf.svg"),
            &format!("{title}: latency by percentile (measured window)"),
            a.cdf,
        )?;
    }
    let mut tput: Vec<Series> = Op::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| a.timeline.iter().any(|sec| sec.ok[*i] > 0))
        .map(|(i, op)| Series {
            label: format!("{} ok/s", op.name()),
            points: a
                .timeline
                .iter()
                .map(|sec| (sec.t as f64 + 0.5, sec.ok[i] as f64))
                .collect(),
        })
        .collect();
    let errs: Vec<(f64, f64)> = a
        .timeline
        .iter()
        .map(|sec| (sec.t as f64 + 0.5, sec.errors as f64))
        .collect();
    if errs.iter().any(|e| e.1 > 0.0) {
        tput.push(Series {
            label: "errors/s".into(),
            points: errs,
        });
    }
    let commits: Vec<(f64, f64)> = a
        .samples
        .windows(2)
        .filter_map(|w| {
            let dt = w[1].t_s - w[0].t_s;
            let d: f64 = w[1]
                .commits
                .iter()
                .filter_map(|(n, v)| w[0].commits.get(n).map(|p| (v - p).max(0.0)))
                .fold(0.0, |acc, x| {
                    if s.system == "etcd" {
                        acc.max(x)
                    } else {
                        acc + x
                    }
                });
            (dt > 0.0).then(|| (w[1].t_s, d / dt))
        })
        .collect();
    if !commits.is_empty() {
        tput.push(Series {
            label: "server commits/s".into(),
            points: commits,
        });
    }
    plot::timeline(
        &dir.join("throughput.svg"),
        &format!("{title}: throughput (fault events in red)"),
        "per second",
        &tput,
        &s.events,
        false,
    )?;
    let p99: Vec<Series> = Op::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| a.timeline.iter().any(|sec| sec.ok[*i] > 0))
        .map(|(i, op)| Series {
            label: format!("{} p99", op.name()),
            points: a
                .timeline
                .iter()
                .filter(|sec| sec.ok[i] > 0)
                .map(|sec| (sec.t as f64 + 0.5, sec.p99_ms[i]))
                .collect(),
        })
        .collect();
    plot::timeline(
        &dir.join("p99.svg"),
        &format!("{title}: p99 latency per second (fault events in red)"),
        "p99 (ms, log)",
        &p99,
        &s.events,
        true,
    )?;
    if let Some(r) = &s.ramp {
        plot::ramp(
            &dir.join("ramp.svg"),
            &format!("{}: ramp", s.system),
            &[Series {
                label: format!("{} p99 (acquire+renew+release)", s.system),
                points: r
                    .steps
                    .iter()
                    .map(|st| (st.target_rate, st.all_p99_ms))
                    .collect(),
            }],
            &[r.bound_ms, r.tight_bound_ms],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(p99_ms: f64, connection_p99_ms: f64, lock_ops_p99_ms: f64) -> HarnessWait {
        HarnessWait {
            p50_ms: p99_ms / 4.0,
            p99_ms,
            max_ms: p99_ms * 2.0,
            connection_p99_ms,
            lock_ops_p99_ms,
        }
    }

    #[test]
    fn a_tail_spent_in_the_harness_is_called_out_with_its_cause() {
        // Scheduling noise, and a small share of a large tail, say nothing.
        assert!(wait(0.4, 0.4, 1.0).warning(64, true).is_none());
        assert!(wait(5.0, 5.0, 100.0).warning(64, true).is_none());
        // Most of the tail waiting for a connection: the run measured the client's pool.
        let to_leader = wait(90.0, 88.0, 140.0)
            .warning(64, true)
            .expect("a warning");
        assert!(to_leader.contains("--leader-only") && to_leader.contains("64 connections"));
        let spread = wait(30.0, 29.0, 60.0)
            .warning(16, false)
            .expect("a warning");
        assert!(spread.contains("16 connections per node"), "{spread}");
        // Waiting, but not for connections: the harness's tasks started late.
        let cpu = wait(30.0, 0.1, 60.0).warning(256, true).expect("a warning");
        assert!(
            cpu.contains("lacked CPU") && !cpu.contains("raise"),
            "{cpu}"
        );
    }
}
