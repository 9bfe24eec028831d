//! CI runs the load harness: `fencegate-loadtest run --profile smoke` against a 3-node cluster
//! of real `fencegate node` processes that the harness starts itself, then checks what it
//! reports: no lost or duplicate lease, tokens increase per resource.
//!
//! The test builds nothing itself when it can avoid it: `cargo test --workspace` has already
//! built the workspace's binaries next to this test's target directory.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

/// target/<profile>/fencegate, built with cargo if it is missing.
fn fencegate_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/smoke-<hash>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf();
    let bin = profile_dir.join("fencegate");
    if bin.is_file() {
        return bin;
    }
    eprintln!("{} missing; building it", bin.display());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "proxy", "--bin", "fencegate"]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build");
    assert!(
        status.success() && bin.is_file(),
        "could not build the fencegate binary ({}); run `cargo build -p proxy --bin fencegate` first",
        bin.display()
    );
    bin
}

fn run_profile(scenario: &str) -> Value {
    run_profile_with(scenario, &[])
}

fn run_profile_with(scenario: &str, extra: &[&str]) -> Value {
    let bin = fencegate_bin();
    let out = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_fencegate-loadtest"))
        .args(["run", "--profile", "smoke", "--scenario", scenario, "--out"])
        .arg(out.path())
        .arg("--fencegate-bin")
        .arg(&bin)
        .args(extra)
        .output()
        .expect("run fencegate-loadtest");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!(
        "fencegate-loadtest ({scenario}) took {:.1}s\n{stdout}\n{stderr}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        output.status.success(),
        "fencegate-loadtest failed: {}",
        output.status
    );
    for plot in ["latency_cdf.svg", "throughput.svg", "p99.svg"] {
        assert!(out.path().join(plot).is_file(), "{plot} missing");
    }
    let text = std::fs::read_to_string(out.path().join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary.json is JSON")
}

fn n(v: &Value, path: &[&str]) -> u64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_u64()
        .unwrap_or_else(|| panic!("{} missing in summary.json", path.join(".")))
}

#[test]
fn smoke_profile_grants_leases_and_loses_none() {
    let s = run_profile("steady");

    // The workload ran: leases were granted, renewed and released.
    assert!(
        n(&s, &["ops", "acquire", "ok"]) > 0,
        "no successful acquire"
    );
    assert!(n(&s, &["ops", "renew", "ok"]) > 0, "no successful renew");
    assert!(
        n(&s, &["ops", "release", "ok"]) > 0,
        "no successful release"
    );
    assert!(n(&s, &["invariants", "grants"]) > 0);

    // Every grant has its own token and lease id, tokens increase per resource, and no
    // lease the client still held was dropped by the service.
    assert_eq!(n(&s, &["invariants", "duplicate_tokens"]), 0, "{s:#}");
    assert_eq!(n(&s, &["invariants", "duplicate_leases"]), 0, "{s:#}");
    assert_eq!(n(&s, &["invariants", "non_monotonic_tokens"]), 0, "{s:#}");
    assert_eq!(n(&s, &["invariants", "lost_leases"]), 0, "{s:#}");
    assert_eq!(s["server_token_consistent"], Value::Bool(true), "{s:#}");
    assert!(
        s["node_failures"].as_array().is_some_and(Vec::is_empty),
        "{s:#}"
    );
}

/// The follower stopped for the whole run comes back with its data directory deleted (a
/// replaced disk) and catches up from nothing; the run lost no lease.
#[test]
fn a_follower_that_lost_its_data_catches_up_after_the_run() {
    let s = run_profile_with("replica-down", &["--lose-data"]);
    let c = &s["catch_up"];
    assert_eq!(
        c["data_lost"],
        Value::Bool(true),
        "no catch-up report: {s:#}"
    );
    assert!(n(&s, &["catch_up", "target_index"]) > 0, "{c:#}");
    assert!(n(&s, &["catch_up", "resources_on_leader"]) > 0, "{c:#}");
    assert!(n(&s, &["ops", "acquire", "ok"]) > 0);
    assert_eq!(n(&s, &["invariants", "lost_leases"]), 0, "{s:#}");
    assert_eq!(n(&s, &["invariants", "duplicate_tokens"]), 0, "{s:#}");
    assert!(
        s["node_failures"].as_array().is_some_and(Vec::is_empty),
        "{s:#}"
    );
}

#[test]
fn leader_kill_mid_run_loses_no_lease_and_recovers() {
    let s = run_profile("leader-kill");

    // The fault happened and the cluster came back: killing the leader mid-load loses no
    // committed lease and issues no duplicate lease; tokens stay monotonic.
    let k = &s["leader_kill"];
    assert!(k.is_object(), "no leader-kill report: {s:#}");
    assert!(k["new_leader_after_ms"].is_u64(), "no new leader: {k:#}");
    assert!(
        k["first_success_after_ms"].is_u64(),
        "never recovered: {k:#}"
    );
    assert!(n(&s, &["ops", "acquire", "ok"]) > 0);

    assert_eq!(n(&s, &["invariants", "duplicate_tokens"]), 0, "{s:#}");
    assert_eq!(n(&s, &["invariants", "duplicate_leases"]), 0, "{s:#}");
    assert_eq!(n(&s, &["invariants", "non_monotonic_tokens"]), 0, "{s:#}");
    assert_eq!(n(&s, &["invariants", "lost_leases"]), 0, "{s:#}");
    assert_eq!(s["server_token_consistent"], Value::Bool(true), "{s:#}");
}

#[test]
fn closed_loop_cycles_keep_tokens_increasing_and_holders_apart() {
    let bin = fencegate_bin();
    let out = tempfile::tempdir().expect("temp dir");
    // Two clients on four resources: they draw the same resource often, so acquires queue
    // behind each other and every resource passes through many holders.
    let output = Command::new(env!("CARGO_BIN_EXE_fencegate-loadtest"))
        .args([
            "run",
            "--scenario",
            "cycles",
            "--clients",
            "2",
            "--resources",
            "4",
        ])
        .args(["--warmup-s", "1", "--duration-s", "2", "--out"])
        .arg(out.path())
        .arg("--fencegate-bin")
        .arg(&bin)
        .output()
        .expect("run fencegate-loadtest");
    eprintln!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "fencegate-loadtest failed: {}",
        output.status
    );
    assert!(
        out.path().join("summary.md").is_file(),
        "summary.md missing"
    );
    let text = std::fs::read_to_string(out.path().join("summary.json")).expect("summary.json");
    let s: Value = serde_json::from_str(&text).expect("summary.json is JSON");

    // One line per loop, and each did its work.
    let lines = s["lines"].as_array().expect("lines");
    assert_eq!(lines.len(), 2, "{s:#}");
    for (line, what) in lines.iter().zip(["cycle", "renew"]) {
        assert_eq!(line["loop"], what, "{line:#}");
        assert!(n(line, &["ok"]) > 0, "no completed {what}: {line:#}");
        assert_eq!(n(line, &["errors"]), 0, "{line:#}");
    }

    // Cycles happened on the same few resources, and each resource's holds never overlapped
    // and got ever higher tokens; every grant had its own token and lease id.
    let c = &s["checks"];
    assert!(n(c, &["invariants", "grants"]) > 4, "{c:#}");
    assert_eq!(n(c, &["overlapping_holders"]), 0, "{c:#}");
    assert_eq!(n(c, &["invariants", "non_monotonic_tokens"]), 0, "{c:#}");
    assert_eq!(n(c, &["invariants", "duplicate_tokens"]), 0, "{c:#}");
    assert_eq!(n(c, &["invariants", "duplicate_leases"]), 0, "{c:#}");
    assert_eq!(n(c, &["invariants", "lost_leases"]), 0, "{c:#}");
    assert_eq!(s["server_token_consistent"], Value::Bool(true), "{s:#}");
    assert!(
        s["node_failures"].as_array().is_some_and(Vec::is_empty),
        "{s:#}"
    );
}
