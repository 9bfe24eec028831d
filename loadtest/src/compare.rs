//! `compare`: the same scenario against fencegate, then etcd; one table side by side, and
//! with `--out` both runs' artifacts, overlay plots and compare.json.

use std::path::Path;

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::json;

use crate::config::{RunArgs, System};
use crate::plot::{self, Series};
use crate::report::{write_file, RampReport, Summary};
use crate::scenario::{self, RunResult};

/// One line of the table.
#[derive(Serialize)]
struct Row {
    metric: String,
    fencegate: f64,
    etcd: f64,
    /// How many times better fencegate is: etcd/fencegate for latencies and errors,
    /// fencegate/etcd for rates (none when the divisor is 0, or when neither way is better).
    fencegate_better_by: Option<f64>,
    /// fencegate/etcd, for a figure where more is neither better nor worse.
    #[serde(skip_serializing_if = "Option::is_none")]
    fencegate_over_etcd: Option<f64>,
}

/// Which way a figure is better.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Better {
    Higher,
    Lower,
    /// Neither: server commits for the same offered work count the systems' own units
    /// (fencegate batches lock commands into fewer raft commits), not what a client gets.
    Neither,
}

impl Row {
    fn new(metric: impl Into<String>, fencegate: f64, etcd: f64, better: Better) -> Self {
        let finite = |r: f64| r.is_finite().then_some(r);
        let (better_by, over) = match better {
            Better::Higher => (finite(fencegate / etcd), None),
            Better::Lower => (finite(etcd / fencegate), None),
            Better::Neither => (None, finite(fencegate / etcd)),
        };
        Row {
            metric: metric.into(),
            fencegate,
            etcd,
            fencegate_better_by: better_by,
            fencegate_over_etcd: over,
        }
    }
}

/// The arguments of each half: each system in its own part of `--data-dir`.
pub fn split_args(args: &RunArgs) -> (RunArgs, RunArgs) {
    let mut fg_args = args.clone();
    let mut etcd_args = args.clone();
    if let Some(d) = &args.data_dir {
        fg_args.data_dir = Some(d.join("fencegate"));
        etcd_args.data_dir = Some(d.join("etcd"));
    }
    (fg_args, etcd_args)
}

/// Both halves' flags, before the first half starts (a flag only the etcd driver refuses
/// must not cost the fencegate half's run first).
pub fn check_args(args: &RunArgs) -> anyhow::Result<()> {
    let (fg_args, etcd_args) = split_args(args);
    scenario::check_args(&fg_args, System::Fencegate)
        .context("compare: the fencegate half cannot run")?;
    scenario::check_args(&etcd_args, System::Etcd).context("compare: the etcd half cannot run")?;
    Ok(())
}

pub async fn run(args: &RunArgs) -> anyhow::Result<()> {
    let (fg, et) = run_both(args).await?;
    let rows = rows(&fg.summary, &et.summary);
    print_table(args, &rows);
    if let Some(dir) = &args.out {
        write_out(dir, &rows, &fg, &et)?;
        println!("wrote {}", dir.display());
    }
    if fg.unsafe_() || et.unsafe_() {
        bail!("safety violations found (see above)");
    }
    let unusable = et.unusable();
    if !unusable.is_empty() {
        bail!("etcd: {}", unusable.join("; "));
    }
    Ok(())
}

/// fencegate, then etcd, each in its own part of `--data-dir`. A fencegate half that measured
/// nothing (or was cut short) ends the comparison: there is nothing to compare etcd with.
async fn run_both(args: &RunArgs) -> anyhow::Result<(RunResult, RunResult)> {
    let (fg_args, etcd_args) = split_args(args);
    let fg = scenario::run_and_print(&fg_args, System::Fencegate).await?;
    let unusable = fg.unusable();
    if !unusable.is_empty() {
        bail!("fencegate: {}; etcd not run", unusable.join("; "));
    }
    let et = scenario::run_and_print(&etcd_args, System::Etcd).await?;
    Ok((fg, et))
}

fn rows(fg: &Summary, et: &Summary) -> Vec<Row> {
    let mut rows = Vec::new();
    for op in ["acquire", "renew", "release"] {
        let (a, b) = (&fg.ops[op], &et.ops[op]);
        rows.push(Row::new(
            format!("{op} p50 ms"),
            a.p50_ms,
            b.p50_ms,
            Better::Lower,
        ));
        rows.push(Row::new(
            format!("{op} p99 ms"),
            a.p99_ms,
            b.p99_ms,
            Better::Lower,
        ));
        rows.push(Row::new(
            format!("{op} ok/s"),
            a.rate_per_s,
            b.rate_per_s,
            Better::Higher,
        ));
        rows.push(Row::new(
            format!("{op} errors"),
            a.errors as f64,
            b.errors as f64,
            Better::Lower,
        ));
    }
    rows.push(Row::new(
        "lock cycles/s",
        fg.lock_cycles_per_s,
        et.lock_cycles_per_s,
        Better::Higher,
    ));
    rows.push(Row::new(
        "server commits/s",
        fg.server.commits_per_s,
        et.server.commits_per_s,
        Better::Neither,
    ));
    if let (Some(a), Some(b)) = (&fg.ramp, &et.ramp) {
        rows.extend(ramp_rows(a, b));
    }
    rows.push(Row::new(
        "RSS per node, MiB (max sampled)",
        mean_rss(fg),
        mean_rss(et),
        Better::Lower,
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
            Better::Higher,
        ),
        Row::new(
            format!("max acquires/s, p99 ≤ {} ms", a.tight_bound_ms),
            z(a.max_rate_under_tight_bound),
            z(b.max_rate_under_tight_bound),
            Better::Higher,
        ),
        Row::new(
            format!("commits/s there (≤ {} ms)", a.bound_ms),
            z(a.max_commits_per_s_under_bound),
            z(b.max_commits_per_s_under_bound),
            Better::Neither,
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
        "fencegate vs etcd · {} · profile {}",
        scenario::value_name(args.scenario),
        scenario::value_name(args.profile)
    );
    println!(
        "{:<34} {:>12} {:>12} {:>16}",
        "", "fencegate", "etcd", "fencegate better"
    );
    for r in rows {
        let better = match (r.fencegate_better_by, r.fencegate_over_etcd) {
            (Some(x), _) => format!("{x:.1}×"),
            // Neither better nor worse: the plain ratio, in parentheses.
            (None, Some(x)) => format!("({x:.1}×)"),
            (None, None) => "-".to_string(),
        };
        println!(
            "{:<34} {:>12.2} {:>12.2} {better:>16}",
            r.metric, r.fencegate, r.etcd
        );
    }
    println!(
        "(\"fencegate better\": etcd/fencegate for latencies and errors, fencegate/etcd for rates; \
         in parentheses fencegate/etcd where more is neither better nor worse: server commits \
         count each system's own unit of work)"
    );
}

/// compare.json, the overlay plots, and each run's own artifacts in `fencegate/` and `etcd/`.
fn write_out(dir: &Path, rows: &[Row], fg: &RunResult, et: &RunResult) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
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
    write_file(
        &dir.join("compare.json"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_that_is_neither_better_nor_worse_gets_no_better_by() {
        let fewer_commits = Row::new("server commits/s", 100.0, 200.0, Better::Neither);
        assert_eq!(fewer_commits.fencegate_better_by, None);
        assert_eq!(fewer_commits.fencegate_over_etcd, Some(0.5));
        let faster = Row::new("acquire p99 ms", 2.0, 8.0, Better::Lower);
        assert_eq!(faster.fencegate_better_by, Some(4.0));
        let more = Row::new("acquire ok/s", 300.0, 100.0, Better::Higher);
        assert_eq!(more.fencegate_better_by, Some(3.0));
        assert_eq!(
            Row::new("x", 1.0, 0.0, Better::Higher).fencegate_better_by,
            None
        );
    }

    #[test]
    fn each_half_of_a_compare_gets_its_own_part_of_the_data_dir() {
        let args = crate::config::run_args(&["--data-dir", "/d"]);
        let (fg, et) = split_args(&args);
        assert_eq!(
            fg.data_dir.as_deref(),
            Some(std::path::Path::new("/d/fencegate"))
        );
        // etcd's members go straight in it (m1/ …), not in /d/etcd/etcd.
        assert_eq!(
            et.data_dir.as_deref(),
            Some(std::path::Path::new("/d/etcd"))
        );
    }
}
