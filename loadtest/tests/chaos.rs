//! The chaos harness end to end, as CI runs it: `fencegate-loadtest chaos` against
//! three real `fencegate node` processes with every fault kind mixed in.
//!
//! - A fenced run must pass: every check clean, exit status 0 — and it must
//!   have actually exercised something (operations, faults, zombie writes), or passing
//!   would mean nothing.
//! - The same clients with the proxies' fencing turned off (`--unsafe-no-fencing`) must be
//!   caught: exit status non-zero and invariant 3 violations in verdict.json. This is the
//!   proof that the checker can fail.
//!
//! - Idempotent create-order clients (retries, concurrent duplicates, answers lost after the
//!   effect) under the same faults leave at most one order per (tenant, key); with the
//!   proxies' idempotency records off (`--unsafe-no-idempotency`) the duplicates are caught.
//!
//! All need the `fencegate` binary next to the harness (target/debug/fencegate), which
//! `cargo test --workspace` builds.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn phase(msg: &str) {
    eprintln!("---- {msg}");
}

fn harness() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fencegate-loadtest"))
}

/// target/<profile>/fencegate, next to the harness binary.
fn fencegate() -> PathBuf {
    let bin = harness()
        .parent()
        .expect("harness has a directory")
        .join("fencegate");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo test --workspace` (it builds the proxy crate's `fencegate` \
         binary) or `cargo build -p proxy --bin fencegate` first",
        bin.display()
    );
    bin
}

/// A fresh output directory under target/tmp, kept after the test so a failure can be
/// investigated (verdict.json, history.jsonl, cluster/ with the nodes' logs).
fn out_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the output dir");
    eprintln!("output in {}", dir.display());
    dir
}

fn chaos(out: &Path, extra: &[&str]) -> (bool, Value) {
    let mut cmd = Command::new(harness());
    cmd.arg("chaos")
        .arg("--out")
        .arg(out)
        .arg("--fencegate-bin")
        .arg(fencegate())
        .args(extra);
    let status = cmd.status().expect("run fencegate-loadtest chaos");
    let text = std::fs::read_to_string(out.join("verdict.json"))
        .unwrap_or_else(|e| panic!("no verdict.json in {} ({e}); exit {status}", out.display()));
    let verdict: Value = serde_json::from_str(&text).expect("verdict.json is JSON");
    (status.success(), verdict)
}

/// Count and first counter-example of each invariant, for a failure message.
fn summary(v: &Value) -> String {
    let mut out = String::new();
    if let Some(checks) = v["violations"].as_object() {
        for (name, c) in checks {
            out.push_str(&format!("{name}: {} violation(s)\n", c["count"]));
            if !c["first"].is_null() {
                out.push_str(&format!("  first: {}\n", c["first"]));
            }
        }
    }
    out.push_str(&format!("problems: {}\n", v["problems"]));
    out
}

fn count(v: &Value, key: &str) -> u64 {
    v["violations"][key]["count"].as_u64().unwrap_or(u64::MAX)
}

/// Every check under mixed faults (the order clients included), with fencing on: no violation.
#[test]
fn fenced_run_under_mixed_faults_passes() {
    let dir = out_dir("chaos-fenced");
    phase("fenced chaos run, 60 s, every fault kind mixed");
    let (ok, v) = chaos(&dir, &["--duration-s", "60"]);
    assert!(ok, "the fenced run must pass:\n{}", summary(&v));
    assert_eq!(v["valid"], Value::Bool(true));
    assert_eq!(v["violations_total"], 0);

    phase("it exercised the system");
    let ops = v["operations"]["client_operations"].as_u64().unwrap_or(0);
    assert!(
        ops >= 200,
        "too few client operations to mean anything: {ops}"
    );
    let faults = v["faults"]["total"].as_u64().unwrap_or(0);
    assert!(faults >= 5, "too few faults injected: {faults}");
    // Zombie writes were sent — and the proxies refused every one of them that would have
    // been late (the store log check above is what proves nothing late landed).
    let zombie = &v["operations"]["writes_by_role"]["zombie"];
    let sent: u64 = ["ok", "fail", "info"]
        .iter()
        .filter_map(|k| zombie[*k].as_u64())
        .sum();
    assert!(sent >= 3, "zombies did not get to write: {zombie}");
    assert!(dir.join("history.jsonl").is_file());
}

/// The checker can fail: the same clients and faults with fencing off in the proxies; the
/// zombies' late writes land after newer ones (lost updates).
#[test]
fn unfenced_run_is_caught() {
    let dir = out_dir("chaos-unfenced");
    phase("unsafe chaos run (fencing off), 30 s, every fault kind mixed");
    let (ok, v) = chaos(&dir, &["--duration-s", "30", "--unsafe-no-fencing"]);
    assert!(!ok, "the unsafe run must exit non-zero");
    assert_eq!(v["valid"], Value::Bool(false));
    let lost = count(&v, "3_store_token_monotonic");
    assert!(
        lost > 0 && lost != u64::MAX,
        "invariant 3 must report the zombies' lost updates: {:#}",
        v["violations"]
    );
    eprintln!(
        "caught: {lost} invariant-3 violations; first: {}",
        v["violations"]["3_store_token_monotonic"]["first"]
    );
}

/// A chaos run of mostly order clients (one lock worker keeps the lock path busy).
fn orders_chaos(out: &Path, extra: &[&str]) -> (bool, Value) {
    let mut args = vec!["--workers", "1", "--zombies", "0", "--orderers", "6"];
    args.extend_from_slice(extra);
    chaos(out, &args)
}

/// Invariant 7 under mixed faults: the order clients retry lost and refused attempts with the
/// same key, race themselves through different proxies and lose answers after the effect
/// (the store holds some answers past the proxy's timeout); the store still has at most one
/// order per (tenant, key), and every answer names it. Short: the orders alone.
#[test]
fn idempotent_orders_under_mixed_faults_pass() {
    let dir = out_dir("chaos-orders");
    phase("chaos run with order clients, 20 s, every fault kind mixed");
    let (ok, v) = orders_chaos(&dir, &["--duration-s", "20"]);
    assert!(ok, "the run must pass:\n{}", summary(&v));
    assert_eq!(count(&v, "7_one_effect_per_key"), 0);

    phase("it exercised retries of lost answers");
    let orders = &v["operations"]["by_function"]["order"];
    let n = |k: &str| orders[k].as_u64().unwrap_or(0);
    assert!(n("ok") >= 50, "too few answered orders: {orders}");
    // Attempts with no definite answer (held-back answers past the upstream timeout, dropped
    // answers, killed proxies) were retried with their key: the cases the record exists for.
    assert!(n("info") >= 3, "too few lost answers: {orders}");
    let checked = v["violations"]["7_one_effect_per_key"]["checked_by_kind"]["orders_in_store"]
        .as_u64()
        .unwrap_or(0);
    assert!(checked >= 50, "too few orders in the store: {checked}");
}

/// The duplicate check can fail: the same order clients with the proxies' idempotency records
/// off; every retry and race creates another order.
#[test]
fn orders_without_idempotency_records_are_caught() {
    let dir = out_dir("chaos-orders-unsafe");
    phase("unsafe chaos run (idempotency records off), 15 s");
    let (ok, v) = orders_chaos(&dir, &["--duration-s", "15", "--unsafe-no-idempotency"]);
    assert!(!ok, "the unsafe run must exit non-zero");
    let dups = count(&v, "7_one_effect_per_key");
    assert!(
        dups > 0 && dups != u64::MAX,
        "invariant 7 must report duplicate orders: {:#}",
        v["violations"]
    );
    let first = &v["violations"]["7_one_effect_per_key"]["first"];
    assert!(
        first["orders"].as_array().is_some_and(|o| o.len() > 1),
        "{first}"
    );
    assert!(
        first["attempts"].as_array().is_some_and(|a| !a.is_empty()),
        "{first}"
    );
    eprintln!("caught: {dups} invariant-7 violations; first: {first}");
}

/// Invariant 9 under leader kills, partitions and pauses: clients hammer the rate-limited
/// route through all three proxies (far above the quota, demand moving between proxies);
/// the store's record of what got through stays within R·t + B over every window.
#[test]
fn quota_run_under_faults_stays_within_its_bound() {
    let dir = out_dir("chaos-quota");
    phase("quota chaos run, 20 s, leader kill, partitions, pause");
    let (ok, v) = chaos(&dir, &quota_run_args(false));
    assert!(ok, "the quota run must pass:\n{}", summary(&v));
    let check = &v["violations"]["9_quota_window"];
    assert_eq!(check["count"], 0, "{check:#}");

    phase("it exercised the limit");
    let limited = &v["operations"]["by_function"]["limited"];
    let (admitted, refused) = (
        limited["ok"].as_u64().unwrap_or(0),
        limited["fail"].as_u64().unwrap_or(0),
    );
    // 20 s at 10/s + 20 allows about 220, less while faults cut proxies off (strict: a
    // proxy that cannot renew stops); the clients offered far more. A loaded machine admits
    // fewer (48 seen with all four chaos tests at once), so the floor is low.
    assert!(
        admitted >= 20,
        "too few admitted to mean anything: {limited}"
    );
    assert!(
        refused > admitted,
        "the clients did not exceed the quota: {limited}"
    );
    assert!(check["checked_by_kind"]["windows"].as_u64().unwrap_or(0) >= 20);
    let faults = v["faults"]["total"].as_u64().unwrap_or(0);
    assert!(faults >= 2, "too few faults injected: {faults}");
}

/// The quota check can fail: the same run with buckets that refill on every lease renewal
/// admits about B more per lease, and the check reports the worst window.
#[test]
fn quota_refill_on_renew_is_caught() {
    let dir = out_dir("chaos-quota-unsafe");
    phase("unsafe quota chaos run (refill on renewal), 20 s");
    let (ok, v) = chaos(&dir, &quota_run_args(true));
    assert!(!ok, "the unsafe run must exit non-zero");
    let check = &v["violations"]["9_quota_window"];
    let n = check["count"].as_u64().unwrap_or(0);
    assert!(
        n > 0,
        "invariant 9 must report the overshoot: {:#}",
        v["violations"]
    );
    let worst = &check["first"];
    assert!(
        worst["admitted"].as_f64().unwrap_or(0.0) > worst["bound"].as_f64().unwrap_or(f64::MAX),
        "the worst window must show the overshoot: {worst}"
    );
    eprintln!("caught: {n} windows over the bound; worst: {worst}");
}

/// A short quota-only run: no lock workers, the faults the quota design must survive.
fn quota_run_args(unsafe_refill: bool) -> Vec<&'static str> {
    let mut args = vec![
        "--duration-s",
        "20",
        "--workers",
        "0",
        "--zombies",
        "0",
        "--quota-clients",
        "3",
        "--nemesis",
        "kill-leader,partition-leader,partition-minority,pause",
        "--seed",
        "13",
    ];
    if unsafe_refill {
        args.push("--unsafe-refill-on-renew");
    }
    args
}
