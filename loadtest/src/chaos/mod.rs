//! `fencegate-loadtest chaos`: a Jepsen-style test of the lock service's and the fencing
//! proxy's safety under faults, shipped as a command (the design and results are in
//! docs/verification.md).
//!
//! ```text
//! fencegate-loadtest chaos --duration-s 60 --out /tmp/chaos            # mixed faults, must pass
//! fencegate-loadtest chaos --nemesis pause,partition-leader            # selected faults only
//! fencegate-loadtest chaos --unsafe-no-fencing --duration-s 30         # must be caught
//! fencegate-loadtest chaos --unsafe-no-idempotency --duration-s 15     # must be caught too
//! fencegate-loadtest chaos --unsafe-refill-on-renew --duration-s 20     # must be caught
//! fencegate-loadtest chaos --recheck /tmp/chaos                        # re-run the checker
//! ```
//!
//! One run: start three `fencegate node` processes with proxies and a demo store
//! ([`crate::cluster`]); run honest workers and zombies ([`workers`]) and idempotent
//! create-order clients ([`orders`]) through the raw HTTP
//! clients that record every invocation and completion ([`client`], [`history`]); let the
//! [`nemesis`] break things one at a time; heal, let the clients stop, read the final state
//! and the store's log; then check the history, one function per invariant ([`checker`]).
//! Exit status 0 only if no check found a violation and nothing else went wrong (a node
//! crashed, a request hung, the cluster did not recover after the heal).

mod checker;
mod client;
mod history;
mod nemesis;
mod orders;
mod quota;
mod verdict;
mod workers;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use lock_core::wire::AcquireRequest;
use serde_json::json;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use client::{Client, DropSwitch, Endpoint, Outcome};
use history::{value_as, EventType, History, LockCall};
use nemesis::{Fault, Nemesis};
use verdict::{RunSetup, Verdict};
use workers::Workload;

use crate::cluster::process::find_fencegate_bin;
use crate::cluster::{ClusterSpec, LocalCluster, ProxySpec};
use crate::config::prepare_out;
use crate::report::write_file;

/// The chaos cluster: fault injection on, a proxy per node. A short grant keeps hand-offs on
/// contended keys quick (a release defers the next lease by at most one grant,
/// docs/fencing.md).
fn cluster_spec(args: &ChaosArgs) -> ClusterSpec {
    ClusterSpec {
        tmp_prefix: "fencegate-chaos-",
        log_env: "FENCEGATE_CHAOS_NODE_LOG",
        proxies: Some(ProxySpec {
            grant_ms: 1_500,
            upstream_timeout_ms: 1_000,
            unsafe_no_fencing: args.unsafe_no_fencing,
            unsafe_no_idempotency: args.unsafe_no_idempotency,
            quota: None,
        }),
        fault_injection: true,
    }
}

/// Which faults the nemesis may inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NemesisChoice {
    /// Every kind below, mixed at random (the default).
    All,
    /// No faults (a baseline).
    None,
    KillLeader,
    KillRandom,
    Pause,
    PartitionMinority,
    PartitionLeader,
    Bridge,
    DropResponses,
    ClockOffset,
}

#[derive(Args, Clone, Debug)]
pub struct ChaosArgs {
    /// Seconds of workload under faults (the final heal and checks come on top).
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    /// Fault kinds, comma separated; mixed at random.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub nemesis: Vec<NemesisChoice>,
    /// Run the proxies with fence checks OFF (lease-only, like a bare Redis lock). The
    /// checker must then report violations (invariant 3): proof that it can fail.
    #[arg(long)]
    pub unsafe_no_fencing: bool,
    /// Run the proxies without Idempotency-Key records (every attempt of an order is
    /// forwarded). The checker must then report duplicate orders (invariant 7): proof that
    /// it can fail.
    #[arg(long)]
    pub unsafe_no_idempotency: bool,
    /// Refill the proxies' rate-limit buckets on every quota lease renewal. The quota check
    /// must then report violations (invariant 9): proof that it can fail.
    #[arg(long)]
    pub unsafe_refill_on_renew: bool,
    /// Clients hammering the rate-limited route `/limited/{key}` through all proxies (0: no
    /// quota workload).
    #[arg(long, default_value_t = 3)]
    pub quota_clients: usize,
    /// Honest workers.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Zombie workers (stall past their lease, then write).
    #[arg(long, default_value_t = 3)]
    pub zombies: usize,
    /// Create-order clients on the idempotent `POST /orders` route (retries, concurrent
    /// duplicates, lost answers).
    #[arg(long, default_value_t = 3)]
    pub orderers: usize,
    /// Contended keys (`/kv/k0` … through the proxies, resources `kv:k0` …).
    #[arg(long, default_value_t = 5)]
    pub keys: usize,
    /// Random seed (default: from the clock). Fault timing is still real time.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write verdict.json and history.jsonl here (and keep the nodes' logs and data).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The `fencegate` binary (default: next to this binary, then target/release, then
    /// target/debug, then PATH).
    #[arg(long)]
    pub fencegate_bin: Option<PathBuf>,
    /// Node data dirs and logs (default: OUT/cluster, else a temp dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Only re-check the history.jsonl in this directory (of an earlier --out) and exit.
    #[arg(long)]
    pub recheck: Option<PathBuf>,
}

impl ChaosArgs {
    /// Refuses a run that could only pass by measuring nothing.
    fn validate(&self) -> anyhow::Result<()> {
        if self.duration_s == 0 {
            bail!("--duration-s must be at least 1: the checks need a workload to judge");
        }
        if self.workers + self.zombies + self.orderers + self.quota_clients == 0 {
            bail!(
                "no clients: --workers, --zombies, --orderers and --quota-clients are all 0, so \
                 there would be no history to check"
            );
        }
        if self.keys == 0 {
            bail!("--keys must be at least 1 (the contended keys the workers and zombies use)");
        }
        Ok(())
    }

    fn faults(&self) -> Vec<Fault> {
        let mut out = Vec::new();
        for c in &self.nemesis {
            let add: &[Fault] = match c {
                NemesisChoice::All => &Fault::ALL,
                NemesisChoice::None => &[],
                NemesisChoice::KillLeader => &[Fault::KillLeader],
                NemesisChoice::KillRandom => &[Fault::KillRandom],
                NemesisChoice::Pause => &[Fault::Pause],
                NemesisChoice::PartitionMinority => &[Fault::PartitionMinority],
                NemesisChoice::PartitionLeader => &[Fault::PartitionLeader],
                NemesisChoice::Bridge => &[Fault::Bridge],
                NemesisChoice::DropResponses => &[Fault::DropResponses],
                NemesisChoice::ClockOffset => &[Fault::ClockOffset],
            };
            for f in add {
                if !out.contains(f) {
                    out.push(*f);
                }
            }
        }
        out
    }
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.recheck {
        return recheck(dir);
    }
    args.validate()?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let faults = args.faults();
    if let Some(out) = &args.out {
        prepare_out(out)?;
    }
    let bin = find_fencegate_bin(args.fencegate_bin.as_deref())?;
    let data_dir = fresh_data_dir(&args)?;
    announce(&args, &faults, seed);
    let mut spec = cluster_spec(&args);
    let quota_setup = (args.quota_clients > 0).then(|| quota::setup(args.unsafe_refill_on_renew));
    if let Some(p) = spec.proxies.as_mut() {
        p.quota = quota_setup;
    }
    let (cluster, leader) =
        LocalCluster::start_ready(bin.clone(), data_dir, spec, Duration::from_secs(60)).await?;
    eprintln!(
        "chaos: cluster ready in {}, leader {leader}",
        cluster.dir.display()
    );

    let hist = Arc::new(History::new(
        args.out
            .as_ref()
            .map(|o| o.join("history.jsonl"))
            .as_deref(),
    )?);
    hist.note(
        "harness",
        "start",
        None,
        json!({
            "seed": seed,
            "duration_s": args.duration_s,
            "unsafe_no_fencing": args.unsafe_no_fencing,
            "unsafe_no_idempotency": args.unsafe_no_idempotency,
            "faults": faults.iter().map(|f| f.name()).collect::<Vec<_>>(),
            "workers": args.workers,
            "zombies": args.zombies,
            "orderers": args.orderers,
            "keys": args.keys,
            "fencegate_bin": bin.display().to_string(),
        }),
    );
    if let Some(q) = &quota_setup {
        quota::note(&hist, q, cluster.nodes.len());
    }
    let drops = Arc::new(DropSwitch::default());
    let client = client_of(&cluster, &hist, &drops)?;
    let cluster = Arc::new(Mutex::new(cluster));

    let stop_clients = Arc::new(AtomicBool::new(false));
    let mut clients = spawn_clients(&args, &client, &stop_clients, seed);
    clients.extend(quota::spawn(
        &client,
        args.quota_clients,
        &stop_clients,
        seed,
    ));
    let stop_nemesis = Arc::new(AtomicBool::new(false));
    let nemesis = Nemesis::new(
        cluster.clone(),
        hist.clone(),
        drops.clone(),
        faults.clone(),
        stop_nemesis.clone(),
        seed.wrapping_add(7),
    );
    let nemesis = tokio::spawn(nemesis.run());
    wait_out(Duration::from_secs(args.duration_s)).await;

    // Heal, then let the clients finish what they are doing.
    eprintln!("chaos: healing and stopping the clients");
    stop_nemesis.store(true, Ordering::SeqCst);
    let nemesis = nemesis.await.context("nemesis task")?;
    stop_clients.store(true, Ordering::SeqCst);
    let mut problems = join_clients(clients).await;
    hist.note("harness", "clients-stopped", None, json!({}));

    // The final state, read after the cluster recovered.
    let ready = {
        let c = cluster.lock().await;
        c.wait_ready(Duration::from_secs(60)).await
    };
    if let Err(e) = &ready {
        problems.push(format!("the cluster did not recover after the heal: {e}"));
        hist.note(
            "harness",
            "not-ready",
            None,
            json!({ "error": e.to_string() }),
        );
    }
    read_final_state(&client, &cluster).await;
    hist.flush();

    // Check.
    let events = hist.events();
    let m = checker::model(&events);
    let results = checker::check_all(&m);
    problems.extend(nemesis.crashes.iter().cloned());
    problems.extend(cluster.lock().await.crashed());
    let verdict = run_verdict(&args, seed, &faults, &m, &results, problems, &drops);
    verdict.print(&results);
    if let Some(out) = &args.out {
        write_file(
            &out.join("verdict.json"),
            serde_json::to_vec_pretty(&verdict)?,
        )?;
        eprintln!(
            "chaos: wrote {}/verdict.json and history.jsonl",
            out.display()
        );
    }
    if !verdict.valid {
        bail!(
            "chaos: {} violation(s){}",
            verdict.violations_total,
            if verdict.problems.is_empty() {
                String::new()
            } else {
                format!(", {} other problem(s)", verdict.problems.len())
            }
        );
    }
    Ok(())
}

/// Where the nodes keep their data: `--data-dir` (which must be empty), else OUT/cluster
/// (cleared), else a temp dir. A fresh cluster every run: old raft state would carry another
/// run's membership.
fn fresh_data_dir(args: &ChaosArgs) -> anyhow::Result<Option<PathBuf>> {
    Ok(match (&args.data_dir, &args.out) {
        (Some(d), _) => {
            if d.read_dir().is_ok_and(|mut e| e.next().is_some()) {
                bail!("--data-dir {} is not empty", d.display());
            }
            Some(d.clone())
        }
        (None, Some(out)) => {
            let d = out.join("cluster");
            if d.exists() {
                std::fs::remove_dir_all(&d).with_context(|| format!("clear {}", d.display()))?;
            }
            Some(d)
        }
        (None, None) => None,
    })
}

/// The run's mode: its name in verdict.json and the phrase the start-up line shows.
fn mode_names(args: &ChaosArgs) -> (&'static str, &'static str) {
    match (
        args.unsafe_no_fencing,
        args.unsafe_no_idempotency,
        args.unsafe_refill_on_renew,
    ) {
        (false, false, false) => ("fenced", "fenced"),
        (true, false, false) => ("unsafe-no-fencing", "UNSAFE (fencing off)"),
        (false, true, false) => ("unsafe-no-idempotency", "UNSAFE (idempotency records off)"),
        (false, false, true) => (
            "unsafe-refill-on-renew",
            "UNSAFE (buckets refill on renewal)",
        ),
        _ => ("unsafe-several", "UNSAFE (several safeguards off)"),
    }
}

fn announce(args: &ChaosArgs, faults: &[Fault], seed: u64) {
    let (_, mode) = mode_names(args);
    let faults = if faults.is_empty() {
        "none".to_string()
    } else {
        let names: Vec<&str> = faults.iter().map(|f| f.name()).collect();
        names.join(",")
    };
    eprintln!(
        "chaos: {}s, {} workers + {} zombies on {} keys, {} orderers, {mode}, faults: {faults}, \
         seed {seed}",
        args.duration_s, args.workers, args.zombies, args.keys, args.orderers,
    );
}

/// The recording client of the cluster's nodes, proxies and store.
fn client_of(
    cluster: &LocalCluster,
    hist: &Arc<History>,
    drops: &Arc<DropSwitch>,
) -> anyhow::Result<Client> {
    let endpoints: Vec<Endpoint> = cluster
        .nodes
        .iter()
        .map(|n| {
            Ok(Endpoint {
                id: n.id,
                api: n.api.clone(),
                proxy: n.proxy.clone().context("a chaos node runs a proxy")?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let store = cluster
        .store
        .clone()
        .context("the chaos cluster runs a demo store")?;
    Client::new(endpoints, store, hist.clone(), drops.clone())
}

/// The honest workers, the zombies and the orderers, each with its own seed, until `stop`.
fn spawn_clients(
    args: &ChaosArgs,
    client: &Client,
    stop: &Arc<AtomicBool>,
    seed: u64,
) -> Vec<JoinHandle<()>> {
    let workload = Arc::new(Workload {
        client: client.clone(),
        keys: (0..args.keys).map(|i| format!("k{i}")).collect(),
        stop: stop.clone(),
    });
    let workers = (0..args.workers).map(|i| {
        let seed = seed.wrapping_add(1 + i as u64);
        tokio::spawn(workers::worker(workload.clone(), i, seed))
    });
    let zombies = (0..args.zombies).map(|i| {
        let seed = seed.wrapping_add(1_000 + i as u64);
        tokio::spawn(workers::zombie(workload.clone(), i, seed))
    });
    let orderers = (0..args.orderers).map(|i| {
        let seed = seed.wrapping_add(2_000 + i as u64);
        tokio::spawn(orders::orderer(workload.clone(), i, seed))
    });
    workers.chain(zombies).chain(orderers).collect()
}

/// The run itself: the clients and the nemesis at work, a progress line every 15 s.
async fn wait_out(duration: Duration) {
    let started = Instant::now();
    let until = started + duration;
    let mut next_report = started + Duration::from_secs(15);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1).min(until - Instant::now())).await;
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(15);
            eprintln!("chaos: {}s …", started.elapsed().as_secs());
        }
    }
}

/// Waits for the stopped clients. Every call is bounded (at most a long poll plus 8 s): a
/// client still busy after 60 s means a request hung, which the API promises never happens.
async fn join_clients(clients: Vec<JoinHandle<()>>) -> Vec<String> {
    let mut problems = Vec::new();
    for c in clients {
        let abort = c.abort_handle();
        if tokio::time::timeout(Duration::from_secs(60), c)
            .await
            .is_err()
        {
            abort.abort();
            problems.push("a client did not finish its request within 60 s (a hang)".to_string());
        }
    }
    problems
}

/// After the run: a linearizable read of every resource the clients touched, each node's
/// cluster view (once they have caught up with each other), and the store's log.
async fn read_final_state(client: &Client, cluster: &Arc<Mutex<LocalCluster>>) {
    let events = client.history().events();
    let mut resources: Vec<String> = events
        .iter()
        .filter(|e| e.f == "acquire" && e.kind == EventType::Invoke)
        .filter_map(|e| value_as::<LockCall<AcquireRequest>>(&e.value))
        .map(|call| call.resource)
        .collect();
    resources.sort();
    resources.dedup();
    let ids: Vec<u64> = client.nodes.iter().map(|n| n.id).collect();
    for (i, r) in resources.iter().enumerate() {
        for attempt in 0..10 {
            let node = ids[(i + attempt) % ids.len()];
            if let Outcome::Ok(_) = client.read_lock("final", "final_read", node, r).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Wait until the replicas have applied the same prefix, then record their views.
    for _ in 0..50 {
        let views = cluster.lock().await.statuses().await;
        let applied: Vec<u64> = views.iter().map(|v| v.last_applied).collect();
        if views.len() == ids.len() && applied.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for id in ids {
        client.final_cluster("final", id).await;
    }
    client.store_log("final").await;
    client.limited_log("final").await;
}

/// The verdict of a run: what the checks found, how the run was set up, what the nemesis
/// did (every enabled fault kind is listed, also one that never came up).
#[allow(clippy::too_many_arguments)]
fn run_verdict(
    args: &ChaosArgs,
    seed: u64,
    faults: &[Fault],
    m: &checker::Model,
    results: &[checker::CheckResult],
    problems: Vec<String>,
    drops: &DropSwitch,
) -> Verdict {
    let (mode, _) = mode_names(args);
    let mut verdict = Verdict::new(mode, m, results, problems);
    verdict.run = Some(RunSetup {
        seed,
        duration_s: args.duration_s,
        workers: args.workers,
        zombies: args.zombies,
        orderers: args.orderers,
        keys: args.keys,
    });
    for f in faults {
        verdict
            .faults
            .by_kind
            .entry(f.name().to_string())
            .or_insert(0);
    }
    verdict.faults.responses_dropped_after_answer = Some(drops.dropped.load(Ordering::Relaxed));
    verdict.faults.requests_abandoned_in_flight = Some(drops.abandoned.load(Ordering::Relaxed));
    verdict
}

/// The output directory of a run that may end early: `--out` of a chaos run (not of a
/// recheck), where its history goes.
pub fn out_of_run(args: &ChaosArgs) -> Option<PathBuf> {
    args.recheck.is_none().then(|| args.out.clone()).flatten()
}

/// After a run was ended early (`why`): checks the history written up to then and writes
/// `verdict.json` for it, marked by a problem as cut short (so never `valid`). The checks that
/// need the run's end (the store's accepted-write log, the final state) had nothing to read.
/// Does nothing when the run ended before its history began.
pub fn check_cut_short(dir: &Path, why: &str) -> anyhow::Result<()> {
    let path = dir.join("history.jsonl");
    if !path.exists() {
        return Ok(());
    }
    let events = history::load(&path)?;
    let mut m = checker::model(&events);
    m.cut_short = true;
    let results = checker::check_all(&m);
    let problem = format!(
        "the run was cut short ({why}): the history up to then was checked, without the \
         store's accepted writes and the final state read at a run's end"
    );
    let verdict = Verdict::new("cut-short", &m, &results, vec![problem]);
    verdict.print(&results);
    write_file(
        &dir.join("verdict.json"),
        serde_json::to_vec_pretty(&verdict)?,
    )?;
    eprintln!(
        "chaos: wrote {}/verdict.json for the history written before the end",
        dir.display()
    );
    Ok(())
}

/// `--recheck DIR`: the checker alone, on a recorded history.
fn recheck(dir: &Path) -> anyhow::Result<()> {
    let events = history::load(&dir.join("history.jsonl"))?;
    let m = checker::model(&events);
    let results = checker::check_all(&m);
    let verdict = Verdict::new("recheck", &m, &results, Vec::new());
    verdict.print(&results);
    if !verdict.valid {
        bail!(
            "chaos: {} violation(s), {} other problem(s)",
            verdict.violations_total,
            verdict.problems.len()
        );
    }
    Ok(())
}
