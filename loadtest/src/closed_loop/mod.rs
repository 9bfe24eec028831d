//! The closed-loop benchmark (`--scenario cycles`): how many lock cycles and renewals a
//! system completes when N clients each send their next call the moment the previous one is
//! answered, and at what latency.
//!
//! The open-loop scenarios ask "how late is the answer at this offered rate"; this one asks
//! "how fast can it go": for each client count (`--clients 1,16,64`) and each loop
//! (`--loops cycle,renew`) a line of `--warmup-s` (default 2) and `--duration-s` (default 15)
//! seconds, one after another on one fresh cluster. A *cycle* is an acquire of a random
//! resource out of `--resources` (default 100,000; fresh request id, TTL `--ttl-ms`, default
//! 30 s) and its release; on etcd a lease grant, a lock with that lease, an unlock and a
//! lease revoke. A *renewal* renews the client's one held lease: fencegate `/renew`, etcd one
//! request and response on the lease's `LeaseKeepAlive` stream. `compare --scenario cycles`
//! starts fencegate's three nodes and etcd's three members, each fresh, and runs every line on
//! both back to back, taking turns at going first: a machine whose speed drifts over minutes
//! then moves both sides of a ratio alike.
//!
//! Acquires wait for a busy resource (up to `--wait-timeout-ms`, default 1 s) on both
//! systems, as etcd's lock always does: two clients drawing the same resource queue rather
//! than one failing, and the holds of one resource never overlap, which is what the checks
//! rely on ([`check`]).

mod check;
mod line;
mod report;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;

use crate::backend::Backend;
use crate::cluster::process::{cpu_s, process_cpu_s, rss_mib};
use crate::config::{ClientOpts, Loop, RunArgs, System};
use crate::report::Machine;
use crate::scenario::SystemUnderTest;
use check::Check;
use line::{Plan, Tally};
use report::{ClosedLoopSummary, LineReport, Rss};

/// The closed loop's settings, resolved from the flags.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub clients: Vec<usize>,
    pub loops: Vec<Loop>,
    pub resources: u32,
    pub ttl_ms: u64,
    pub wait_ms: u64,
    pub warmup_s: u64,
    pub duration_s: u64,
    pub request_timeout_ms: u64,
    pub retries: u32,
    pub leader_only: bool,
    pub seed: u64,
}

impl Config {
    fn resolve(a: &RunArgs) -> anyhow::Result<Self> {
        let c = Config {
            clients: a.clients.clone(),
            loops: a.loops.clone(),
            resources: a.resources.unwrap_or(100_000),
            ttl_ms: a.ttl_ms.unwrap_or(30_000),
            wait_ms: a.wait_timeout_ms.unwrap_or(1_000),
            warmup_s: a.warmup_s.unwrap_or(2),
            duration_s: a.duration_s.unwrap_or(15),
            request_timeout_ms: a.request_timeout_ms,
            retries: a.retries,
            leader_only: a.leader_only,
            seed: a.seed,
        };
        let max_clients = c.clients.iter().copied().max().unwrap_or(0);
        if c.clients.is_empty() || c.clients.contains(&0) || max_clients > 10_000 {
            bail!("--clients must list client counts in 1..=10000");
        }
        if c.loops.is_empty() {
            bail!("--loops must name at least one of cycle, renew");
        }
        if c.resources as usize <= max_clients || c.resources > 10_000_000 {
            bail!("--resources must be above the largest client count and at most 10000000");
        }
        if c.ttl_ms < 1_000 || c.duration_s == 0 {
            bail!("need --ttl-ms >= 1000 and --duration-s >= 1");
        }
        if c.wait_ms == 0 || c.wait_ms >= c.ttl_ms {
            bail!("--wait-timeout-ms must be positive and below --ttl-ms");
        }
        let total = c.lines() as u64 * (c.warmup_s + c.duration_s);
        if total > a.max_total_s {
            bail!(
                "{} lines of {} s are {total} s, more than --max-total-s {}",
                c.lines(),
                c.warmup_s + c.duration_s,
                a.max_total_s
            );
        }
        Ok(c)
    }

    fn lines(&self) -> usize {
        self.clients.len() * self.loops.len()
    }

    /// The lines in the order they run: each client count through every loop.
    fn line_specs(&self) -> Vec<(Loop, usize)> {
        self.clients
            .iter()
            .flat_map(|&clients| self.loops.iter().map(move |&what| (what, clients)))
            .collect()
    }

    fn client_opts(&self) -> ClientOpts {
        ClientOpts {
            // One connection per client on every node: a client never waits for another.
            connections: self.clients.iter().copied().max().unwrap_or(1),
            timeout: Duration::from_millis(self.request_timeout_ms),
            retries: self.retries,
            leader_only: self.leader_only,
        }
    }

    /// How long the calls of a line may still take after it ends: every retry of the
    /// slowest call, and a little more.
    fn settle(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms + self.wait_ms) * (self.retries + 1)
            + Duration::from_secs(2)
    }
}

/// `run --scenario cycles`: one system.
pub async fn run(args: &RunArgs, system: System) -> anyhow::Result<()> {
    let cfg = Config::resolve(args)?;
    let http = status_client()?;
    let mut bench = Bench::start(args, &cfg, system, &http).await?;
    for (what, clients) in cfg.line_specs() {
        bench.line(&cfg, what, clients).await;
    }
    let s = bench.finish(&cfg, &http).await;
    s.print();
    if let Some(dir) = &args.out {
        s.write_out(dir)?;
        println!("wrote {}/summary.json and summary.md", dir.display());
    }
    if s.violations() > 0 {
        bail!("safety violations found (see above)");
    }
    nothing_measured(&s.empty_lines())
}

/// An error naming the lines that completed nothing, if any did.
fn nothing_measured(empty: &[String]) -> anyhow::Result<()> {
    if !empty.is_empty() {
        bail!(
            "nothing was measured on {}: not one call completed (the errors are listed above)",
            empty.join(", ")
        );
    }
    Ok(())
}

/// `compare --scenario cycles`: fencegate and etcd, each started fresh, every line on both
/// back to back, taking turns at going first.
pub async fn compare(args: &RunArgs) -> anyhow::Result<()> {
    let cfg = Config::resolve(args)?;
    let (fg_args, etcd_args) = crate::compare::split_args(args);
    let http = status_client()?;
    let mut fg = Bench::start(&fg_args, &cfg, System::Fencegate, &http).await?;
    let mut et = match Bench::start(&etcd_args, &cfg, System::Etcd, &http).await {
        Ok(b) => b,
        Err(e) => {
            fg.sut.stop();
            return Err(e);
        }
    };
    for (n, (what, clients)) in cfg.line_specs().into_iter().enumerate() {
        let (first, second) = if n % 2 == 0 {
            (&mut fg, &mut et)
        } else {
            (&mut et, &mut fg)
        };
        first.line(&cfg, what, clients).await;
        second.line(&cfg, what, clients).await;
    }
    let fg = fg.finish(&cfg, &http).await;
    fg.print();
    let et = et.finish(&cfg, &http).await;
    et.print();
    let rows = report::compare_rows(&fg, &et);
    report::print_compare(&rows, &fg, &et);
    if let Some(dir) = &args.out {
        report::write_compare(dir, &rows, &fg, &et)?;
        println!("wrote {}/compare.json and compare.md", dir.display());
    }
    if fg.violations() + et.violations() > 0 {
        bail!("safety violations found (see above)");
    }
    let mut empty = fg.empty_lines();
    empty.extend(et.empty_lines());
    nothing_measured(&empty)
}

/// The client the harness asks a system's status with (not the load's own connections).
fn status_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?)
}

/// One freshly started system through a closed-loop run: its lines, then its memory, then
/// stop it.
struct Bench {
    system: System,
    /// The machine as it was when the system started (its load average then).
    machine: Machine,
    sut: SystemUnderTest,
    shared: Shared,
    lines: Vec<LineReport>,
    warnings: Vec<String>,
}

impl Bench {
    async fn start(
        args: &RunArgs,
        cfg: &Config,
        system: System,
        http: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        let machine = Machine::read();
        eprintln!("{system}: closed loop, {} lines", cfg.lines());
        let sut = SystemUnderTest::start(args, system, false, http).await?;
        let backend = match sut.client(&cfg.client_opts(), http, &sut.bases).await {
            Ok(b) => Arc::new(b),
            Err(e) => {
                sut.stop();
                return Err(e);
            }
        };
        let shared = Shared {
            backend,
            check: Arc::new(Check::new(cfg.resources, system == System::Fencegate)),
            // Request ids must not repeat a previous run's against the same (--target) cluster.
            run_id: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        Ok(Bench {
            system,
            machine,
            sut,
            shared,
            lines: Vec::new(),
            warnings: Vec::new(),
        })
    }

    /// The next line: `clients` clients running `what`.
    async fn line(&mut self, cfg: &Config, what: Loop, clients: usize) {
        let (l, w) = run_line(
            cfg,
            &self.sut,
            &self.shared,
            what,
            clients,
            self.lines.len(),
        )
        .await;
        eprintln!(
            "  {} {} × {clients}: {:.0}/s, p99 {:.2} ms, {} errors",
            self.system,
            what.name(),
            l.per_s,
            l.p99_ms,
            l.errors
        );
        self.warnings.extend(w);
        self.lines.push(l);
    }

    /// The summary of the lines run, with the system's memory now; stops the system.
    async fn finish(self, cfg: &Config, http: &reqwest::Client) -> ClosedLoopSummary {
        let Bench {
            system,
            machine,
            sut,
            shared,
            lines,
            warnings,
        } = self;
        let rss = sut
            .pids
            .snapshot()
            .into_iter()
            .filter_map(|(i, pid)| {
                let (rss_mib, peak_mib) = rss_mib(pid)?;
                Some((format!("node{}", i + 1), Rss { rss_mib, peak_mib }))
            })
            .collect();
        let checks = shared.check.report();
        let server_token_consistent = sut
            .last_token(http)
            .await
            .map(|t| t >= checks.invariants.max_token);
        let summary = ClosedLoopSummary {
            system: system.to_string(),
            scenario: "cycles",
            cluster: sut.desc.clone(),
            machine,
            config: cfg.clone(),
            lines,
            rss,
            checks,
            server_token_consistent,
            node_failures: sut.crashed(),
            warnings,
        };
        drop(shared);
        sut.stop();
        summary
    }
}

/// What every line of one system shares.
struct Shared {
    backend: Arc<Backend>,
    check: Arc<Check>,
    run_id: u64,
}

/// One line: `clients` tasks from now through warm-up and the measured span; the harness's
/// and the servers' CPU over the whole line.
async fn run_line(
    cfg: &Config,
    sut: &SystemUnderTest,
    shared: &Shared,
    what: Loop,
    clients: usize,
    line: usize,
) -> (LineReport, Vec<String>) {
    let pids = sut.pids.snapshot();
    let server_cpu = || -> Option<f64> { pids.values().map(|p| cpu_s(*p)).sum() };
    let (self_cpu0, server_cpu0) = (process_cpu_s(), server_cpu());
    let started = Instant::now();
    let warm_end = started + Duration::from_secs(cfg.warmup_s);
    let plan = Plan {
        what,
        backend: shared.backend.clone(),
        check: shared.check.clone(),
        run_id: shared.run_id,
        line,
        resources: cfg.resources,
        ttl_ms: cfg.ttl_ms,
        wait_ms: cfg.wait_ms,
        seed: cfg.seed,
        warm_end,
        end: warm_end + Duration::from_secs(cfg.duration_s),
    };
    let mut handles: Vec<_> = (0..clients)
        .map(|id| tokio::spawn(line::client(plan.clone(), id)))
        .collect();
    let deadline = tokio::time::Instant::from(plan.end) + cfg.settle();
    let mut total = Tally::empty();
    let mut warnings = Vec::new();
    let mut stuck = 0;
    for h in &mut handles {
        match tokio::time::timeout_at(deadline, &mut *h).await {
            Ok(Ok(t)) => total.merge(t),
            Ok(Err(e)) => warnings.push(format!("a {} client failed: {e}", what.name())),
            Err(_) => {
                h.abort();
                stuck += 1;
            }
        }
    }
    if stuck > 0 {
        warnings.push(format!(
            "{stuck} {} clients still waiting {:.0} s after the line ended (stopped)",
            what.name(),
            cfg.settle().as_secs_f64()
        ));
    }
    let wall = started.elapsed().as_secs_f64().max(1e-3);
    let mut l = LineReport::new(what, clients, cfg.duration_s as f64, &total);
    l.harness_cpu_cores = (process_cpu_s() - self_cpu0) / wall;
    l.server_cpu_cores = match (server_cpu0, server_cpu()) {
        (Some(a), Some(b)) if !pids.is_empty() => Some((b - a) / wall),
        _ => None,
    };
    (l, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Config {
        Config::resolve(&crate::config::run_args(args)).expect("valid closed loop")
    }

    #[test]
    fn lines_run_each_client_count_through_every_loop() {
        let c = config(&["--clients", "1,16,64", "--loops", "cycle,renew"]);
        assert_eq!(
            c.line_specs(),
            vec![
                (Loop::Cycle, 1),
                (Loop::Renew, 1),
                (Loop::Cycle, 16),
                (Loop::Renew, 16),
                (Loop::Cycle, 64),
                (Loop::Renew, 64),
            ]
        );
        assert_eq!(c.line_specs().len(), c.lines());
        let one = config(&["--clients", "8", "--loops", "renew"]);
        assert_eq!(one.line_specs(), vec![(Loop::Renew, 8)]);
    }
}
