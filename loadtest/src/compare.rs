//! `compare`: the same scenario against fencegate, then etcd; one table side by side, and
//! with `--out` both runs' artifacts, overlay plots and compare.json.

use std::path::Path;

use anyhow::bail;
use serde::Serialize;
use serde_json::json;

use crate::config::{RunArgs, System};
use crate::plot::{self, Series};
use crate::report::{RampReport, Summary};
use crate::scenario::{self, RunResult};

/// One line of the table.
#[derive(Serialize)]
struct Row {
    metric: String,
    fencegate: f64,
    etcd: f64,
    /// How many times better fencegate is: etcd/fencegate for latencies and errors,
    /// fencegate/etcd for rates (none when the divisor is 0).
    fencegate_better_by: Option<f64>,
}

impl Row {
    fn new(metric: impl Into<String>, fencegate: f64, etcd: f64, higher_better: bool) -> Self {
        let ratio = if higher_better {
            fencegate / etcd
        } else {
            etcd / fencegate
        };
        Row {
            metric: metric.into(),
            fencegate,
            etcd,
            fencegate_better_by: ratio.is_finite().then_some(ratio),
        }
    }
}

pub async fn run(args: &RunArgs) -> anyhow::Result<()> {
    let (fg, et) = run_both(args).await?;
    let rows = rows(&fg.summary, &et.summary);
    print_table(args, &rows);
    if let Some(dir) = &args.out {
        write_out(dir, &rows, &fg, &et)?;
        println!("wrote {}", dir.display());
    }
    let violations =
        fg.summary.invariants.violations_total() + et.summary.invariants.violations_total();
    if violations > 0 {
        bail!("safety violations found (see above)");
    }
    Ok(())
}

/// fencegate, then etcd, each in its own part of `--data-dir`.
async fn run_both(args: &RunArgs) -> anyhow::Result<(RunResult, RunResult)> {
    let mut fg_args = args.clone();
    let mut etcd_args = args.clone();
    if let Some(d) = &args.data_dir {
        fg_args.data_dir = Some(d.join("fencegate"));
        etcd_args.data_dir = Some(d.join("etcd"));
    }
    let fg = scenario::run_and_print(&fg_args, System::Fencegate).await?;
    let et = scenario::run_and_print(&etcd_args, System::Etcd).await?;
    Ok((fg, et))
}

fn rows(fg: &Summary, et: &Summary) -> Vec<Row> {
    let mut rows = Vec::new();
    for op in ["acquire", "renew", "release"] {
        let (a, b) = (&fg.ops[op], &et.ops[op]);
        rows.push(Row::new(format!("{op} p50 ms"), a.p50_ms, b.p50_ms, false));
        rows.push(Row::new(format!("{op} p99 ms"), a.p99_ms, b.p99_ms, false));
        rows.push(Row::new(
            format!("{op} ok/s"),
            a.rate_per_s,
            b.rate_per_s,
            true,
        ));
        rows.push(Row::new(
            format!("{op} errors"),
            a.errors as f64,
            b.errors as f64,
            false,
        ));
    }
    rows.push(Row::new(
        "lock cycles/s",
        fg.lock_cycles_per_s,
        et.lock_cycles_per_s,
        true,
    ));
    rows.push(Row::new(
        "server commits/s",
        fg.server.commits_per_s,
        et.server.commits_per_s,
        true,
    ));
    if let (Some(a), Some(b)) = (&fg.ramp, &et.ramp) {
        rows.extend(ramp_rows(a, b));
    }
    rows.push(Row::new(
        "RSS per node, MiB (max sampled)",
        mean_rss(fg),
        mean_rss(et),
        false,
    ));
    rows
}

fn ramp_rows(a: &RampReport, b: &RampReport) -> Vec<Row> {
    let z = |v: Option<f64>| v.unwrap_or(0.0);
    vec![
        Row::new(
            format!("max acquires/s, p99 ≤ {} ms", a.bound_ms),
            z(a.max_rate_under_bound),
            z(b.max_rate_under_bound),
            true,
        ),
        Row::new(
            format!("max acquires/s, p99 ≤ {} ms", a.tight_bound_ms),
            z(a.max_rate_under_tight_bound),
            z(b.max_rate_under_tight_bound),
            true,
        ),
        Row::new(
            format!("commits/s there (≤ {} ms)", a.bound_ms),
            z(a.max_commits_per_s_under_bound),
            z(b.max_commits_per_s_under_bound),
            true,
        ),
    ]
}

/// The mean over nodes of each node's highest sampled RSS.
fn mean_rss(s: &Summary) -> f64 {
    let v: Vec<f64> = s.server.rss_mib.values().map(|r| r.max_sampled).collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn print_table(args: &RunArgs, rows: &[Row]) {
    println!();
    println!(
        "fencegate vs etcd · {:?} · profile {:?}",
        args.scenario, args.profile
    );
    println!(
        "{:<34} {:>12} {:>12} {:>16}",
        "", "fencegate", "etcd", "fencegate better"
    );
    for r in rows {
        let better = r
            .fencegate_better_by
            .map_or_else(|| "-".to_string(), |x| format!("{x:.1}×"));
        println!(
            "{:<34} {:>12.2} {:>12.2} {better:>16}",
            r.metric, r.fencegate, r.etcd
        );
    }
    println!(
        "(\"fencegate better\": etcd/fencegate for latencies and errors, fencegate/etcd for rates)"
    );
}

/// compare.json, the overlay plots, and each run's own artifacts in `fencegate/` and `etcd/`.
fn write_out(dir: &Path, rows: &[Row], fg: &RunResult, et: &RunResult) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    plot::latency_cdf(
        &dir.join("compare_latency_cdf.svg"),
        "fencegate vs etcd: latency by percentile",
        &cdf_overlay(fg, et),
    )?;
    if let (Some(a), Some(b)) = (&fg.summary.ramp, &et.summary.ramp) {
        let p99 = |label: &str, r: &RampReport| Series {
            label: label.into(),
            points: r
                .steps
                .iter()
                .map(|s| (s.target_rate, s.all_p99_ms))
                .collect(),
        };
        plot::ramp(
            &dir.join("compare_ramp.svg"),
            "fencegate vs etcd: ramp",
            &[p99("fencegate p99", a), p99("etcd p99", b)],
            &[a.bound_ms, a.tight_bound_ms],
        )?;
    }
    std::fs::write(
        dir.join("compare.json"),
        serde_json::to_vec_pretty(
            &json!({ "rows": rows, "fencegate": fg.summary, "etcd": et.summary }),
        )?,
    )?;
    fg.write_out(&dir.join("fencegate"))?;
    et.write_out(&dir.join("etcd"))?;
    Ok(())
}

/// Both runs' latency CDFs of the lock calls in one plot.
fn cdf_overlay(fg: &RunResult, et: &RunResult) -> Vec<Series> {
    [("fencegate ", fg), ("etcd ", et)]
        .into_iter()
        .flat_map(|(label, r)| {
            r.cdf
                .iter()
                .filter(|s| s.label != "write")
                .map(move |s| Series {
                    label: format!("{label}{}", s.label),
                    points: s.points.clone(),
                })
        })
        .collect()
}
