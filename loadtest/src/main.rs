//! `fencegate-loadtest`: the load and chaos harness of SPEC §2 / §7.
//!
//! ```text
//! fencegate-loadtest run --profile smoke --out /tmp/smoke            # CI: < 30 s, own cluster
//! fencegate-loadtest run --scenario leader-kill --out out/kill       # seed workload, kill leader
//! fencegate-loadtest run --system etcd --scenario ramp               # etcd via scripts/etcd.sh
//! fencegate-loadtest compare --out out/compare                       # both, one table
//! fencegate-loadtest chaos --duration-s 60 --out out/chaos           # faults + invariant checker
//! ```
//!
//! Open loop: arrivals never wait for responses, and latency is measured from each
//! operation's scheduled start, so a stalled server shows up as latency, not as a lower
//! offered rate. Every run is bounded in time (`--max-total-s`) and only targets 127.0.0.1.

mod backend;
mod chaos;
mod cluster;
mod config;
mod ledger;
mod plot;
mod poller;
mod report;
mod scenario;
mod stats;
mod workload;

use std::path::Path;

use clap::{Parser, Subcommand};
use serde_json::json;

use config::{RunArgs, System};
use report::Artifacts;
use scenario::RunResult;

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
    /// Run the same scenario against fencegate, then etcd, and print both side by side.
    Compare {
        #[command(flatten)]
        args: RunArgs,
    },
    /// Jepsen-style test: clients, zombies and a nemesis against a 3-process cluster, then
    /// one check per invariant (docs/verification.md). Exit 0 only without violations.
    Chaos(chaos::ChaosArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match cli.cmd {
            Cmd::Run { system, args } => {
                let result = run_one(&args, system, args.out.as_deref()).await?;
                let s = &result.summary;
                if s.invariants.violations_total() > 0 || s.server_token_consistent == Some(false) {
                    anyhow::bail!("safety violations found (see above)");
                }
                Ok(())
            }
            Cmd::Compare { args } => compare(&args).await,
            Cmd::Chaos(args) => chaos::run(args).await,
        }
    })
}

async fn run_one(args: &RunArgs, system: System, out: Option<&Path>) -> anyhow::Result<RunResult> {
    eprintln!(
        "{system}: {:?} scenario, {:?} profile",
        args.scenario, args.profile
    );
    let mut result = scenario::run(args, system).await?;
    report::print_table(&result.summary);
    if let Some(dir) = out {
        report::write_out(
            dir,
            &Artifacts {
                summary: &result.summary,
                cdf: std::mem::take(&mut result.cdf),
                timeline: &result.timeline,
                samples: &result.samples,
            },
        )?;
        println!("wrote {}/summary.json and plots", dir.display());
    }
    Ok(result)
}

async fn compare(args: &RunArgs) -> anyhow::Result<()> {
    let out = args.out.clone();
    let fg_out = out.as_ref().map(|d| d.join("fencegate"));
    let etcd_out = out.as_ref().map(|d| d.join("etcd"));
    let mut fg_args = args.clone();
    let mut etcd_args = args.clone();
    if let Some(d) = &args.data_dir {
        fg_args.data_dir = Some(d.join("fencegate"));
        etcd_args.data_dir = Some(d.join("etcd"));
    }
    // Cdf series are consumed by write_out; keep copies for the overlay plot.
    let fg = run_one(&fg_args, System::Fencegate, None).await?;
    let et = run_one(&etcd_args, System::Etcd, None).await?;
    let violations =
        fg.summary.invariants.violations_total() + et.summary.invariants.violations_total();
    let mut rows: Vec<(String, f64, f64, bool)> = Vec::new();
    for op in ["acquire", "renew", "release"] {
        let (a, b) = (&fg.summary.ops[op], &et.summary.ops[op]);
        rows.push((format!("{op} p50 ms"), a.p50_ms, b.p50_ms, false));
        rows.push((format!("{op} p99 ms"), a.p99_ms, b.p99_ms, false));
        rows.push((format!("{op} ok/s"), a.rate_per_s, b.rate_per_s, true));
        rows.push((
            format!("{op} errors"),
            a.errors as f64,
            b.errors as f64,
            false,
        ));
    }
    rows.push((
        "lock cycles/s".into(),
        fg.summary.lock_cycles_per_s,
        et.summary.lock_cycles_per_s,
        true,
    ));
    rows.push((
        "server commits/s".into(),
        fg.summary.server.commits_per_s,
        et.summary.server.commits_per_s,
        true,
    ));
    if let (Some(a), Some(b)) = (&fg.summary.ramp, &et.summary.ramp) {
        let z = |v: Option<f64>| v.unwrap_or(0.0);
        rows.push((
            format!("max acquires/s, p99 ≤ {} ms", a.bound_ms),
            z(a.max_rate_under_bound),
            z(b.max_rate_under_bound),
            true,
        ));
        rows.push((
            format!("max acquires/s, p99 ≤ {} ms", a.tight_bound_ms),
            z(a.max_rate_under_tight_bound),
            z(b.max_rate_under_tight_bound),
            true,
        ));
        rows.push((
            format!("commits/s there (≤ {} ms)", a.bound_ms),
            z(a.max_commits_per_s_under_bound),
            z(b.max_commits_per_s_under_bound),
            true,
        ));
    }
    let avg_rss = |s: &report::Summary| {
        let v: Vec<f64> = s.server.rss_mib.values().map(|r| r.max_sampled).collect();
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    rows.push((
        "RSS per node, MiB (max sampled)".into(),
        avg_rss(&fg.summary),
        avg_rss(&et.summary),
        false,
    ));

    println!();
    println!(
        "fencegate vs etcd · {:?} · profile {:?}",
        args.scenario, args.profile
    );
    println!(
        "{:<34} {:>12} {:>12} {:>16}",
        "", "fencegate", "etcd", "fencegate better"
    );
    let mut table = Vec::new();
    for (name, a, b, higher_better) in &rows {
        let ratio = if *higher_better {
            if *b > 0.0 {
                a / b
            } else {
                f64::NAN
            }
        } else if *a > 0.0 {
            b / a
        } else {
            f64::NAN
        };
        let r = if ratio.is_finite() {
            format!("{ratio:.1}×")
        } else {
            "-".into()
        };
        println!("{name:<34} {a:>12.2} {b:>12.2} {r:>16}");
        table.push(json!({ "metric": name, "fencegate": a, "etcd": b, "fencegate_better_by": ratio.is_finite().then_some(ratio) }));
    }
    println!(
        "(\"fencegate better\": etcd/fencegate for latencies and errors, fencegate/etcd for rates)"
    );

    if let Some(dir) = &out {
        std::fs::create_dir_all(dir)?;
        let mut overlay = Vec::new();
        for (label, r) in [("fencegate ", &fg), ("etcd ", &et)] {
            for s in &r.cdf {
                if s.label != "write" {
                    overlay.push(plot::Series {
                        label: format!("{label}{}", s.label),
                        points: s.points.clone(),
                    });
                }
            }
        }
        plot::latency_cdf(
            &dir.join("compare_latency_cdf.svg"),
            "fencegate vs etcd: latency by percentile",
            &overlay,
        )?;
        if let (Some(a), Some(b)) = (&fg.summary.ramp, &et.summary.ramp) {
            plot::ramp(
                &dir.join("compare_ramp.svg"),
                "fencegate vs etcd: ramp",
                &[
                    plot::Series {
                        label: "fencegate p99".into(),
                        points: a
                            .steps
                            .iter()
                            .map(|s| (s.target_rate, s.all_p99_ms))
                            .collect(),
                    },
                    plot::Series {
                        label: "etcd p99".into(),
                        points: b
                            .steps
                            .iter()
                            .map(|s| (s.target_rate, s.all_p99_ms))
                            .collect(),
                    },
                ],
                &[a.bound_ms, a.tight_bound_ms],
            )?;
        }
        std::fs::write(
            dir.join("compare.json"),
            serde_json::to_vec_pretty(
                &json!({ "rows": table, "fencegate": fg.summary, "etcd": et.summary }),
            )?,
        )?;
        for (r, d) in [(fg, fg_out), (et, etcd_out)] {
            if let Some(d) = d {
                let mut r = r;
                report::write_out(
                    &d,
                    &Artifacts {
                        summary: &r.summary,
                        cdf: std::mem::take(&mut r.cdf),
                        timeline: &r.timeline,
                        samples: &r.samples,
                    },
                )?;
            }
        }
        println!("wrote {}", dir.display());
    }
    if violations > 0 {
        anyhow::bail!("safety violations found (see above)");
    }
    Ok(())
}
