//! The verdict of a chaos run: verdict.json, and the summary printed at the end.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checker::{self, CheckResult, Model, Operations};

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// No check found a violation and nothing else went wrong.
    pub valid: bool,
    /// `fenced`, `unsafe-no-fencing`, `unsafe-no-idempotency` (or both), `recheck`, or
    /// `cut-short` (a run ended early by a signal or a panic: its history so far).
    pub mode: &'static str,
    /// How the run was set up (absent for a recheck).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunSetup>,
    pub operations: Operations,
    pub faults: Faults,
    pub violations_total: u64,
    /// Each check by `{invariant}_{name}`.
    pub violations: BTreeMap<String, CheckResult>,
    /// Node processes that exited on their own, hung requests, no recovery after the heal.
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunSetup {
    pub seed: u64,
    pub duration_s: u64,
    pub workers: usize,
    pub zombies: usize,
    pub orderers: usize,
    pub keys: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Faults {
    pub total: u64,
    /// Faults started, by kind (every enabled kind, also those that never came up).
    pub by_kind: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responses_dropped_after_answer: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_abandoned_in_flight: Option<u64>,
}

impl Verdict {
    /// What the checks found in `m`, plus the problems found outside the history.
    pub fn new(
        mode: &'static str,
        m: &Model,
        results: &[CheckResult],
        problems: Vec<String>,
    ) -> Verdict {
        let total: u64 = results.iter().map(|r| r.violations).sum();
        let operations = checker::stats(m);
        let mut problems = problems;
        if !operations.measured_anything() {
            // Every check passes on an empty history: that must not read as a pass.
            problems.push(
                "nothing was measured: no client operation succeeded (see the history and the \
                 nodes' logs)"
                    .to_string(),
            );
        }
        let violations = results
            .iter()
            .map(|r| (format!("{}_{}", r.invariant, r.name), r.clone()))
            .collect();
        Verdict {
            valid: total == 0 && problems.is_empty(),
            mode,
            run: None,
            operations,
            faults: Faults {
                total: m.faults.values().sum(),
                by_kind: m.faults.clone(),
                responses_dropped_after_answer: None,
                requests_abandoned_in_flight: None,
            },
            violations_total: total,
            violations,
            problems,
        }
    }

    pub fn print(&self, results: &[CheckResult]) {
        println!();
        println!(
            "chaos verdict: {}  ({} mode, {} client operations, {} faults)",
            if self.valid { "VALID" } else { "INVALID" },
            self.mode,
            self.operations.client_operations,
            self.faults.total,
        );
        let kinds: Vec<String> = self
            .faults
            .by_kind
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        println!("  faults: {}", kinds.join(" "));
        for (role, counts) in &self.operations.writes_by_role {
            let counts = serde_json::to_string(counts).unwrap_or_default();
            println!("  {role} writes: {counts}");
        }
        if let Some(orders) = self.operations.by_function.get("order") {
            let counts = serde_json::to_string(orders).unwrap_or_default();
            println!("  orders (attempts): {counts}");
        }
        for r in results {
            println!(
                "  [{}] {} {:<24} checked {:>7}  violations {}",
                if r.violations == 0 { "ok" } else { "!!" },
                r.invariant,
                r.name,
                r.checked,
                r.violations
            );
            if let Some(first) = &r.first {
                let s = serde_json::to_string(first).unwrap_or_default();
                let s: String = s.chars().take(1_500).collect();
                println!("      first: {s}");
            }
        }
        for msg in &self.problems {
            println!("  problem: {msg}");
        }
    }
}
