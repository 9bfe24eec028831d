//! The harness's commands refuse what they cannot measure, before doing the work or instead
//! of passing: bad flags, an `--out` that cannot be written, a target that is not what it
//! should be. None of these start a cluster; each is bounded by a timeout.
//!
//! Plus the timer-lateness measurement, which must run and report both timers (its numbers
//! are the machine's, so nothing here asserts on them).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn phase(msg: &str) {
    eprintln!("---- {msg}");
}

fn harness() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fencegate-loadtest"))
}

/// Runs the harness with `args`; kills it after `limit` (a failure: it should have ended).
fn run(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(harness())
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fencegate-loadtest");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "fencegate-loadtest {args:?} still running after {limit:?}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// The run failed with status 1 and said `fragment` (on stderr).
fn refused(out: &Output, fragment: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit status; stderr:\n{stderr}");
    assert!(
        stderr.contains(fragment),
        "expected {fragment:?} in stderr:\n{stderr}"
    );
}

/// The workspace's `fencegate` binary if it is built (the flag checks only need a file).
fn some_bin() -> PathBuf {
    let next = harness().with_file_name("fencegate");
    if next.is_file() {
        next
    } else {
        PathBuf::from("/bin/true")
    }
}

#[test]
fn bad_flags_are_refused_before_anything_runs() {
    let bin = some_bin();
    let bin = bin.to_str().expect("utf-8 path");
    let quick = Duration::from_secs(10);
    let cases: &[(&[&str], &str)] = &[
        // A rate of 0 would panic in the arrival loop (no Duration for 1/0).
        (
            &["run", "--scenario", "ramp", "--ramp-factor", "0"],
            "--ramp-factor must be a number above 1",
        ),
        (
            &["run", "--scenario", "ramp", "--ramp-factor", "1"],
            "--ramp-factor",
        ),
        // A step of 0 s measured nothing and printed NaN.
        (
            &["run", "--scenario", "ramp", "--ramp-step-s", "0"],
            "--ramp-step-s must be at least 1",
        ),
        (
            &[
                "run",
                "--scenario",
                "ramp",
                "--ramp-tight-bound-ms",
                "500",
                "--ramp-bound-ms",
                "200",
            ],
            "--ramp-tight-bound-ms",
        ),
        (
            &["run", "--scenario", "ramp", "--ramp-max-rate", "10"],
            "--ramp-max-rate 10 is below",
        ),
        (&["run", "--rate", "0"], "--rate must be in"),
        (&["run", "--max-total-s", "0"], "--max-total-s must be"),
        (
            &[
                "run",
                "--scenario",
                "leader-kill",
                "--duration-s",
                "5",
                "--fault-at-s",
                "9",
            ],
            "--fault-at-s 9 is not within",
        ),
        // The etcd driver has no leader-kill or compaction: refused before the fencegate
        // half runs.
        (
            &[
                "compare",
                "--scenario",
                "leader-kill",
                "--fencegate-bin",
                bin,
            ],
            "the etcd driver runs",
        ),
        (
            &[
                "compare",
                "--scenario",
                "compaction",
                "--fencegate-bin",
                bin,
            ],
            "the etcd driver runs",
        ),
        (
            &[
                "run",
                "--system",
                "etcd",
                "--etcd-script",
                "/nonexistent/etcd.sh",
            ],
            "/nonexistent/etcd.sh does not exist",
        ),
        (
            &["chaos", "--duration-s", "0"],
            "--duration-s must be at least 1",
        ),
        (
            &[
                "chaos",
                "--workers",
                "0",
                "--zombies",
                "0",
                "--orderers",
                "0",
                "--quota-clients",
                "0",
            ],
            "no clients",
        ),
        (&["chaos", "--keys", "0"], "--keys must be at least 1"),
        (&["quota", "--phase-s", "0"], "--phase-s must be at least 1"),
        (
            &["handoff", "--duration-s", "0"],
            "--duration-s and --max-cycles must be at least 1",
        ),
        (
            &[
                "idempotency",
                "--duplicate-share",
                "0.8",
                "--concurrent-share",
                "0.5",
            ],
            "sum to at most 1",
        ),
    ];
    for (args, fragment) in cases {
        phase(&format!("{args:?}"));
        refused(&run(args, quick), fragment);
    }
}

/// An `--out` that cannot be created is refused before the run, and the error names it.
#[test]
fn an_unwritable_out_is_refused_up_front_by_path() {
    let bin = some_bin();
    let bin = bin.to_str().expect("utf-8 path");
    for cmd in ["run", "quota", "chaos"] {
        phase(&format!("{cmd} --out /proc/forbidden"));
        let out = run(
            &[cmd, "--out", "/proc/forbidden", "--fencegate-bin", bin],
            Duration::from_secs(10),
        );
        refused(&out, "/proc/forbidden");
    }
}

#[test]
fn a_missing_history_is_named() {
    let out = run(
        &["chaos", "--recheck", "/nonexistent/chaos"],
        Duration::from_secs(10),
    );
    refused(&out, "/nonexistent/chaos/history.jsonl");
}

/// Every check passes on a history with no client operation in it: that is no pass.
#[test]
fn a_history_without_client_operations_is_not_valid() {
    let dir = tempfile::tempdir().expect("temp dir");
    let note = r#"{"index":0,"time_ms":1.0,"mono_ms":0.0,"process":"harness","type":"info","f":"start","op":1,"value":{}}"#;
    std::fs::write(dir.path().join("history.jsonl"), format!("{note}\n")).expect("write");
    let path = dir.path().to_str().expect("utf-8 path");
    let out = run(&["chaos", "--recheck", path], Duration::from_secs(10));
    refused(&out, "violation(s), 1 other problem(s)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("nothing was measured"), "{stdout}");
}

/// An etcd data dir with an earlier run's members would make etcd.sh wait for minutes.
#[test]
fn an_etcd_data_dir_in_use_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("m1")).expect("mkdir");
    let path = dir.path().to_str().expect("utf-8 path");
    let out = run(
        &["run", "--system", "etcd", "--data-dir", path],
        Duration::from_secs(10),
    );
    refused(&out, "already holds an etcd cluster");
}

/// A tiny HTTP/1.1 server on 127.0.0.1:0 that answers `GET /log` with `[]` and everything
/// else with a 404 (not a fencegate API, not a proxy); counts the requests it answers.
struct NotFencegate {
    addr: String,
    requests: Arc<AtomicU64>,
}

impl NotFencegate {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(AtomicU64::new(0));
        let count = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let count = count.clone();
                std::thread::spawn(move || serve(stream, &count));
            }
        });
        NotFencegate { addr, requests }
    }
}

fn serve(stream: TcpStream, count: &AtomicU64) {
    let mut out = stream.try_clone().expect("clone stream");
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
            return;
        }
        count.fetch_add(1, Ordering::Relaxed);
        let (status, body) = if line.starts_with("GET") && target == "/log" {
            ("200 OK", "[]")
        } else {
            ("404 Not Found", "not here")
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// `handoff` against something that is not a fencegate API measured nothing: exit 1, and
/// its clients back off instead of hammering the target.
#[test]
fn a_handoff_that_hands_nothing_off_fails() {
    let target = NotFencegate::start();
    let out = run(
        &[
            "handoff",
            "--target",
            &target.addr,
            "--proxy-target",
            &target.addr,
            "--duration-s",
            "2",
        ],
        Duration::from_secs(30),
    );
    refused(&out, "nothing was measured");
    // Before the fix one client loop sent ~18,000 requests a second.
    let n = target.requests.load(Ordering::Relaxed);
    assert!(
        n < 2_000,
        "{n} requests in 2 s: the clients do not back off"
    );
}

/// `idempotency` through "proxies" that answer 404 to every order measured nothing.
#[test]
fn idempotency_without_a_proxy_fails_after_its_first_phase() {
    let target = NotFencegate::start();
    let out = run(
        &[
            "idempotency",
            "--proxy-target",
            &target.addr,
            "--store",
            &target.addr,
            "--duration-s",
            "1",
            "--clients",
            "2",
        ],
        Duration::from_secs(30),
    );
    refused(
        &out,
        "no request of POST /orders through the proxies succeeded",
    );
}

/// The measurement runs and reports both timers; how late each is depends on the machine.
#[test]
fn timer_lateness_reports_both_timers() {
    let out = run(
        &["timer-lateness", "--rate", "500", "--count", "250"],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for timer in ["tokio::time::sleep_until", "harness timer"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(timer))
            .unwrap_or_else(|| panic!("no line for {timer}:\n{stdout}"));
        assert!(line.contains("sent late p50"), "{line}");
    }
}
