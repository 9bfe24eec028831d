//! A node whose disk fills up, run as an operator runs it: one `fencegate node` process with
//! its data directory on a small tmpfs. When a write fails for lack of space, raft stops; the
//! node must then exit with an error (so that its supervisor notices and restarts it) instead
//! of staying up half-dead and answering its health checks, and after space is freed a restart
//! must find every lease it acknowledged.
//!
//! Mounting a tmpfs needs root, which CI has; elsewhere the test says so and does nothing.

mod common;

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_ports, phase};
use serde_json::{json, Value};

const FENCEGATE: &str = env!("CARGO_BIN_EXE_fencegate");

/// A tmpfs mounted on a directory, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn spawn(config: &Path, log: &Path) -> Child {
    let log = File::options()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    Command::new(FENCEGATE)
        .arg("node")
        .arg("--config")
        .arg(config)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn fencegate")
}

async fn wait_ready(http: &reqwest::Client, api: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = http
            .get(format!("http://{api}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "the node never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fills the file system holding `dir` with one file until a write fails.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = File::create(&path).expect("filler");
    let chunk = vec![0xA5u8; 256 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_exits_and_keeps_what_it_acknowledged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(disk) = Tmpfs::mount(&dir.path().join("disk"), "64m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let ports = free_ports(2);
    let (api, peer) = (
        format!("127.0.0.1:{}", ports[0]),
        format!("127.0.0.1:{}", ports[1]),
    );
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{api}\"\npeer_listen = \"{peer}\"\n[node]\nid = 1\n\
             data_dir = \"{data}\"\npeer_secret = \"0123456789abcdef0123456789abcdef\"\n\
             auth = \"off\"\n[node.initial_members]\n\"1\" = {{ api = \"{api}\", peer = \"{peer}\" }}\n",
            data = disk.0.join("data").display(),
        ),
    )
    .expect("config");
    let log = dir.path().join("node.log");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let mut node = spawn(&config, &log);
    wait_ready(&http, &api).await;

    phase("the disk fills up while clients acquire locks");
    let filler = fill(&disk.0);
    let mut granted: Vec<(String, u64)> = Vec::new();
    for i in 0..2_000 {
        let resource = format!("full:{i}");
        let sent = http
            .post(format!("http://{api}/v1/locks/{resource}/acquire"))
            .json(&json!({ "request_id": format!("req-full-{i}-{}", "x".repeat(100)) }))
            .send()
            .await;
        let Ok(resp) = sent else { break };
        if resp.status().as_u16() == 200 {
            let v: Value = resp.json().await.expect("grant");
            granted.push((resource, v["fencing_token"].as_u64().expect("token")));
        }
        if node.try_wait().expect("poll").is_some() {
            break;
        }
    }

    phase("raft stops for lack of space: the node exits with status 1 and says why");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = node.try_wait().expect("poll") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = node.kill();
            panic!(
                "the node stayed up after its disk filled ({} leases granted): {}",
                granted.len(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(
        said.contains("raft stopped") && said.contains("No space left"),
        "{said}"
    );
    assert!(!said.contains("panicked"), "{said}");

    phase("with space freed, a restart finds every lease it acknowledged");
    std::fs::remove_file(&filler).expect("free the space");
    let mut node = spawn(&config, &log);
    wait_ready(&http, &api).await;
    for (resource, token) in &granted {
        let v: Value = http
            .get(format!("http://{api}/v1/locks/{resource}"))
            .send()
            .await
            .expect("read")
            .json()
            .await
            .expect("JSON");
        assert_eq!(
            (v["held"].as_bool(), v["fencing_token"].as_u64()),
            (Some(true), Some(*token)),
            "{resource}: {v}"
        );
    }
    let _ = node.kill();
    let _ = node.wait();
    eprintln!("{} leases granted before the disk was full", granted.len());
}
