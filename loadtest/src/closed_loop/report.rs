//! The closed loop's results: one system's summary (summary.json, summary.md, a terminal
//! table) and both systems side by side (compare.json, compare.md).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::check::CheckReport;
use super::Config;
use crate::config::Loop;
use crate::report::{write_file, Machine};
use crate::stats::quantiles_ms;

use super::line::Tally;

/// One line: one loop with one number of clients.
#[derive(Clone, Debug, Serialize)]
pub struct LineReport {
    #[serde(rename = "loop")]
    pub what: Loop,
    pub clients: usize,
    pub measured_s: f64,
    /// Completed cycles (acquire and release both succeeded) or renewals.
    pub ok: u64,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Cycles: the acquire and the release of the completed cycles on their own.
    pub acquire_p99_ms: Option<f64>,
    pub release_p99_ms: Option<f64>,
    /// Calls that failed after their retries, by the final code.
    pub errors: u64,
    pub errors_by_code: BTreeMap<String, u64>,
    /// Failed attempts a retry then covered.
    pub retried_attempts: u64,
    /// CPU used during the line, in cores: the harness, and the servers together.
    pub harness_cpu_cores: f64,
    pub server_cpu_cores: Option<f64>,
}

impl LineReport {
    pub fn new(what: Loop, clients: usize, measured_s: f64, t: &Tally) -> Self {
        let [p50, _, p99, max] = quantiles_ms(&t.hist);
        let cycle = what == Loop::Cycle;
        LineReport {
            what,
            clients,
            measured_s,
            ok: t.ok,
            per_s: t.ok as f64 / measured_s.max(1e-9),
            p50_ms: p50,
            p99_ms: p99,
            max_ms: max,
            acquire_p99_ms: cycle.then(|| quantiles_ms(&t.acquire)[2]),
            release_p99_ms: cycle.then(|| quantiles_ms(&t.release)[2]),
            errors: t.errors(),
            errors_by_code: t.errors_by_code.clone(),
            retried_attempts: t.retried_attempts,
            harness_cpu_cores: 0.0,
            server_cpu_cores: None,
        }
    }

    /// The line as the tables show it: label, ops/s, p50, p99, max, errors, CPU of the
    /// harness and of the servers.
    fn cells(&self) -> [String; 8] {
        [
            self.label(),
            format!("{:.0}", self.per_s),
            format!("{:.2}", self.p50_ms),
            format!("{:.2}", self.p99_ms),
            format!("{:.1}", self.max_ms),
            self.errors.to_string(),
            format!("{:.2}", self.harness_cpu_cores),
            self.server_cpu_cores
                .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
        ]
    }

    fn label(&self) -> String {
        let what = match self.what {
            Loop::Cycle => "lock cycle",
            Loop::Renew => "renew",
        };
        let plural = if self.clients == 1 { "" } else { "s" };
        format!("{what}, {} client{plural}", self.clients)
    }
}

/// Memory of one server process when the lines were done.
#[derive(Clone, Debug, Serialize)]
pub struct Rss {
    pub rss_mib: f64,
    pub peak_mib: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClosedLoopSummary {
    pub system: String,
    pub scenario: &'static str,
    pub cluster: String,
    pub machine: Machine,
    pub config: Config,
    pub lines: Vec<LineReport>,
    /// Per node (fencegate) or member (etcd), 1-based, after the last line.
    pub rss: BTreeMap<String, Rss>,
    pub checks: CheckReport,
    /// The server's last token is at least the highest token the client saw (fencegate).
    pub server_token_consistent: Option<bool>,
    pub node_failures: Vec<String>,
    pub warnings: Vec<String>,
}

impl ClosedLoopSummary {
    /// The lines that completed nothing: a line of errors only is no measurement.
    pub fn empty_lines(&self) -> Vec<String> {
        self.lines
            .iter()
            .filter(|l| l.ok == 0)
            .map(|l| format!("{} {} × {}", self.system, l.what.name(), l.clients))
            .collect()
    }

    pub fn violations(&self) -> u64 {
        self.checks.violations() + u64::from(self.server_token_consistent == Some(false))
    }

    pub fn print(&self) {
        println!();
        println!(
            "{} · closed loop · {} · {} s per line after {} s warm-up",
            self.system, self.cluster, self.config.duration_s, self.config.warmup_s
        );
        let heads = [
            "", "ops/s", "p50 ms", "p99 ms", "max ms", "errors", "cpu self", "cpu srv",
        ];
        println!("{}", aligned(heads.map(String::from)));
        for l in &self.lines {
            println!("{}", aligned(l.cells()));
            if !l.errors_by_code.is_empty() {
                let codes: Vec<String> = l
                    .errors_by_code
                    .iter()
                    .map(|(c, n)| format!("{c}×{n}"))
                    .collect();
                println!("    errors: {}", codes.join(", "));
            }
        }
        println!("RSS: {}", rss_text(&self.rss));
        let c = &self.checks;
        let i = &c.invariants;
        println!(
            "checks: {} grants · duplicate tokens {} · duplicate leases {} · non-monotonic {} · two holders {} · lost leases {}{}",
            i.grants,
            i.duplicate_tokens,
            i.duplicate_leases,
            i.non_monotonic_tokens,
            c.overlapping_holders,
            i.lost_leases,
            match self.server_token_consistent {
                Some(false) => " · SERVER last_token BELOW a token we were granted",
                _ => "",
            }
        );
        for v in i.violations.iter().chain(&c.overlap_examples) {
            println!("  VIOLATION: {v}");
        }
        for e in &self.node_failures {
            println!("NODE FAILURE: {e}");
        }
        for w in &self.warnings {
            println!("warning: {w}");
        }
    }

    fn markdown(&self) -> String {
        let mut m = String::new();
        let _ = writeln!(
            m,
            "# {} closed loop: {} s per line after {} s warm-up\n",
            self.system, self.config.duration_s, self.config.warmup_s
        );
        let _ = writeln!(m, "{}\n", self.conditions());
        let _ = writeln!(
            m,
            "| operation | ops/s | p50 ms | p99 ms | max ms | errors | harness CPU | server CPU |"
        );
        let _ = writeln!(m, "|---|---|---|---|---|---|---|---|");
        for l in &self.lines {
            let _ = writeln!(m, "| {} |", l.cells().join(" | "));
        }
        let _ = writeln!(m, "\nRSS after the lines: {}", rss_text(&self.rss));
        let _ = writeln!(
            m,
            "\nSafety checks: {} violations ({} grants).",
            self.violations(),
            self.checks.invariants.grants
        );
        m
    }

    fn conditions(&self) -> String {
        conditions(&self.cluster, &self.machine, &self.config)
    }

    /// summary.json and summary.md in `dir`.
    pub fn write_out(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        write_file(&dir.join("summary.json"), serde_json::to_vec_pretty(self)?)?;
        write_file(&dir.join("summary.md"), self.markdown())?;
        Ok(())
    }
}

/// The terminal table's columns: the label left aligned, numbers right aligned.
fn aligned(cells: [String; 8]) -> String {
    const WIDTHS: [usize; 8] = [22, 10, 8, 8, 9, 7, 9, 9];
    let mut out = format!("{:<w$}", cells[0], w = WIDTHS[0]);
    for (c, w) in cells.iter().zip(WIDTHS).skip(1) {
        let _ = write!(out, " {c:>w$}");
    }
    out
}

fn conditions(cluster: &str, machine: &Machine, c: &Config) -> String {
    format!(
        "{cluster}; {} resources, TTL {} ms, acquires wait up to {} ms; {} × {} CPUs, load average {} at the start",
        c.resources,
        c.ttl_ms,
        c.wait_ms,
        machine.cpu,
        machine.nproc,
        machine.load_avg_at_start
    )
}

fn rss_text(rss: &BTreeMap<String, Rss>) -> String {
    if rss.is_empty() {
        return "- (processes not started by the harness)".into();
    }
    let total: f64 = rss.values().map(|r| r.rss_mib).sum();
    let each: Vec<String> = rss
        .iter()
        .map(|(n, r)| format!("{n} {:.0} MiB (peak {:.0})", r.rss_mib, r.peak_mib))
        .collect();
    format!("{} · {total:.0} MiB together", each.join(", "))
}

/// One line of both systems.
#[derive(Serialize)]
pub struct CompareRow {
    #[serde(rename = "loop")]
    pub what: Loop,
    pub clients: usize,
    pub fencegate_per_s: f64,
    pub etcd_per_s: f64,
    /// fencegate / etcd (none when etcd did nothing).
    pub ratio: Option<f64>,
    pub fencegate_p50_ms: f64,
    pub etcd_p50_ms: f64,
    pub fencegate_p99_ms: f64,
    pub etcd_p99_ms: f64,
    pub fencegate_errors: u64,
    pub etcd_errors: u64,
}

pub fn compare_rows(fg: &ClosedLoopSummary, et: &ClosedLoopSummary) -> Vec<CompareRow> {
    fg.lines
        .iter()
        .zip(&et.lines)
        .map(|(a, b)| {
            let ratio = a.per_s / b.per_s;
            CompareRow {
                what: a.what,
                clients: a.clients,
                fencegate_per_s: a.per_s,
                etcd_per_s: b.per_s,
                ratio: ratio.is_finite().then_some(ratio),
                fencegate_p50_ms: a.p50_ms,
                etcd_p50_ms: b.p50_ms,
                fencegate_p99_ms: a.p99_ms,
                etcd_p99_ms: b.p99_ms,
                fencegate_errors: a.errors,
                etcd_errors: b.errors,
            }
        })
        .collect()
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}×"))
}

pub fn print_compare(rows: &[CompareRow], fg: &ClosedLoopSummary, et: &ClosedLoopSummary) {
    println!();
    println!("fencegate vs etcd · closed loop");
    println!(
        "{:<22} {:>10} {:>9} {:>10} {:>9} {:>8}",
        "", "fencegate/s", "p99 ms", "etcd/s", "p99 ms", "ratio"
    );
    for (r, l) in rows.iter().zip(&fg.lines) {
        println!(
            "{:<22} {:>10.0} {:>9.2} {:>10.0} {:>9.2} {:>8}",
            l.label(),
            r.fencegate_per_s,
            r.fencegate_p99_ms,
            r.etcd_per_s,
            r.etcd_p99_ms,
            ratio_text(r.ratio)
        );
    }
    println!("RSS fencegate: {}", rss_text(&fg.rss));
    println!("RSS etcd: {}", rss_text(&et.rss));
}

fn compare_markdown(rows: &[CompareRow], fg: &ClosedLoopSummary, et: &ClosedLoopSummary) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# fencegate vs etcd, closed loop: {} s per line after {} s warm-up\n",
        fg.config.duration_s, fg.config.warmup_s
    );
    let _ = writeln!(m, "- fencegate: {}", fg.conditions());
    let _ = writeln!(m, "- etcd: {}\n", et.conditions());
    let _ = writeln!(
        m,
        "| operation | fencegate | etcd | ratio | errors (fencegate / etcd) |"
    );
    let _ = writeln!(m, "|---|---|---|---|---|");
    for (r, l) in rows.iter().zip(&fg.lines) {
        let _ = writeln!(
            m,
            "| {} | {:.0} /s, p50 {:.2} ms, p99 {:.2} ms | {:.0} /s, p50 {:.2} ms, p99 {:.2} ms | {} | {} / {} |",
            l.label(),
            r.fencegate_per_s,
            r.fencegate_p50_ms,
            r.fencegate_p99_ms,
            r.etcd_per_s,
            r.etcd_p50_ms,
            r.etcd_p99_ms,
            ratio_text(r.ratio),
            r.fencegate_errors,
            r.etcd_errors
        );
    }
    let _ = writeln!(
        m,
        "| RSS after these runs | {} | {} | | |",
        rss_text(&fg.rss),
        rss_text(&et.rss)
    );
    let _ = writeln!(
        m,
        "\nSafety checks: fencegate {} violations, etcd {}.",
        fg.violations(),
        et.violations()
    );
    m
}

/// compare.json, compare.md, and each system's summary in `fencegate/` and `etcd/`.
pub fn write_compare(
    dir: &Path,
    rows: &[CompareRow],
    fg: &ClosedLoopSummary,
    et: &ClosedLoopSummary,
) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Both<'a> {
        rows: &'a [CompareRow],
        fencegate: &'a ClosedLoopSummary,
        etcd: &'a ClosedLoopSummary,
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    write_file(
        &dir.join("compare.json"),
        serde_json::to_vec_pretty(&Both {
            rows,
            fencegate: fg,
            etcd: et,
        })?,
    )?;
    write_file(&dir.join("compare.md"), compare_markdown(rows, fg, et))?;
    fg.write_out(&dir.join("fencegate"))?;
    et.write_out(&dir.join("etcd"))?;
    Ok(())
}
