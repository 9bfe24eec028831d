//! One run: set up the system under test, drive the workload through a scenario, collect the
//! client's and the server's view, tear down.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::{Backend, EtcdClient, FencegateClient};
use crate::cluster::process::{find_fencegate_bin, free_ports};
use crate::cluster::status::{self, READ_TIMEOUT};
use crate::cluster::{ClusterSpec, LocalCluster, ProxySpec};
use crate::config::{check_loopback, Profile, RunArgs, Scenario, System, Workload};
use crate::ledger::Ledger;
use crate::poller::{self, Pids, Poller, Sample};
use crate::report::{
    self, LeaderKillReport, Machine, RampReport, RampStep, RssSummary, ServerSummary, Summary,
};
use crate::stats::{Op, Recorder, Second, Window};
use crate::workload::Engine;

/// The outcome of one run, with what is needed to plot it.
pub struct RunResult {
    pub summary: Summary,
    pub timeline: Vec<Second>,
    pub samples: Vec<Sample>,
    pub cdf: Vec<crate::plot::Series>,
}

/// A local etcd cluster started with scripts/etcd.sh (stopped on drop).
struct EtcdCluster {
    script: PathBuf,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    endpoints: Vec<String>,
}

impl EtcdCluster {
    fn start(script: PathBuf, dir: Option<PathBuf>) -> anyhow::Result<Self> {
        let (dir, tmp) = match dir {
            Some(d) => (d.join("etcd"), None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("fencegate-loadtest-etcd-")
                    .tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let ports = free_ports(6)?;
        let join = |p: &[u16]| p.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(&dir)
            .arg(join(&ports[0..3]))
            .arg(join(&ports[3..6]))
            .output()
            .with_context(|| format!("run {}", script.display()))?;
        let cluster = EtcdCluster {
            script,
            dir,
            _tmp: tmp,
            endpoints: ports[0..3]
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
        };
        if !out.status.success() {
            bail!(
                "etcd.sh start failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(cluster)
    }

    fn pids(&self) -> BTreeMap<usize, u32> {
        (0..3)
            .filter_map(|i| {
                let s = std::fs::read_to_string(self.dir.join(format!("m{}.pid", i + 1))).ok()?;
                Some((i, s.trim().parse().ok()?))
            })
            .collect()
    }

    fn stop_member(&self, n: usize) {
        let _ = std::process::Command::new("bash")
            .arg(&self.script)
            .arg("stop-member")
            .arg(&self.dir)
            .arg(n.to_string())
            .status();
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

fn etcd_script(args: &RunArgs) -> PathBuf {
    args.etcd_script
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/etcd.sh"))
}

/// Runs one scenario against one system.
pub async fn run(args: &RunArgs, system: System) -> anyhow::Result<RunResult> {
    let mut w = Workload::resolve(args)?;
    let scenario = args.scenario;
    let machine = Machine::read();
    let mut warnings = Vec::new();
    if scenario == Scenario::Compaction && args.duration_s.is_none() {
        // Cross at least ~4 snapshots (every 20k entries) at the expected commit rate.
        let commits = 2.0 * w.rate + w.active_locks as f64 * 1000.0 / w.renew_interval_ms as f64;
        let needed = (4.0 * 20_000.0 / commits).ceil() as u64;
        w.duration_s = w.duration_s.max(needed);
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;

    // ---- system under test ----
    let mut local: Option<Arc<Mutex<LocalCluster>>> = None;
    let mut etcd: Option<EtcdCluster> = None;
    let pids: Pids = Arc::new(Mutex::new(BTreeMap::new()));
    let (bases, proxies, cluster_desc) = match system {
        System::Fencegate if !args.target.is_empty() => {
            let bases: Vec<String> = args
                .target
                .iter()
                .map(|t| check_loopback(t))
                .collect::<anyhow::Result<_>>()?;
            let proxies: Vec<String> = args
                .proxy_target
                .iter()
                .map(|t| check_loopback(t))
                .collect::<anyhow::Result<_>>()?;
            if matches!(scenario, Scenario::ReplicaDown | Scenario::LeaderKill) {
                bail!("--scenario {scenario:?} stops nodes: it needs a cluster the harness starts (no --target)");
            }
            status::wait_ready(&http, &bases, Duration::from_secs(10)).await?;
            (bases, proxies, format!("target {}", args.target.join(",")))
        }
        System::Fencegate => {
            let bin = find_fencegate_bin(args.fencegate_bin.as_deref())?;
            let with_proxy = w.writes_per_hold > 0;
            let spec = ClusterSpec {
                tmp_prefix: "fencegate-loadtest-",
                log_env: "FENCEGATE_LOADTEST_NODE_LOG",
                proxies: with_proxy.then_some(ProxySpec::LOAD),
                fault_injection: false,
            };
            let c = LocalCluster::start(bin.clone(), args.data_dir.clone(), spec)?;
            let bases = c.api_urls();
            let proxies = c.proxy_urls();
            *pids.lock().unwrap_or_else(|e| e.into_inner()) = c.pids();
            let desc = format!("local 3 nodes ({})", bin.display());
            c.wait_ready(Duration::from_secs(30)).await?;
            local = Some(Arc::new(Mutex::new(c)));
            (bases, proxies, desc)
        }
        System::Etcd => {
            if !matches!(
                scenario,
                Scenario::Steady | Scenario::Ramp | Scenario::ReplicaDown
            ) {
                bail!("the etcd driver runs the steady, replica-down and ramp scenarios");
            }
            let endpoints: Vec<String> = if args.etcd_endpoints.is_empty() {
                let c = EtcdCluster::start(etcd_script(args), args.data_dir.clone())?;
                *pids.lock().unwrap_or_else(|e| e.into_inner()) = c.pids();
                let e = c.endpoints.clone();
                etcd = Some(c);
                e
            } else {
                args.etcd_endpoints
                    .iter()
                    .map(|t| check_loopback(t))
                    .collect::<anyhow::Result<_>>()?
            };
            (
                endpoints.clone(),
                Vec::new(),
                format!(
                    "etcd {}",
                    if etcd.is_some() {
                        "local 3 members"
                    } else {
                        "target"
                    }
                ),
            )
        }
    };
    let mut client_bases = bases.clone();

    // ---- replica-down: one follower stopped for the whole run ----
    let t_setup = Instant::now();
    let mut pre_events = Vec::new();
    if scenario == Scenario::ReplicaDown {
        match (&local, &etcd) {
            (Some(c), _) => {
                let (leader, _) = status::find_leader(&http, &bases)
                    .await
                    .context("no leader")?;
                let victim = (1..=3u64).find(|id| *id != leader).unwrap_or(3);
                let mut g = c.lock().unwrap_or_else(|e| e.into_inner());
                g.stop(victim)?;
                pids.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&(victim as usize - 1));
                client_bases.retain(|b| *b != bases[victim as usize - 1]);
                pre_events.push(format!("node {victim} (follower) stopped"));
            }
            (None, Some(e)) => {
                // Any member: etcd's leader moves on its own if it was the leader.
                e.stop_member(3);
                pids.lock().unwrap_or_else(|e| e.into_inner()).remove(&2);
                client_bases.retain(|b| *b != bases[2]);
                pre_events.push("member 3 stopped".to_string());
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            _ => bail!("replica-down needs a cluster the harness starts"),
        }
    }
    let _ = t_setup;

    // ---- client ----
    let leader_hint = Arc::new(AtomicUsize::new(0));
    let backend = match system {
        System::Fencegate => {
            if w.leader_only {
                if let Some((_, idx)) = status::find_leader(&http, &client_bases).await {
                    leader_hint.store(idx, Ordering::Relaxed);
                }
            }
            Backend::Fencegate(FencegateClient::new(
                &client_bases,
                &proxies,
                w.connections,
                w.request_timeout(),
                w.retries,
                w.leader_only.then(|| leader_hint.clone()),
            )?)
        }
        System::Etcd => Backend::Etcd(
            EtcdClient::connect(&client_bases, w.connections, w.request_timeout()).await?,
        ),
    };
    if w.writes_per_hold > 0 && !backend.supports_writes() {
        warnings.push(
            "fenced writes need the fencing proxy (fencegate, local or --proxy-target); skipped"
                .into(),
        );
    }

    let cpu_start = process_cpu_s();
    let t0 = Instant::now() + Duration::from_millis(200);
    let rec = Arc::new(Recorder::new(t0));
    for e in pre_events {
        rec.event(e);
    }
    let ledger = Arc::new(Ledger::default());
    let engine = Engine::new(backend, rec.clone(), ledger.clone(), w.clone());
    let poller = Poller::start(
        system,
        bases.clone(),
        pids.clone(),
        rec.clone(),
        Duration::from_secs(args.poll_s.max(1)),
    );

    let warmup = Duration::from_secs(w.warmup_s);
    let measured = Duration::from_secs(w.duration_s);
    let hard_stop = t0 + Duration::from_secs(args.max_total_s);
    let max_arrivals = (w.rate.max(args.ramp_max_rate) * args.max_total_s as f64) as u64;

    // ---- progress ----
    let expected_s = match scenario {
        Scenario::Ramp => (warmup + Duration::from_secs(ramp_step_s(args) * 12)).as_secs(),
        _ => (warmup + measured).as_secs(),
    };
    let bar = ProgressBar::new(expected_s.max(1));
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:30}] {pos}/{len}s {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let bar_task = {
        let bar = bar.clone();
        let engine = engine.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let c = engine.counters();
                bar.set_position(t0.elapsed().as_secs());
                bar.set_message(format!(
                    "{:.0}/s offered · {} active · {} ok · {} failed",
                    engine.rate(),
                    c.cycles_active.load(Ordering::Relaxed),
                    c.ops_ok.load(Ordering::Relaxed),
                    c.ops_failed.load(Ordering::Relaxed)
                ));
            }
        })
    };

    let arrivals = engine.start(t0, max_arrivals);
    let mut leader_kill = None;
    let mut ramp = None;
    let main_window;
    let settle = w.request_timeout() * (w.retries + 1) + Duration::from_secs(2);

    match scenario {
        Scenario::Ramp => {
            let (r, win) = run_ramp(args, &w, &engine, &rec, t0, warmup, hard_stop, settle).await;
            ramp = Some(r);
            main_window = win;
        }
        _ => {
            main_window = rec.add_window(Window::new(warmup, warmup + measured));
            let kill_task = if scenario == Scenario::LeaderKill {
                let c = local.clone().context("leader-kill needs a local cluster")?;
                let at =
                    t0 + warmup + Duration::from_secs(args.fault_at_s.unwrap_or(w.duration_s / 3));
                Some(tokio::spawn(leader_kill_fault(
                    c,
                    http.clone(),
                    bases.clone(),
                    pids.clone(),
                    rec.clone(),
                    at,
                    Duration::from_secs(args.restart_after_s),
                    leader_hint.clone(),
                )))
            } else {
                None
            };
            tokio::time::sleep_until((t0 + warmup + measured).min(hard_stop).into()).await;
            engine.stop_arrivals();
            if let Some(t) = kill_task {
                leader_kill = t.await.ok().and_then(|r| r.ok());
            }
            wait_window(&rec, main_window, settle).await;
        }
    }
    let unfinished_ops = rec.in_flight(main_window);
    let client_cpu_cores = (process_cpu_s() - cpu_start) / t0.elapsed().as_secs_f64().max(1e-3);
    engine.stop_arrivals();
    let _ = arrivals.await;
    let drained = engine.drain(Duration::from_secs(60)).await;
    bar_task.abort();
    bar.finish_and_clear();
    if !drained {
        warnings.push(
            "some lock cycles were still running 60 s after the end (drain timed out)".into(),
        );
    }
    let samples = poller.finish().await;

    // ---- after the run ----
    let mut node_failures = Vec::new();
    if let Some(c) = &local {
        node_failures = c.lock().map(|mut c| c.crashed()).unwrap_or_default();
    }
    let final_status = if system == System::Fencegate {
        status::fetch_all(&http, &bases).await
    } else {
        Vec::new()
    };
    let inv = ledger.report();
    let server_last_token = final_status.iter().map(|(_, s)| s.locks.last_token).max();
    let server_token_consistent = server_last_token.map(|t| t >= inv.max_token);

    let (from, to) = rec.with_window(main_window, |win| {
        (win.start.as_secs_f64(), win.end.as_secs_f64())
    });
    let server = server_summary(system, &samples, from, to);
    let timeline = rec.timeline();
    let events = rec.events();
    if let Some(k) = leader_kill.as_mut() {
        finish_leader_kill(k, &timeline, &rec);
    }
    if scenario == Scenario::Compaction && server.snapshots < 3 {
        warnings.push(format!(
            "only {} snapshots during the run: raise --duration-s or --rate to cross more",
            server.snapshots
        ));
    }
    let (ops, lock_cycles_per_s, measured_s, cdf) = rec.with_window(main_window, |win| {
        let ops: BTreeMap<String, report::OpSummary> = Op::ALL
            .iter()
            .map(|op| (op.name().to_string(), report::op_summary(win, *op)))
            .collect();
        let cycles = win.op(Op::Release).ok as f64 / win.secs();
        (ops, cycles, win.secs(), report::cdf_series(win, ""))
    });
    let summary = Summary {
        system: system.to_string(),
        scenario: format!("{scenario:?}")
            .to_lowercase()
            .replace("replicadown", "replica-down")
            .replace("leaderkill", "leader-kill"),
        profile: match args.profile {
            Profile::Seed => "seed".into(),
            Profile::Smoke => "smoke".into(),
        },
        cluster: cluster_desc,
        machine,
        workload: w.clone(),
        measured_s,
        ops,
        unfinished_ops,
        client_cpu_cores,
        lock_cycles_per_s,
        server,
        invariants: inv,
        server_token_consistent,
        dropped_arrivals: engine.counters().dropped.load(Ordering::Relaxed),
        events,
        leader_kill,
        ramp,
        node_failures,
        warnings,
    };
    drop(engine);
    if let Some(c) = local {
        if let Ok(mut c) = c.lock() {
            c.stop_all();
        }
    }
    drop(etcd);
    Ok(RunResult {
        summary,
        timeline,
        samples,
        cdf,
    })
}

fn ramp_step_s(args: &RunArgs) -> u64 {
    args.ramp_step_s.unwrap_or(match args.profile {
        Profile::Seed => 20,
        Profile::Smoke => 4,
    })
}

/// User + system CPU seconds of this process so far.
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Waits until every op started in the window has finished (bounded).
async fn wait_window(rec: &Recorder, idx: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while rec.in_flight(idx) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_ramp(
    args: &RunArgs,
    w: &Workload,
    engine: &Engine,
    rec: &Arc<Recorder>,
    t0: Instant,
    warmup: Duration,
    hard_stop: Instant,
    settle: Duration,
) -> (RampReport, usize) {
    let step = Duration::from_secs(ramp_step_s(args));
    // The first part of each step lets the active-lock population adjust to the new rate.
    let skip = (step / 4).min(Duration::from_secs(5));
    let mut report = RampReport {
        bound_ms: args.ramp_bound_ms,
        tight_bound_ms: args.ramp_tight_bound_ms,
        ..Default::default()
    };
    let mut rate = w.rate;
    let mut start = warmup;
    engine.set_rate(rate);
    let whole = rec.add_window(Window::new(warmup, Duration::from_secs(args.max_total_s)));
    loop {
        let idx = rec.add_window(Window::new(start + skip, start + step));
        rec.event(format!("{rate:.0}/s"));
        let end = t0 + start + step;
        if end > hard_stop {
            report.stopped_because = "hit --max-total-s".into();
            break;
        }
        tokio::time::sleep_until(end.into()).await;
        let next = rate * args.ramp_factor;
        let last = next > args.ramp_max_rate;
        if !last {
            engine.set_rate(next);
        } else {
            engine.stop_arrivals();
        }
        wait_window(rec, idx, settle).await;
        let st = rec.with_window(idx, |win| ramp_step(win, rate, args.ramp_bound_ms));
        let over = !st.sustained;
        let why = if st.all_p99_ms > args.ramp_bound_ms {
            format!(
                "p99 {:.1} ms > {} ms at {rate:.0}/s",
                st.all_p99_ms, args.ramp_bound_ms
            )
        } else {
            format!(
                "not sustained at {rate:.0}/s (achieved {:.0}/s, {} errors)",
                st.achieved_acquires_per_s, st.errors
            )
        };
        report.steps.push(st);
        if over {
            report.stopped_because = why;
            engine.stop_arrivals();
            break;
        }
        if last {
            report.stopped_because = "reached --ramp-max-rate".into();
            break;
        }
        rate = next;
        start += step;
    }
    rec.set_window_end(whole, start + step);
    for st in &report.steps {
        if st.sustained {
            report.max_rate_under_bound = Some(st.target_rate);
        }
        if st.sustained && st.all_p99_ms <= args.ramp_tight_bound_ms {
            report.max_rate_under_tight_bound = Some(st.target_rate);
        }
    }
    (report, whole)
}

fn ramp_step(win: &Window, rate: f64, bound_ms: f64) -> RampStep {
    let secs = win.secs();
    let mut p99 = BTreeMap::new();
    let mut errors = 0;
    let mut ops = 0;
    for op in Op::LOCK_OPS {
        let s = win.op(op);
        if s.ok > 0 {
            p99.insert(
                op.name().to_string(),
                s.hist.value_at_quantile(0.99) as f64 / 1000.0,
            );
        }
        errors += s.failed;
        ops += s.ok;
    }
    let all_p99 = if win.all.is_empty() {
        0.0
    } else {
        win.all.value_at_quantile(0.99) as f64 / 1000.0
    };
    let achieved = win.op(Op::Acquire).ok as f64 / secs;
    RampStep {
        target_rate: rate,
        achieved_acquires_per_s: achieved,
        lock_ops_per_s: ops as f64 / secs,
        commits_per_s: 0.0,
        p99_ms: p99,
        all_p99_ms: all_p99,
        errors,
        sustained: achieved >= 0.95 * rate
            && (errors as f64) < 0.01 * ops.max(1) as f64
            && all_p99 <= bound_ms,
    }
}

fn server_summary(system: System, samples: &[Sample], from: f64, to: f64) -> ServerSummary {
    let secs = poller::covered(samples, from, to).max(1e-9);
    let sum = system == System::Fencegate;
    let commits = poller::growth(samples, from, to, poller::commits_of, sum);
    let applied = poller::growth(samples, from, to, poller::applied_of, false);
    let mut snapshots = 0;
    for w in samples.windows(2) {
        for (n, idx) in &w[1].snapshot_index {
            // A node's first snapshot shows as None -> Some (unless the node was down).
            let was = w[0].snapshot_index.get(n);
            if was != Some(idx) && (was.is_some() || w[0].commits.contains_key(n)) {
                snapshots += 1;
            }
        }
    }
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

/// Fills in the server-side commit rate of each ramp step from the poller's samples.
pub fn ramp_commits(result: &mut RunResult, step_s: u64) {
    let sum = result.summary.system == "fencegate";
    let events = result.summary.events.clone();
    if let Some(r) = result.summary.ramp.as_mut() {
        for st in r.steps.iter_mut() {
            let label = format!("{:.0}/s", st.target_rate);
            if let Some(e) = events.iter().find(|e| e.what == label) {
                let skip = (step_s as f64 / 4.0).min(5.0);
                let (from, to) = (e.t_s + skip, e.t_s + step_s as f64);
                let secs = poller::covered(&result.samples, from, to).max(1e-9);
                st.commits_per_s =
                    poller::growth(&result.samples, from, to, poller::commits_of, sum) / secs;
            }
        }
        for st in &r.steps {
            if st.sustained && Some(st.target_rate) == r.max_rate_under_bound {
                r.max_commits_per_s_under_bound = Some(st.commits_per_s);
            }
            if st.sustained && Some(st.target_rate) == r.max_rate_under_tight_bound {
                r.max_commits_per_s_under_tight_bound = Some(st.commits_per_s);
            }
        }
    }
}

pub fn step_seconds(args: &RunArgs) -> u64 {
    ramp_step_s(args)
}

/// SIGKILLs the leader at `at`, watches the election, restarts the node after `restart_after`
/// and waits for it to catch up.
#[allow(clippy::too_many_arguments)]
async fn leader_kill_fault(
    cluster: Arc<Mutex<LocalCluster>>,
    http: reqwest::Client,
    bases: Vec<String>,
    pids: Pids,
    rec: Arc<Recorder>,
    at: Instant,
    restart_after: Duration,
    leader_hint: Arc<AtomicUsize>,
) -> anyhow::Result<LeaderKillReport> {
    tokio::time::sleep_until(at.into()).await;
    let (leader, idx) = status::find_leader(&http, &bases)
        .await
        .context("no leader to kill")?;
    let mut report = LeaderKillReport {
        killed_node: leader,
        ..Default::default()
    };
    let slot = rec.watch_recovery();
    let killed = Instant::now();
    {
        let mut c = cluster.lock().unwrap_or_else(|e| e.into_inner());
        tokio::task::block_in_place(|| c.kill(leader))?;
    }
    report.killed_at_s = rec.event(format!("leader node {leader} killed (SIGKILL)"));
    let kill_t = Duration::from_secs_f64(report.killed_at_s);
    report.fault_window = Some(rec.add_window(Window::new(
        kill_t,
        kill_t + restart_after + Duration::from_secs(10),
    )));
    pids.lock().unwrap_or_else(|e| e.into_inner()).remove(&idx);
    let survivors: Vec<String> = bases
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != idx)
        .map(|(_, b)| b.clone())
        .collect();
    let deadline = killed + restart_after.max(Duration::from_secs(30));
    while Instant::now() < deadline {
        let st = status::fetch_all(&http, &survivors).await;
        if let Some(new) = st
            .iter()
            .find(|(_, s)| s.is_leader() && s.node_id != leader)
            .map(|(_, s)| s.node_id)
        {
            report.new_leader_after_ms = Some(killed.elapsed().as_millis() as u64);
            report.new_leader = Some(new);
            rec.event(format!("node {new} leads"));
            if let Some(i) = bases.iter().position(|b| {
                st.iter()
                    .any(|(j, s)| s.node_id == new && survivors[*j] == *b)
            }) {
                leader_hint.store(i, Ordering::Relaxed);
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep_until((killed + restart_after).into()).await;
    let leader_applied = {
        let st = status::fetch_all(&http, &survivors).await;
        st.iter().map(|(_, s)| s.last_applied).max().unwrap_or(0)
    };
    {
        let mut c = cluster.lock().unwrap_or_else(|e| e.into_inner());
        c.restart(leader)?;
        if let Some(pid) = c.pids().get(&idx) {
            pids.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(idx, *pid);
        }
    }
    let restarted = Instant::now();
    report.restarted_at_s = Some(rec.event(format!("node {leader} restarted")));
    let deadline = restarted + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(s) = status::fetch(&http, &bases[idx], READ_TIMEOUT).await {
            if s.last_applied >= leader_applied {
                report.caught_up_after_ms = Some(restarted.elapsed().as_millis() as u64);
                rec.event(format!("node {leader} caught up"));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some((_, first)) = rec.recovery(slot) {
        report.first_success_after_ms = Some(first.saturating_sub(kill_t).as_millis() as u64);
    }
    Ok(report)
}

fn finish_leader_kill(k: &mut LeaderKillReport, timeline: &[Second], rec: &Recorder) {
    let start = k.killed_at_s.floor() as u64;
    let mut run = 0;
    let mut best = 0;
    for s in timeline.iter().filter(|s| s.t >= start) {
        if s.ok[0] == 0 {
            run += 1;
            best = best.max(run);
        } else if run > 0 || s.t > start + 60 {
            run = 0;
            if s.t > start + 60 {
                break;
            }
        }
    }
    k.seconds_without_acquires = best;
    if let Some(idx) = k.fault_window {
        rec.with_window(idx, |win| {
            for op in Op::ALL {
                for (code, n) in &win.op(op).errors_by_code {
                    *k.errors_by_code
                        .entry(format!("{}:{code}", op.name()))
                        .or_default() += n;
                }
                k.failed_ops += win.op(op).failed;
            }
        });
    }
}
