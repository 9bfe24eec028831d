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
//! fencegate-loadtest timer-lateness                                 # how late sends go out
//! ```
//!
//! Open loop (every scenario but `cycles`): arrivals never wait for responses, and latency is measured from each
//! operation's scheduled start, so a stalled server shows up as latency, not as a lower
//! offered rate. `cycles` is closed loop: N clients each send the next call when the last one
//! is answered, to find the highest rate. Every run is bounded in time (`--max-total-s`) and
//! only targets 127.0.0.1. Its flags are checked before anything starts; SIGINT, SIGTERM or a
//! panicking task end it with every process it started stopped and its temp dirs removed
//! ([`interrupt`]).

mod backend;
mod chaos;
mod closed_loop;
mod cluster;
mod compare;
mod config;
mod handoff;
mod idempotency;
mod interrupt;
mod lateness;
mod ledger;
mod plot;
mod poller;
mod quota;
mod quota_window;
mod report;
mod scenario;
mod stats;
mod timer;
mod workload;

use std::process::ExitCode;

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
    /// How late the open loop's requests go out against their schedule (no cluster: a
    /// trivial local responder), with tokio's timer and with the harness's own.
    TimerLateness(lateness::LatenessArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let chaos_out = match &cli.cmd {
        Cmd::Chaos(args) => chaos::out_of_run(args),
        _ => None,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ended = rt.block_on(async {
        if let Err(e) = interrupt::install() {
            return Ended::Done(Err(e.context("install the signal handlers")));
        }
        tokio::select! {
            r = run(cli.cmd) => Ended::Done(r),
            why = async {
                let why = interrupt::wait().await;
                let again = match why {
                    interrupt::Reason::Signal(_) => " (a second signal ends it at once)",
                    interrupt::Reason::Panic(_) => "",
                };
                eprintln!(
                    "\n{why}: stopping the workload and every process the harness started, \
                     removing its temp dirs{again}"
                );
                why
            } => Ended::Stopped(why),
        }
    });
    // The command's future is gone (on a stop, dropped where it stood); dropping the runtime
    // drops every task still running, and with them what they hold: clusters stop their
    // processes and remove their temp dirs, the chaos history flushes its last line.
    drop(rt);
    match ended {
        Ended::Done(Ok(())) => ExitCode::SUCCESS,
        Ended::Done(Err(e)) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
        Ended::Stopped(why) => {
            if let Some(dir) = chaos_out {
                if let Err(e) = chaos::check_cut_short(&dir, &why.to_string()) {
                    eprintln!("Error: check the history of the run cut short: {e:?}");
                }
            }
            ExitCode::from(why.exit_code())
        }
    }
}

/// How a command ended.
enum Ended {
    Done(anyhow::Result<()>),
    Stopped(interrupt::Reason),
}

async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Run { system, args } => {
            scenario::check_args(&args, system)?;
            if args.scenario == Scenario::Cycles {
                return closed_loop::run(&args, system).await;
            }
            let result = scenario::run_and_print(&args, system).await?;
            if let Some(dir) = &args.out {
                result.write_out(dir)?;
                println!("wrote {}/summary.json and plots", dir.display());
            }
            result.verdict()
        }
        Cmd::Compare { args } => {
            compare::check_args(&args)?;
            if args.scenario == Scenario::Cycles {
                closed_loop::compare(&args).await
            } else {
                compare::run(&args).await
            }
        }
        Cmd::Chaos(args) => chaos::run(args).await,
        Cmd::Handoff(args) => handoff::run(args).await,
        Cmd::Idempotency(args) => idempotency::run(args).await,
        Cmd::Quota(args) => quota::run(args).await,
        Cmd::TimerLateness(args) => lateness::run(args).await,
    }
}
