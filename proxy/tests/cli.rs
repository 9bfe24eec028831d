//! The `fencegate` command line against a real three-node cluster (real raft over real
//! sockets, real fjall in a temp dir, real HTTP), run as a user runs it: the built binary,
//! its stdout, stderr and exit code.

use std::process::{Output, Stdio};
use std::time::Duration;

use lock_core::client::{AcquireOptions, Client};
use lock_core::testkit::{eventually, phase, TestCluster};
use lock_core::wire::{
    AcquireResponse, CancelResponse, ClusterStatus, DrainResponse, LockList, LockView, Member,
    MembershipResponse, ReleaseResponse,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const FENCEGATE: &str = env!("CARGO_BIN_EXE_fencegate");

struct Cluster {
    kit: TestCluster,
    /// `FENCEGATE_ENDPOINTS` for the commands: bare `host:port` and URL forms mixed on purpose.
    endpoints: String,
    client: Client,
}

impl Cluster {
    async fn start() -> Cluster {
        let kit = TestCluster::start(3).await;
        let addrs: Vec<&String> = kit.addrs.values().collect();
        let endpoints = format!("{},http://{}/,{}", addrs[0], addrs[1], addrs[2]);
        let client = Client::new(kit.addrs.values().map(|a| format!("http://{a}"))).unwrap();
        Cluster {
            kit,
            endpoints,
            client,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(FENCEGATE);
        cmd.args(args)
            .env("FENCEGATE_ENDPOINTS", &self.endpoints)
            .env(
                "FENCEGATE_ADMIN_TOKEN",
                lock_core::testkit::TEST_ADMIN_TOKEN,
            )
            // Users set this; a CLI error must still be one line, not a backtrace.
            .env("RUST_BACKTRACE", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Starts a long-running command; its stdout is read line by line, its stderr collected.
    fn spawn(&self, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().await.unwrap()
    }

    async fn json<T: serde::de::DeserializeOwned>(&self, args: &[&str]) -> T {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.run(&all).await;
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{args:?} printed no wire type ({e}): {}", text(&out.stdout))
        })
    }

    async fn view(&self, resource: &str) -> LockView {
        self.json(&["lock", "status", resource]).await
    }

    async fn stop(self) {
        self.kit.shutdown().await;
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One error line in the documented style, and no backtrace.
fn assert_error_line(out: &Output, code: &str) {
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!("error: {code}: ")),
        "expected 'error: {code}: …', got: {err}"
    );
    assert!(!err.contains("backtrace"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_run_hands_the_token_to_the_command_and_releases_when_it_exits() {
    let cluster = Cluster::start().await;

    phase("lock run: the command sees its token");
    // Phase 1: the command sees the fencing token and the resource in its environment.
    let out = cluster
        .run(&[
            "lock",
            "run",
            "job:report",
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
            "echo \"$FENCE_RESOURCE $FENCE_TOKEN\"",
        ])
        .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let (resource, token) = printed.trim().split_once(' ').unwrap();
    assert_eq!(resource, "job:report");
    let token: u64 = token.parse().unwrap();

    phase("the lock is released when the command exits");
    // Phase 2: the lock was released when the command exited (not left to expire), and the
    // token the command saw is the one the lock service issued.
    let view = cluster.view("job:report").await;
    assert!(
        !view.held,
        "lock still held after the command exited: {view:?}"
    );
    assert_eq!(view.fencing_token, Some(token));

    phase("the command's exit code is passed through");
    // Phase 3: the command's exit code is passed through, and the lock is released too.
    let out = cluster
        .run(&["lock", "run", "job:report", "--", "sh", "-c", "exit 7"])
        .await;
    assert_eq!(out.status.code(), Some(7));
    assert!(!cluster.view("job:report").await.held);

    phase("a held lock: exit 3, command not started");
    // Phase 4: a held lock is exit code 3 and the command never starts.
    let holder = cluster
        .client
        .acquire("job:report", AcquireOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let out = cluster
        .run(&["lock", "run", "job:report", "--", "sh", "-c", "echo ran"])
        .await;
    assert_eq!(out.status.code(), Some(3));
    assert_error_line(&out, "lock_held");
    assert!(out.stdout.is_empty(), "the command ran without the lock");
    holder.release().await.unwrap();

    phase("a missing command: exit 127, lock released");
    // Phase 5: a command that does not exist is 127, and its lock is released at once.
    let out = cluster
        .run(&[
            "lock",
            "run",
            "job:report",
            "--",
            "/nonexistent/fencegate-test",
        ])
        .await;
    assert_eq!(out.status.code(), Some(127));
    assert!(!cluster.view("job:report").await.held);
    cluster.stop().await;
}

/// A paused client must not keep working once its lease is gone: `lock run` is stopped
/// (SIGSTOP) past its TTL, another client takes the lock, and when `lock run` resumes it must
/// kill its command and exit with the lease-lost code, with the new holder untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_run_stops_its_command_when_the_lease_is_lost() {
    let cluster = Cluster::start().await;

    phase("a long command under a 2 s lease");
    // Phase 1: start a long command under a short lease; it reports its pid and token.
    let (runner, mut lines) = cluster.spawn(&[
        "lock",
        "run",
        "job:zombie",
        "--ttl",
        "2s",
        "--kill-grace",
        "5s",
        "--",
        "sh",
        "-c",
        "echo $$ $FENCE_TOKEN; exec sleep 600",
    ]);
    let first = lines
        .next_line()
        .await
        .unwrap()
        .expect("command printed nothing");
    let (pid, old_token) = first.split_once(' ').unwrap();
    let command_pid = Pid::from_raw(pid.parse().unwrap());
    let old_token: u64 = old_token.parse().unwrap();
    let runner_pid = Pid::from_raw(runner.id().unwrap() as i32);

    phase("fencegate frozen; a successor takes the lock");
    // Phase 2: freeze fencegate (not its command): no renewals. Another client queues for the
    // lock and gets it once the server expired the frozen lease.
    kill(runner_pid, Signal::SIGSTOP).unwrap();
    let successor = cluster
        .client
        .acquire(
            "job:zombie",
            AcquireOptions::new(Duration::from_secs(30)).wait_timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert!(successor.token() > old_token);

    phase("fencegate resumed: command stopped, exit 4");
    // Phase 3: wake it. Its guard is past its deadline: the command is stopped and the exit
    // code says the lease was lost.
    kill(runner_pid, Signal::SIGCONT).unwrap();
    let out = runner.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_error_line(&out, "lease_lost");
    assert!(
        kill(command_pid, None).is_err(),
        "the command (pid {command_pid}) still runs after its lease was lost"
    );

    phase("the successor's lease is intact");
    // Phase 4: the successor's lease is intact: fencegate's release used its own lease id.
    let view = cluster.view("job:zombie").await;
    assert!(view.held);
    assert_eq!(view.fencing_token, Some(successor.token()));
    assert!(successor.is_valid());
    successor.release().await.unwrap();
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_parses_as_the_wire_types() {
    let cluster = Cluster::start().await;

    let lease: AcquireResponse = cluster
        .json(&[
            "lock", "acquire", "kv:json", "--ttl", "30s", "--holder", "cli-test",
        ])
        .await;
    assert_eq!(lease.resource, "kv:json");
    let view = cluster.view("kv:json").await;
    assert!(view.held);
    assert_eq!(view.holder.as_deref(), Some("cli-test"));
    assert_eq!(view.fencing_token, Some(lease.fencing_token));

    let lease_id = lease.lease_id.to_string();
    let renewed: AcquireResponse = cluster
        .json(&["lock", "renew", "kv:json", "--lease-id", &lease_id])
        .await;
    assert_eq!(renewed.fencing_token, lease.fencing_token);

    let list: LockList = cluster.json(&["lock", "list", "--prefix", "kv:"]).await;
    assert_eq!(list.locks, vec![cluster.view("kv:json").await]);

    let status: ClusterStatus = cluster.json(&["cluster", "status"]).await;
    assert_eq!(status.members.len(), 3);
    let members: Vec<Member> = cluster.json(&["member", "list"]).await;
    assert_eq!(members, status.members);

    let released: ReleaseResponse = cluster
        .json(&["lock", "release", "kv:json", "--lease-id", &lease_id])
        .await;
    assert!(released.released);
    let again: ReleaseResponse = cluster
        .json(&["lock", "release", "kv:json", "--lease-id", &lease_id])
        .await;
    assert!(!again.released, "release is idempotent");

    let cancelled: CancelResponse = cluster
        .json(&["lock", "cancel", "kv:json", "nobody-waits"])
        .await;
    assert!(!cancelled.cancelled);

    // A renew of the released lease is "lease lost": exit code 4.
    let out = cluster
        .run(&["lock", "renew", "kv:json", "--lease-id", &lease_id])
        .await;
    assert_eq!(out.status.code(), Some(4));
    assert_error_line(&out, "lease_lost");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_tell_held_bad_input_and_unavailable_apart() {
    let cluster = Cluster::start().await;

    // Held: 3, also after a wait ran out, whose message must not suggest "retry after 0ns".
    let holder = cluster
        .client
        .acquire("kv:busy", AcquireOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let out = cluster.run(&["lock", "acquire", "kv:busy"]).await;
    assert_eq!(out.status.code(), Some(3));
    assert_error_line(&out, "lock_held");
    let out = cluster
        .run(&["lock", "acquire", "kv:busy", "--wait", "300ms"])
        .await;
    assert_eq!(out.status.code(), Some(3));
    assert_error_line(&out, "lock_held");
    assert!(!text(&out.stderr).contains("0ns"), "{}", text(&out.stderr));
    holder.release().await.unwrap();

    // Bad input: 2, before anything is sent.
    for args in [
        &["lock", "status", "bad name"][..],
        &["lock", "acquire", "kv:x", "--ttl", "30"],
        &["lock", "list", "--limit", "0"],
        &["lock", "status", "kv:x", "--endpoints", "127.0.0.1"],
        &[
            "lock",
            "status",
            "kv:x",
            "--endpoints",
            "http://127.0.0.1:1/v1",
        ],
    ] {
        let out = cluster.run(args).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).starts_with("error: "), "{args:?}");
        assert!(!text(&out.stderr).contains("backtrace"), "{args:?}");
    }
    // A 400 from the server is bad input too.
    let out = cluster.run(&["cluster", "remove", "--id", "99"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_error_line(&out, "invalid_request");

    // Unavailable: 5 when nothing listens (a port we bound and let go).
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    for args in [
        &["lock", "status", "kv:x", "-e", &dead][..],
        &["cluster", "status", "-e", &dead],
        &["member", "list", "--node", &dead],
        &["lock", "acquire", "kv:x", "-e", &dead, "--timeout", "300ms"],
        &[
            "lock",
            "run",
            "kv:x",
            "-e",
            &dead,
            "--timeout",
            "300ms",
            "--",
            "true",
        ],
    ] {
        let out = cluster.run(args).await;
        assert_eq!(
            out.status.code(),
            Some(5),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert_error_line(&out, "unavailable");
    }

    // Endpoints that accept and never answer (listeners nobody accepts on: the kernel
    // completes the connection): a read gives up when --timeout is used up, over all of them.
    let silent: Vec<std::net::TcpListener> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let silent_endpoints = silent
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out = cluster
        .run(&[
            "lock",
            "status",
            "kv:x",
            "-e",
            &silent_endpoints,
            "--timeout",
            "300ms",
        ])
        .await;
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--timeout of 300ms used up"),
        "{}",
        text(&out.stderr)
    );
    drop(silent);

    // One endpoint down among live ones is no error: the next one answers.
    let endpoints = format!("{dead},{}", cluster.endpoints);
    let out = cluster
        .run(&["lock", "status", "kv:x", "-o", "json", "-e", &endpoints])
        .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_watch_prints_each_change_until_stopped() {
    let cluster = Cluster::start().await;
    let (mut watcher, mut lines) = cluster.spawn(&[
        "lock",
        "watch",
        "kv:watched",
        "--interval",
        "50ms",
        "-o",
        "json",
    ]);
    let mut next = async || -> LockView {
        let line = lines.next_line().await.unwrap().expect("watch ended");
        serde_json::from_str(&line).unwrap()
    };

    phase("watch prints the current state");
    // Phase 1: the current state first.
    assert!(!next().await.held);
    phase("a grant is printed");
    // Phase 2: a grant shows up as a change, with the granted token.
    let guard = cluster
        .client
        .acquire("kv:watched", AcquireOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let held = next().await;
    assert!(held.held);
    assert_eq!(held.fencing_token, Some(guard.token()));
    phase("a release is printed");
    // Phase 3: and so does the release.
    guard.release().await.unwrap();
    assert!(!next().await.held);

    // SIGTERM (like Ctrl-C) ends the watch cleanly.
    kill(Pid::from_raw(watcher.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    assert!(watcher.wait().await.unwrap().success());
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_remove_answers_with_the_new_voter_set() {
    let cluster = Cluster::start().await;
    let leader = cluster.kit.wait_leader(Duration::from_secs(10)).await;
    let follower = cluster.kit.followers(leader)[0];

    phase("remove a follower through the CLI");
    let id = follower.to_string();
    let voters: MembershipResponse = cluster.json(&["cluster", "remove", "--id", &id]).await;
    assert_eq!(voters.voters.len(), 2);
    assert!(!voters.voters.contains(&follower));

    phase("member list no longer shows it as a voter");
    let members: Vec<Member> = cluster.json(&["member", "list"]).await;
    assert!(
        members.iter().all(|m| m.id != follower || !m.voter),
        "{members:?}"
    );
    cluster.stop().await;
}

/// `cluster drain --to N` hands leadership to that voter and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_drain_hands_leadership_to_the_named_voter() {
    let cluster = Cluster::start().await;
    let leader = cluster.kit.wait_leader(Duration::from_secs(10)).await;
    let to = cluster.kit.followers(leader)[1];
    // Raft refuses votes within a lease (800 ms) of an election.
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    phase("drain through the CLI, naming the successor");
    let moved: DrainResponse = cluster
        .json(&["cluster", "drain", "--to", &to.to_string()])
        .await;
    assert_eq!((moved.old_leader, moved.new_leader), (leader, to));
    assert_eq!(cluster.kit.wait_leader(Duration::from_secs(10)).await, to);
    cluster.stop().await;
}

/// `lock list` pages: a page that has more after it says how to get them, `--after` takes the
/// cursor, and `--all` reads every page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_list_pages_through_every_lock() {
    let cluster = Cluster::start().await;
    let mut leases = Vec::new();
    for i in 0..5 {
        let opts = AcquireOptions::new(Duration::from_secs(60));
        leases.push(
            cluster
                .client
                .acquire(&format!("page:{i}"), opts)
                .await
                .unwrap(),
        );
    }
    let names = |list: &LockList| -> Vec<String> {
        list.locks.iter().map(|l| l.resource.clone()).collect()
    };

    phase("a page of 2 names the next one on stderr");
    let out = cluster
        .run(&[
            "lock", "list", "--prefix", "page:", "--limit", "2", "-o", "table",
        ])
        .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("page:1") && !table.contains("page:2"),
        "{table}"
    );
    assert!(
        text(&out.stderr).contains("--after 'page:1'"),
        "stderr: {}\nstdout: {table}",
        text(&out.stderr)
    );

    phase("--after continues there; --all reads every page");
    let next: LockList = cluster
        .json(&[
            "lock", "list", "--prefix", "page:", "--limit", "2", "--after", "page:1",
        ])
        .await;
    assert_eq!(names(&next), ["page:2", "page:3"]);
    let all: LockList = cluster
        .json(&["lock", "list", "--prefix", "page:", "--limit", "2", "--all"])
        .await;
    assert_eq!(
        names(&all),
        ["page:0", "page:1", "page:2", "page:3", "page:4"]
    );
    assert_eq!(all.next_after, None);
    for lease in leases {
        lease.release().await.unwrap();
    }
    cluster.stop().await;
}

/// SIGTERM to `lock run` (a service manager stopping it, or Ctrl-C), or SIGHUP (its terminal
/// went away), is passed to the command as SIGTERM, and the lock is released once the command
/// has exited: the command never runs on without its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_run_passes_sigterm_on_and_releases() {
    let cluster = Cluster::start().await;
    for (signal, resource) in [
        (Signal::SIGTERM, "job:stopped"),
        (Signal::SIGHUP, "job:hung-up"),
    ] {
        let (mut runner, mut lines) = cluster.spawn(&[
            "lock",
            "run",
            resource,
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 600",
        ]);
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ready"));
        assert!(cluster.view(resource).await.held);

        phase(&format!(
            "{signal} to fencegate ends the command and the lock"
        ));
        kill(Pid::from_raw(runner.id().unwrap() as i32), signal).unwrap();
        let status = runner.wait().await.unwrap();
        assert_eq!(
            status.code(),
            Some(128 + 15),
            "the command's own end (SIGTERM)"
        );
        assert!(!cluster.view(resource).await.held);
    }
    cluster.stop().await;
}

/// SIGKILL to `lock run` leaves nobody to renew the lease or stop the command at its deadline:
/// the kernel kills the command with it, so it never runs on unlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_run_killed_takes_its_command_with_it() {
    let cluster = Cluster::start().await;
    let (mut runner, mut lines) = cluster.spawn(&[
        "lock",
        "run",
        "job:killed",
        "--",
        "sh",
        "-c",
        "echo $$; exec sleep 600",
    ]);
    let command: i32 = lines.next_line().await.unwrap().unwrap().parse().unwrap();
    assert!(running(command), "the command started");

    phase("SIGKILL to fencegate");
    runner.start_kill().unwrap();
    runner.wait().await.unwrap();
    eventually(Duration::from_secs(10), "the command is gone", async || {
        !running(command)
    })
    .await;
    cluster.stop().await;
}

/// Whether `pid` is a live process: neither gone nor a zombie waiting to be reaped.
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Ctrl-C while `lock run` waits in the queue withdraws the wait: no grant is left behind for a
/// command that will never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_run_interrupted_while_waiting_leaves_no_waiter() {
    let cluster = Cluster::start().await;
    let holder = cluster
        .client
        .acquire("job:queue", AcquireOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let (runner, mut lines) = cluster.spawn(&[
        "lock",
        "run",
        "job:queue",
        "--wait",
        "60s",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);

    phase("lock run waits in the queue");
    eventually(Duration::from_secs(10), "lock run queued", async || {
        cluster.view("job:queue").await.waiters == 1
    })
    .await;

    phase("SIGINT: the wait is cancelled and the command never runs");
    kill(Pid::from_raw(runner.id().unwrap() as i32), Signal::SIGINT).unwrap();
    let out = runner.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_error_line(&out, "interrupted");
    assert_eq!(lines.next_line().await.unwrap(), None, "the command ran");
    let view = cluster.view("job:queue").await;
    assert_eq!(view.waiters, 0, "{view:?}");
    assert_eq!(view.fencing_token, Some(holder.token()));
    holder.release().await.unwrap();
    cluster.stop().await;
}

/// `--log-format json` writes one JSON object per log line, and no colour codes reach a file
/// or pipe; the error line stays last and plain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_json_lines_without_colour_codes() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let out = Command::new(FENCEGATE)
        .args(["lock", "status", "kv:x", "-e", &dead])
        .args(["--log-level", "debug", "--log-format", "json"])
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(5));
    let err = text(&out.stderr);
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err}");
    let lines: Vec<&str> = err.lines().collect();
    let (last, logs) = lines.split_last().unwrap();
    assert!(last.starts_with("error: unavailable: "), "{last}");
    assert!(!logs.is_empty(), "debug logging printed nothing");
    for line in logs {
        serde_json::from_str::<serde::de::IgnoredAny>(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
    }
}
