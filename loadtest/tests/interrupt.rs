//! A harness that is interrupted, killed or cut short cleans up after itself and says so:
//! real `fencegate node` processes, the harness as a separate process, signals sent to its
//! pid alone (as `kill` or a supervisor would, not a terminal's Ctrl-C to the whole group).
//!
//! - SIGTERM mid-run: exit 143, every process it started is gone, its temp dir is removed.
//! - SIGINT while the chaos nemesis has a node SIGSTOPped: exit 130, the paused node is not
//!   left behind, `history.jsonl` holds whole lines only, and `verdict.json` checks them.
//! - SIGKILL: nothing can clean up, but the nodes die with the harness (`PR_SET_PDEATHSIG`).
//! - Nodes that exit at start-up fail the run at once, and their logs are kept.
//! - `--max-total-s` cutting the measured window short: reported as such, exit 1.
//!
//! All need the `fencegate` binary next to the harness (target/debug/fencegate), which
//! `cargo test --workspace` builds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn phase(msg: &str) {
    eprintln!("---- {msg}");
}

fn harness() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fencegate-loadtest"))
}

/// target/<profile>/fencegate, next to the harness binary.
fn fencegate() -> PathBuf {
    let bin = harness().with_file_name("fencegate");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p proxy --bin fencegate` first",
        bin.display()
    );
    bin
}

/// The harness with `args`, its temp dirs in `tmp`, output to files in `tmp`'s parent.
fn start(args: &[&str], tmp: &Path, log: &Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(harness())
        .args(args)
        .arg("--fencegate-bin")
        .arg(fencegate())
        .env("TMPDIR", tmp)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start fencegate-loadtest")
}

/// The pids whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if stat(child).is_some_and(|(_, ppid)| ppid == pid) {
            out.push(child);
        }
    }
    out
}

/// A process's state letter and parent pid, from /proc/PID/stat.
fn stat(pid: u32) -> Option<(char, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = s[s.rfind(')')? + 2..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// Whether `pid` is still a live `fencegate` process (not a zombie, not a reused pid).
fn alive(pid: u32) -> bool {
    let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmd.contains("fencegate") && stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// Waits until `f` returns something, at most `limit`.
fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The harness's three nodes (and the demo store, if it runs one), once they are all up.
fn wait_for_nodes(harness: &mut Child) -> Vec<u32> {
    let pid = harness.id();
    wait_for(Duration::from_secs(60), "three running nodes", || {
        if let Ok(Some(status)) = harness.try_wait() {
            panic!("the harness ended first: {status}");
        }
        let kids: Vec<u32> = children(pid).into_iter().filter(|p| alive(*p)).collect();
        let nodes = kids
            .iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.contains("node\0--config"))
            })
            .count();
        (nodes == 3).then_some(kids)
    })
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child, not yet waited for: the pid is still ours.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    wait_for(limit, "the harness to exit", || {
        child.try_wait().ok().flatten()
    })
}

/// None of `pids` is alive a moment after the harness ended; kills any that is (so a failing
/// test leaves nothing behind) and fails.
fn all_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left: Vec<u32> = pids.to_vec();
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|p| alive(*p));
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in &left {
        // SAFETY: SIGKILL to a leftover of this test's own harness.
        unsafe {
            libc::kill(*p as libc::pid_t, libc::SIGKILL);
        }
    }
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn sigterm_mid_run_stops_every_process_and_removes_the_temp_dir() {
    let root = tempfile::tempdir().expect("temp dir");
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let log = root.path().join("harness.log");

    phase("a smoke run with the fencing proxies, 60 s asked for");
    let mut h = start(&["run", "--duration-s", "60"], &tmp, &log);
    let kids = wait_for_nodes(&mut h);
    assert!(entries(&tmp)
        .iter()
        .any(|e| e.starts_with("fencegate-loadtest-")));
    // Into the workload.
    std::thread::sleep(Duration::from_secs(2));

    phase("SIGTERM to the harness's pid only");
    signal(&h, libc::SIGTERM);
    let status = wait_exit(&mut h, Duration::from_secs(60));
    eprintln!("{}", log_of(&log));
    assert_eq!(status.code(), Some(143), "{status}");
    all_gone(&kids);
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temp dirs left behind");
}

#[test]
fn sigint_while_a_node_is_paused_leaves_no_stopped_node_and_a_checked_history() {
    let root = tempfile::tempdir().expect("temp dir");
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let out = root.path().join("out");
    let out_s = out.to_str().expect("utf-8 path");
    let log = root.path().join("harness.log");

    phase("chaos with the pause nemesis only");
    let args = [
        "chaos",
        "--nemesis",
        "pause",
        "--duration-s",
        "120",
        "--workers",
        "2",
        "--zombies",
        "1",
        "--orderers",
        "1",
        "--quota-clients",
        "0",
        "--out",
        out_s,
    ];
    let mut h = start(&args, &tmp, &log);
    let kids = wait_for_nodes(&mut h);

    phase("wait until the nemesis has a node SIGSTOPped");
    let paused = wait_for(Duration::from_secs(60), "a paused node", || {
        kids.iter()
            .copied()
            .find(|p| stat(*p).is_some_and(|(state, _)| state == 'T'))
    });
    eprintln!("node process {paused} is stopped");

    phase("SIGINT to the harness");
    signal(&h, libc::SIGINT);
    let status = wait_exit(&mut h, Duration::from_secs(60));
    eprintln!("{}", log_of(&log));
    assert_eq!(status.code(), Some(130), "{status}");
    all_gone(&kids);

    phase("history.jsonl: whole lines only");
    let text = std::fs::read_to_string(out.join("history.jsonl")).expect("history.jsonl");
    assert!(text.ends_with('\n'), "the last line is cut");
    let lines = text.lines().count();
    for (i, line) in text.lines().enumerate() {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("line {} of {lines} is not JSON ({e}): {line}", i + 1));
    }
    assert!(lines > 1, "no events recorded");

    phase("verdict.json: the history so far, checked, marked as cut short");
    let verdict: Value = serde_json::from_slice(
        &std::fs::read(out.join("verdict.json")).expect("verdict.json of the run cut short"),
    )
    .expect("verdict.json is JSON");
    assert_eq!(verdict["mode"], "cut-short", "{verdict}");
    assert_eq!(verdict["valid"], false, "{verdict}");
    assert_eq!(verdict["violations_total"], 0, "{verdict}");
    let problems = verdict["problems"].to_string();
    assert!(problems.contains("interrupted (SIGINT)"), "{problems}");
    assert!(
        verdict["operations"]["client_operations"].as_u64() > Some(0),
        "{verdict}"
    );
}

#[test]
fn a_sigkilled_harness_takes_its_nodes_with_it() {
    let root = tempfile::tempdir().expect("temp dir");
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let log = root.path().join("harness.log");

    let mut h = start(&["run", "--duration-s", "60"], &tmp, &log);
    let kids = wait_for_nodes(&mut h);
    phase("SIGKILL: the harness cleans up nothing");
    signal(&h, libc::SIGKILL);
    let status = wait_exit(&mut h, Duration::from_secs(10));
    assert_eq!(status.code(), None, "{status}");
    // The kernel kills them (parent-death signal); the temp dir is left, and goes with `root`.
    all_gone(&kids);
}

#[test]
fn nodes_that_exit_at_start_fail_the_run_at_once_and_keep_their_logs() {
    let root = tempfile::tempdir().expect("temp dir");
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let started = Instant::now();
    let out = Command::new(harness())
        .args(["run", "--fencegate-bin", "/bin/false"])
        .env("TMPDIR", &tmp)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run the harness");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert_eq!(out.status.code(), Some(1));
    // It used to wait out the 30 s start-up timeout.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    assert!(stderr.contains("during start-up"), "{stderr}");
    let kept = entries(&tmp);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(
        stderr.contains(&kept[0]),
        "the kept directory is not named: {stderr}"
    );
    assert!(tmp.join(&kept[0]).join("node1.toml").is_file());
}

#[test]
fn a_run_cut_short_by_max_total_s_reports_what_it_measured_and_fails() {
    let root = tempfile::tempdir().expect("temp dir");
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let out = root.path().join("out");
    let log = root.path().join("harness.log");
    let args = [
        "run",
        "--duration-s",
        "20",
        "--warmup-s",
        "1",
        "--max-total-s",
        "5",
        "--out",
        out.to_str().expect("utf-8 path"),
    ];
    let mut h = start(&args, &tmp, &log);
    let status = wait_exit(&mut h, Duration::from_secs(120));
    let text = log_of(&log);
    eprintln!("{text}");
    assert_eq!(status.code(), Some(1), "{status}");
    assert!(text.contains("cut the run short"), "{text}");
    let s: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).expect("summary.json"),
    )
    .expect("summary.json is JSON");
    assert_eq!(s["cut_short"], Value::Bool(true));
    // 5 s after the first arrival, of which 1 s warm-up: 4 s measured, not 20.
    let measured = s["measured_s"].as_f64().expect("measured_s");
    assert!(measured > 3.0 && measured < 5.0, "measured_s {measured}");
    let acquired = s["ops"]["acquire"]["ok"].as_f64().expect("acquire ok");
    let rate = s["ops"]["acquire"]["rate_per_s"].as_f64().expect("rate");
    assert!(
        (rate - acquired / measured).abs() < 1e-6,
        "{rate} vs {acquired}/{measured}"
    );
}
