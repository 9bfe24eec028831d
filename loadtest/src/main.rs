//! `fencegate-loadtest`: the load and chaos harness: the seed workload against a cluster it
//! starts (or a running one), side by side with etcd, and a fault-injection test with an
//! invariant checker.
//!
//! ```text
//! fencegate-loadtest run --out /tmp/smoke                           # short smoke run, own cluster
//! fencegate-loadtest run --profile seed --scenario leader-kill      # seed workload, kill leader
//! fencegate-loadtest run --profile seed --system etcd --scenario ramp  # etcd via scripts/etcd.sh
//! fencegate-loadtest compare --profile seed --out out/compare       # both, one table
//! fencegate-loadtest compare --scenario cycles --out out/cycles     # closed loop, 1/16/64 clients
//! fencegate-loadtest chaos --duration-s 60 --out out/chaos           # faults + invariant checker
//! fencegate-loadtest idempotency --duration-s 10                    # against a running dev
//! fencegate-loadtest quota --out out/quota                          # rate limit, demand moving
//! ```
//!
//! Open loop (every scenario but `cycles`): arrivals never wait for responses, and latency is measured from each
//! operation's scheduled start, so a stalled server shows up as latency, not as a lower
//! offered rate. `cycles` is closed loop: N clients each send the next call when the last one
//! is answered, to find the highest rate. Every run is bounded in time (`--max-total-s`) and
//! only targets 127.0.0.1.

mod backend;
mod chaos;
mod closed_loop;
mod cluster;
mod compare;
mod config;
mod handoff;
mod idempotency;
mod ledger;
mod plot;
mod poller;
mod quota;
mod quota_window;
mod report;
mod scenario;
mod stats;
mod workload;

use clap::{Parser, Subcommand};

use config::{RunArgs, Scenario, System};

#[derive(Parser)]
#[command(
    name = "fencegate-loadtest",
    version,
    about = "Load and chaos harness for fencegate, with an etcd driver for comparison"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one scenario against one system.
    Run {
        #[arg(long, value_enum, default_value = "fencegate")]
        system: System,
        #[command(flatten)]
        args: RunArgs,
    },
    /// Run the same scenario against fencegate, then etcd, and print both side by side (the
    /// closed loop, `--scenario cycles`, runs each of its lines on both in turn).
    Compare {
        #[command(flatten)]
        args: RunArgs,
    },
    /// How fast one hot lock passes between holders that write through the fencing proxy
    /// (against a running cluster, `fencegate dev` by default).
    Handoff(handoff::HandoffArgs),
    /// Create-order traffic with Idempotency-Key through the proxies of a running
    /// `fencegate dev` (with retried and concurrent duplicates): latency added over a route
    /// without idempotency, and duplicates in the store (must be 0).
    Idempotency(idempotency::IdempotencyArgs),
    /// Jepsen-style test: clients, zombies and a nemesis against a 3-process cluster, then
    /// one check per invariant (docs/verification.md). Exit 0 only without violations.
    Chaos(chaos::ChaosArgs),
    /// A global rate limit while demand moves from proxy 1 to proxy 3 (own cluster):
    /// utilisation, convergence time and overshoot (must be 0), per-second series and a plot.
    Quota(quota::QuotaArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match cli.cmd {
            Cmd::Run { system, args } if args.scenario == Scenario::Cycles => {
                closed_loop::run(&args, system).await
            }
            Cmd::Run { system, args } => {
                let result = scenario::run_and_print(&args, system).await?;
                if let Some(dir) = &args.out {
                    result.write_out(dir)?;
                    println!("wrote {}/summary.json and plots", dir.display());
                }
                let s = &result.summary;
                if s.invariants.violations_total() > 0 || s.server_token_consistent == Some(false) {
                    anyhow::bail!("safety violations found (see above)");
                }
                Ok(())
            }
            Cmd::Compare { args } if args.scenario == Scenario::Cycles => {
                closed_loop::compare(&args).await
            }
            Cmd::Compare { args } => compare::run(&args).await,
            Cmd::Chaos(args) => chaos::run(args).await,
            Cmd::Handoff(args) => handoff::run(args).await,
            Cmd::Idempotency(args) => idempotency::run(args).await,
            Cmd::Quota(args) => quota::run(args).await,
        }
    })
}
