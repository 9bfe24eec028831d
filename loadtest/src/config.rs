//! Command-line flags, profiles and the resolved workload.
//!
//! Every figure of the seed workload is a flag. A profile (`seed`, `smoke`) fills in the flags the user
//! did not give; an explicit flag always wins.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::cluster::LOCAL_NODES;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// The seed workload: 100k resources, 20k active locks, 2,000 acquires/s, renew every
    /// 10 s, TTL 30 s.
    Seed,
    /// A small, fast run for CI (< 30 s including cluster start): a scaled-down seed workload.
    Smoke,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The workload on a healthy cluster.
    Steady,
    /// One of the three nodes (a follower) is stopped for the whole run.
    ReplicaDown,
    /// The leader is SIGKILLed mid-run and restarted later.
    LeaderKill,
    /// A run long enough to cross several snapshots / log purges, reported per snapshot.
    Compaction,
    /// Raise the acquisition rate step by step until p99 passes the bound.
    Ramp,
    /// Closed loop: for each of `--clients`, that many clients each run lock cycles
    /// (acquire + release) back to back, then renew one lease back to back; throughput and
    /// latency per line. Ignores the open-loop workload flags and `--profile`.
    Cycles,
}

/// What the clients of a closed-loop line do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Loop {
    /// Acquire a random resource (fresh request id), release it, again.
    Cycle,
    /// Hold one lease and renew it, again (etcd: one LeaseKeepAlive round trip on the
    /// client's stream).
    Renew,
}

impl Loop {
    pub fn name(self) -> &'static str {
        match self {
            Loop::Cycle => "cycle",
            Loop::Renew => "renew",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    Fencegate,
    Etcd,
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            System::Fencegate => "fencegate",
            System::Etcd => "etcd",
        })
    }
}

/// Flags shared by `run` and `compare`.
#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// Defaults for the workload flags not given explicitly. The default is the short smoke
    /// run; `--profile seed` is the full seed workload (100k resources, 2,000 acquires/s),
    /// which overloads a small machine.
    #[arg(long, value_enum, default_value = "smoke")]
    pub profile: Profile,
    #[arg(long, value_enum, default_value = "steady")]
    pub scenario: Scenario,
    /// Write summary.json and SVG plots here (cycles: summary.json and summary.md; compare
    /// adds compare.json / compare.md and each system's files in its own folder).
    #[arg(long)]
    pub out: Option<PathBuf>,

    // ---- cluster -------------------------------------------------------------------------
    /// Use a running fencegate cluster instead of starting one: API base URLs, comma
    /// separated (127.0.0.1 / localhost only).
    #[arg(long, value_delimiter = ',')]
    pub target: Vec<String>,
    /// Fencing proxy URLs of the targeted cluster (for --writes-per-hold with --target).
    #[arg(long, value_delimiter = ',')]
    pub proxy_target: Vec<String>,
    /// The `fencegate` binary used to start local nodes (default: next to this binary, then
    /// target/release, then target/debug, then PATH).
    #[arg(long)]
    pub fencegate_bin: Option<PathBuf>,
    /// Keep node data directories and logs here instead of a temp dir.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Use a running etcd instead of starting one with scripts/etcd.sh (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// The script that installs/starts/stops the local etcd cluster.
    #[arg(long)]
    pub etcd_script: Option<PathBuf>,

    // ---- workload --------------------------------------------------------------------------
    /// Number of lockable resources (cycles: default 100000).
    #[arg(long)]
    pub resources: Option<u32>,
    /// Locks held at steady state (sets the hold time: active / rate, Little's law).
    #[arg(long)]
    pub active_locks: Option<u32>,
    /// Acquisitions per second (open loop; ramp: the first step).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Hold time per lock in ms (default: active_locks / rate), jittered ±50%.
    #[arg(long)]
    pub hold_ms: Option<u64>,
    /// Renew interval in ms.
    #[arg(long)]
    pub renew_interval_ms: Option<u64>,
    /// Renew jitter as a fraction of the interval (0.1 = ±10%).
    #[arg(long)]
    pub renew_jitter: Option<f64>,
    /// Lease TTL in ms (cycles: default 30000).
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// Measured run time in seconds (after warm-up; cycles: per line, default 15).
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Warm-up seconds at full rate before measuring (active locks build up; cycles: per
    /// line, default 2).
    #[arg(long)]
    pub warmup_s: Option<u64>,
    /// Fenced writes through the proxy per hold (0 = none).
    #[arg(long)]
    pub writes_per_hold: Option<u32>,
    /// Hot resources for contention (0 = none): acquires on them wait in FIFO queues.
    #[arg(long)]
    pub hot_resources: Option<u32>,
    /// Fraction of acquires that go to the hot resources.
    #[arg(long)]
    pub hot_fraction: Option<f64>,
    /// wait_timeout_ms for acquires on hot resources (cycles: for every acquire, default 1000).
    #[arg(long)]
    pub wait_timeout_ms: Option<u64>,
    /// Poisson arrivals instead of evenly spaced ones.
    #[arg(long)]
    pub poisson: bool,
    /// Pick resources in a sweep (next free index) instead of at random, so every resource
    /// is touched after `resources` acquisitions (for memory measurements at full size).
    #[arg(long)]
    pub sweep: bool,
    /// Random seed (resource choice, jitter, arrivals).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    // ---- client ----------------------------------------------------------------------------
    /// Concurrent requests (= HTTP connections) per node. Time spent waiting for a free
    /// connection counts in the latency (measured from the intended start). Default: 64 per
    /// node for the seed profile, 16 for the smoke one; with --leader-only the leader gets
    /// three nodes' worth (192 or 48), so both ways offer the cluster the same concurrency.
    #[arg(long)]
    pub connections: Option<usize>,
    /// Per-attempt request timeout in ms.
    #[arg(long, default_value_t = 5000)]
    pub request_timeout_ms: u64,
    /// Retries of an uncertain outcome (timeout, 503, connection error), same request id,
    /// moving to the next node.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Send every request to the leader instead of spreading them over the nodes, following
    /// the leader each answer names, as the Rust client does.
    #[arg(long)]
    pub leader_only: bool,

    // ---- scenarios -------------------------------------------------------------------------
    /// replica-down: delete the stopped follower's data directory before it is restarted after
    /// the run, as after a replaced disk: it rejoins from nothing, by the leader's snapshot.
    #[arg(long)]
    pub lose_data: bool,
    /// leader-kill: seconds into the measured run when the leader is killed (default: 1/3).
    #[arg(long)]
    pub fault_at_s: Option<u64>,
    /// leader-kill: seconds after the kill when the node is restarted.
    #[arg(long, default_value_t = 5)]
    pub restart_after_s: u64,
    /// ramp: seconds per step.
    #[arg(long)]
    pub ramp_step_s: Option<u64>,
    /// ramp: rate multiplier per step.
    #[arg(long, default_value_t = 1.5)]
    pub ramp_factor: f64,
    /// ramp: highest rate tried.
    #[arg(long, default_value_t = 100_000.0)]
    pub ramp_max_rate: f64,
    /// ramp: stop once p99 of a step passes this bound (ms).
    #[arg(long, default_value_t = 200.0)]
    pub ramp_bound_ms: f64,
    /// ramp: also report the highest rate under this tighter bound (ms).
    #[arg(long, default_value_t = 20.0)]
    pub ramp_tight_bound_ms: f64,
    /// cycles: client counts, one line per count and loop.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 64])]
    pub clients: Vec<usize>,
    /// cycles: which loops to run for each client count.
    #[arg(long = "loops", value_enum, value_delimiter = ',', default_values_t = [Loop::Cycle, Loop::Renew])]
    pub loops: Vec<Loop>,
    /// compaction: seconds between cluster polls (snapshot index).
    #[arg(long, default_value_t = 1)]
    pub poll_s: u64,
    /// Hard cap on any run's total time in seconds (a safety bound).
    #[arg(long, default_value_t = 3600)]
    pub max_total_s: u64,
}

impl RunArgs {
    /// The flags that shape the run rather than the workload (the workload's are checked by
    /// [`Workload::resolve`]): refused before anything starts, with what to give instead.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.max_total_s == 0 {
            bail!("--max-total-s must be at least 1 (seconds)");
        }
        if self.scenario == Scenario::Ramp {
            self.validate_ramp()?;
        }
        Ok(())
    }

    /// The ramp multiplies the rate every step until a bound is passed: a factor of 1 or
    /// less never gets there (a rate of 0 cannot even be scheduled), and a step of 0 s
    /// measures nothing.
    fn validate_ramp(&self) -> anyhow::Result<()> {
        if self.ramp_step_s == Some(0) {
            bail!("--ramp-step-s must be at least 1 (seconds per step)");
        }
        if !(self.ramp_factor.is_finite() && self.ramp_factor > 1.0) {
            bail!(
                "--ramp-factor must be a number above 1 (the rate is multiplied by it every \
                 step), not {}",
                self.ramp_factor
            );
        }
        if !(self.ramp_max_rate > 0.0 && self.ramp_max_rate <= MAX_RATE) {
            bail!("--ramp-max-rate must be in (0, {MAX_RATE}]");
        }
        if !(self.ramp_bound_ms.is_finite() && self.ramp_bound_ms > 0.0) {
            bail!("--ramp-bound-ms must be a positive number of milliseconds");
        }
        if !(self.ramp_tight_bound_ms > 0.0 && self.ramp_tight_bound_ms <= self.ramp_bound_ms) {
            bail!("--ramp-tight-bound-ms must be positive and at most --ramp-bound-ms");
        }
        Ok(())
    }
}

/// The arrival rates the open loop schedules (per second): the gap between two arrivals
/// must be a `Duration`.
pub const MIN_RATE: f64 = 0.01;
pub const MAX_RATE: f64 = 1_000_000.0;

/// Creates `--out` (if missing) and checks that a file can be written in it, so that a run is
/// refused before it starts rather than after it ends.
pub fn prepare_out(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create --out {}", dir.display()))?;
    tempfile::Builder::new()
        .prefix(".fencegate-loadtest-probe-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write files in --out {}", dir.display()))?;
    Ok(())
}

/// The resolved workload.
#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    pub resources: u32,
    pub active_locks: u32,
    pub rate: f64,
    /// Fixed hold time, or None for active_locks / current rate.
    pub hold_ms: Option<u64>,
    pub renew_interval_ms: u64,
    pub renew_jitter: f64,
    pub ttl_ms: u64,
    pub duration_s: u64,
    pub warmup_s: u64,
    pub writes_per_hold: u32,
    pub hot_resources: u32,
    pub hot_fraction: f64,
    pub wait_timeout_ms: u64,
    pub poisson: bool,
    pub sweep: bool,
    pub seed: u64,
    pub connections: usize,
    pub request_timeout_ms: u64,
    pub retries: u32,
    pub leader_only: bool,
}

impl Workload {
    pub fn resolve(a: &RunArgs) -> anyhow::Result<Self> {
        let seed = a.profile == Profile::Seed;
        let pick = |v: Option<u64>, seed_v: u64, smoke_v: u64| {
            v.unwrap_or(if seed { seed_v } else { smoke_v })
        };
        let w = Workload {
            resources: a.resources.unwrap_or(if seed { 100_000 } else { 5_000 }),
            active_locks: a.active_locks.unwrap_or(if seed { 20_000 } else { 150 }),
            rate: a.rate.unwrap_or(if seed { 2_000.0 } else { 50.0 }),
            hold_ms: a.hold_ms,
            renew_interval_ms: pick(a.renew_interval_ms, 10_000, 1_000),
            renew_jitter: a.renew_jitter.unwrap_or(0.1),
            ttl_ms: pick(a.ttl_ms, 30_000, 5_000),
            duration_s: pick(a.duration_s, 60, 8),
            warmup_s: pick(a.warmup_s, 15, 1),
            writes_per_hold: a.writes_per_hold.unwrap_or(if seed { 0 } else { 1 }),
            hot_resources: a.hot_resources.unwrap_or(0),
            hot_fraction: a.hot_fraction.unwrap_or(0.0),
            wait_timeout_ms: a.wait_timeout_ms.unwrap_or(1_000),
            poisson: a.poisson,
            sweep: a.sweep,
            seed: a.seed,
            connections: a.connections.unwrap_or_else(|| {
                let per_node = if seed { 64 } else { 16 };
                // Spread over the nodes, calls have one pool per node; to the leader, one pool
                // carries them all. A pool of one node's size capped the offered rate at
                // connections / latency once the latency grew, and the queue in front of it
                // looked like the servers' latency.
                if a.leader_only {
                    LOCAL_NODES * per_node
                } else {
                    per_node
                }
            }),
            request_timeout_ms: a.request_timeout_ms,
            retries: a.retries,
            leader_only: a.leader_only,
        };
        w.validate()?;
        Ok(w)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.resources == 0 || self.resources > 10_000_000 {
            bail!("--resources must be 1..=10000000");
        }
        if !(MIN_RATE..=MAX_RATE).contains(&self.rate) {
            bail!("--rate must be in [{MIN_RATE}, {MAX_RATE}] (acquisitions per second)");
        }
        if self.active_locks >= self.resources {
            bail!("--active-locks must be below --resources (the harness acquires free resources)");
        }
        if self.hot_resources >= self.resources / 2 {
            bail!("--hot-resources must be well below --resources");
        }
        if !(0.0..=1.0).contains(&self.hot_fraction) || !(0.0..1.0).contains(&self.renew_jitter) {
            bail!("--hot-fraction must be in [0,1] and --renew-jitter in [0,1)");
        }
        if self.ttl_ms < 1_000
            || self.renew_interval_ms == 0
            || self.renew_interval_ms >= self.ttl_ms
        {
            bail!("need --ttl-ms >= 1000 and 0 < --renew-interval-ms < --ttl-ms");
        }
        if self.duration_s == 0 || self.connections == 0 {
            bail!("--duration-s and --connections must be positive");
        }
        Ok(())
    }

    /// Mean hold time at `rate` arrivals per second.
    pub fn hold_at(&self, rate: f64) -> Duration {
        match self.hold_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs_f64(self.active_locks as f64 / rate),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    pub fn client_opts(&self) -> ClientOpts {
        ClientOpts {
            connections: self.connections,
            timeout: self.request_timeout(),
            retries: self.retries,
            leader_only: self.leader_only,
        }
    }
}

/// How the harness's client talks to the system under test.
#[derive(Clone, Debug)]
pub struct ClientOpts {
    /// Concurrent requests (= connections) per node.
    pub connections: usize,
    /// Per attempt.
    pub timeout: Duration,
    /// Of an uncertain outcome, with the same ids, on the next node (fencegate).
    pub retries: u32,
    /// Everything to the leader instead of round robin over the nodes (fencegate).
    pub leader_only: bool,
}

/// Only loopback addresses are ever load targets.
pub fn check_loopback(url: &str) -> anyhow::Result<String> {
    let url = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let parsed = reqwest::Url::parse(&url).with_context(|| format!("bad URL '{url}'"))?;
    match parsed.host_str() {
        Some("127.0.0.1") | Some("localhost") | Some("[::1]") | Some("::1") => {}
        other => {
            bail!("refusing to load a non-loopback target {other:?}: only 127.0.0.1/localhost")
        }
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// The flags of `run` as parsed from `args` (tests of what they resolve to).
#[cfg(test)]
pub fn run_args(args: &[&str]) -> RunArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }
    <Cli as clap::Parser>::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
        .expect("valid flags")
        .run
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_only() {
        assert!(check_loopback("127.0.0.1:7001").is_ok());
        assert!(check_loopback("http://localhost:7001/").is_ok());
        assert!(check_loopback("http://10.0.0.1:7001").is_err());
        assert!(check_loopback("example.com:80").is_err());
    }

    fn workload(args: &[&str]) -> Workload {
        Workload::resolve(&run_args(args)).expect("valid workload")
    }

    /// A ramp that cannot rise (factor ≤ 1: the rate goes to 0, which cannot be scheduled)
    /// or steps of 0 s (nothing measured, NaN rates) is refused; the defaults pass.
    #[test]
    fn ramp_flags_that_cannot_ramp_are_refused() {
        let ramp = |extra: &[&str]| {
            let mut args = vec!["--scenario", "ramp"];
            args.extend_from_slice(extra);
            run_args(&args).validate()
        };
        assert!(ramp(&[]).is_ok());
        for bad in [
            &["--ramp-factor", "0"][..],
            &["--ramp-factor", "1"],
            &["--ramp-factor", "NaN"],
            &["--ramp-factor", "inf"],
            &["--ramp-step-s", "0"],
            &["--ramp-max-rate", "0"],
            &["--ramp-bound-ms", "0"],
            &["--ramp-tight-bound-ms", "300"],
            &["--max-total-s", "0"],
        ] {
            assert!(ramp(bad).is_err(), "{bad:?} accepted");
        }
        // Ramp flags are the ramp's: another scenario ignores them.
        assert!(run_args(&["--ramp-factor", "0"]).validate().is_ok());
        assert!(Workload::resolve(&run_args(&["--rate", "0"])).is_err());
    }

    #[test]
    fn calls_to_the_leader_get_every_nodes_connections_unless_told() {
        assert_eq!(workload(&["--profile", "seed"]).connections, 64);
        assert_eq!(
            workload(&["--profile", "seed", "--leader-only"]).connections,
            192
        );
        assert_eq!(workload(&["--leader-only"]).connections, 48);
        let told = workload(&["--profile", "seed", "--leader-only", "--connections", "64"]);
        assert_eq!(told.connections, 64);
    }
}
