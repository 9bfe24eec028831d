//! A local 3-node fencegate cluster as separate `fencegate node` processes (temp data dirs,
//! free 127.0.0.1 ports, optional fencing proxies in front of a demo store), and the cluster
//! status calls the scenarios use (leader, snapshot index) on any cluster.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

pub struct NodeProc {
    pub id: u64,
    /// `http://127.0.0.1:P`
    pub api: String,
    pub proxy: Option<String>,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

pub struct LocalCluster {
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    bin: PathBuf,
    pub nodes: Vec<NodeProc>,
    store: Option<Child>,
}

/// The top of node `id`'s config file in a local three-node cluster: its public and peer
/// listeners and the `[node]` table (left open, so callers can add keys to it). Members are
/// numbered from 1 in port order; every node gets the same `secret`.
pub fn node_toml(
    id: u64,
    api_ports: &[u16],
    peer_ports: &[u16],
    data_dir: &Path,
    secret: &str,
) -> String {
    let members: Vec<String> = api_ports
        .iter()
        .zip(peer_ports)
        .enumerate()
        .map(|(i, (api, peer))| {
            format!(
                "\"{}\" = {{ api = \"127.0.0.1:{api}\", peer = \"127.0.0.1:{peer}\" }}",
                i + 1
            )
        })
        .collect();
    let i = id as usize - 1;
    format!(
        "listen = \"127.0.0.1:{}\"\npeer_listen = \"127.0.0.1:{}\"\n\n[node]\nid = {id}\n\
         data_dir = \"{}\"\npeer_secret = \"{secret}\"\ninitial_members = {{ {} }}\n",
        api_ports[i],
        peer_ports[i],
        data_dir.display(),
        members.join(", ")
    )
}

/// A fresh peer secret for a local cluster (256 random bits, hex).
pub fn peer_secret() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Reserves `n` distinct free loopback ports (bound together, then released).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .context("reserve a free port")?;
    Ok(listeners
        .iter()
        .filter_map(|l| l.local_addr().ok().map(|a| a.port()))
        .collect())
}

/// The `fencegate` binary: the explicit path, else next to this executable, else the
/// workspace's target/release or target/debug, else `fencegate` on PATH.
pub fn find_fencegate_bin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--fencegate-bin {} does not exist", p.display());
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("fencegate"));
        }
    }
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    candidates.push(ws.join("target/release/fencegate"));
    candidates.push(ws.join("target/debug/fencegate"));
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&paths) {
            let c = d.join("fencegate");
            if c.is_file() {
                return Ok(c);
            }
        }
    }
    bail!(
        "no `fencegate` binary found: build it with `cargo build --release -p proxy --bin fencegate` \
         or pass --fencegate-bin"
    )
}

impl LocalCluster {
    /// Writes three node configs and starts the nodes (and, with `proxies`, a demo store and
    /// a fencing proxy per node routing `/kv/{key}` to it as resource `kv:{key}`).
    pub fn start(bin: PathBuf, dir: Option<PathBuf>, proxies: bool) -> anyhow::Result<Self> {
        if let Some(d) = &dir {
            // Node data from an earlier run holds that run's ports in its membership.
            if d.join("node1").exists() {
                bail!(
                    "--data-dir {} already holds a cluster; give an empty or new directory",
                    d.display()
                );
            }
        }
        let (dir, tmp) = cluster_dir(dir, "fencegate-loadtest-")?;
        let ports = free_ports(10)?;
        let api_ports = &ports[0..3];
        let proxy_ports = &ports[3..6];
        let store_port = ports[6];
        let peer_ports = &ports[7..10];
        let secret = peer_secret();
        let mut cluster = LocalCluster {
            dir: dir.clone(),
            _tmp: tmp,
            bin,
            nodes: Vec::new(),
            store: None,
        };
        if proxies {
            let log = std::fs::File::create(dir.join("demo-store.log"))?;
            let child = Command::new(&cluster.bin)
                .args(["demo-store", "--listen", &format!("127.0.0.1:{store_port}")])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("start {} demo-store", cluster.bin.display()))?;
            cluster.store = Some(child);
        }
        for i in 0..3 {
            let id = i as u64 + 1;
            let data = dir.join(format!("node{id}"));
            let mut toml = node_toml(id, api_ports, peer_ports, &data, &secret);
            if proxies {
                toml.push_str(&format!(
                    "\n[proxy]\nlisten = \"127.0.0.1:{}\"\ngrant_ms = 2000\n\n[[proxy.routes]]\npath = \"/kv/{{key}}\"\nresource = \"kv:{{key}}\"\nupstream = \"127.0.0.1:{store_port}\"\nupstream_timeout_ms = 1000\n",
                    proxy_ports[i]
                ));
            }
            let config = dir.join(format!("node{id}.toml"));
            std::fs::File::create(&config)?.write_all(toml.as_bytes())?;
            cluster.nodes.push(NodeProc {
                id,
                api: format!("http://127.0.0.1:{}", api_ports[i]),
                proxy: proxies.then(|| format!("http://127.0.0.1:{}", proxy_ports[i])),
                config,
                log: dir.join(format!("node{id}.log")),
                child: None,
            });
        }
        for id in 1..=3 {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut NodeProc> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let bin = self.bin.clone();
        let n = self.node_mut(id)?;
        n.child = Some(spawn_node(
            &bin,
            &n.config,
            &n.log,
            "FENCEGATE_LOADTEST_NODE_LOG",
        )?);
        Ok(())
    }

    pub fn api_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.api.clone()).collect()
    }

    pub fn proxy_urls(&self) -> Vec<String> {
        self.nodes.iter().filter_map(|n| n.proxy.clone()).collect()
    }

    pub fn pid(&self, id: u64) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .and_then(|n| n.child.as_ref().map(Child::id))
    }

    /// SIGKILL (`hard`) or SIGTERM and wait for the process to exit.
    pub fn stop_node(&mut self, id: u64, hard: bool) -> anyhow::Result<()> {
        let n = self.node_mut(id)?;
        if let Some(mut child) = n.child.take() {
            stop_child(&mut child, hard);
        }
        Ok(())
    }

    /// Restarts a stopped node with the same config and data dir.
    pub fn restart_node(&mut self, id: u64) -> anyhow::Result<()> {
        self.spawn(id)
    }

    /// A process that exited on its own (a crash) is an error worth reporting.
    pub fn check_alive(&mut self) -> Vec<String> {
        let mut dead = Vec::new();
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    dead.push(format!(
                        "node {} exited unexpectedly ({status}); see {}",
                        n.id,
                        n.log.display()
                    ));
                    n.child = None;
                }
            }
        }
        dead
    }

    pub fn stop_all(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                stop_child(&mut c, false);
            }
        }
        if let Some(mut c) = self.store.take() {
            stop_child(&mut c, false);
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn stop_child(child: &mut Child, hard: bool) {
    let pid = child.id() as libc::pid_t;
    let sig = if hard { libc::SIGKILL } else { libc::SIGTERM };
    // SAFETY: `pid` is our own child, not yet reaped (we hold its `Child`).
    unsafe {
        libc::kill(pid, sig);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// VmRSS and VmHWM (peak) of a process in MiB, from /proc.
pub fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

// ---- status of any cluster --------------------------------------------------------------

#[derive(Clone, Debug, Default)]
pub struct NodeStatus {
    pub node_id: u64,
    pub leader_id: Option<u64>,
    pub last_applied: u64,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    pub last_token: u64,
    pub active_locks: u64,
    pub resources: u64,
    pub dedup_records: u64,
}

pub async fn node_status(http: &reqwest::Client, base: &str) -> anyhow::Result<NodeStatus> {
    let v: Value = http
        .get(format!("{base}/v1/cluster"))
        .timeout(Duration::from_millis(1000))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let u = |k: &str| v.get(k).and_then(Value::as_u64);
    let locks = v.get("locks").cloned().unwrap_or(Value::Null);
    let l = |k: &str| locks.get(k).and_then(Value::as_u64).unwrap_or(0);
    Ok(NodeStatus {
        node_id: u("node_id").unwrap_or(0),
        leader_id: u("leader_id"),
        last_applied: u("last_applied").unwrap_or(0),
        snapshot_index: u("snapshot_index"),
        purged_index: u("purged_index"),
        last_token: l("last_token"),
        active_locks: l("active_locks"),
        resources: l("resources"),
        dedup_records: l("dedup_records"),
    })
}

/// The statuses of every reachable node, with the endpoint index they came from.
pub async fn statuses(http: &reqwest::Client, bases: &[String]) -> Vec<(usize, NodeStatus)> {
    let mut out = Vec::new();
    for (i, b) in bases.iter().enumerate() {
        if let Ok(s) = node_status(http, b).await {
            out.push((i, s));
        }
    }
    out
}

/// The leader's node id and endpoint index, if a node that reports itself as leader (or a
/// majority view) is reachable.
pub async fn find_leader(http: &reqwest::Client, bases: &[String]) -> Option<(u64, usize)> {
    let st = statuses(http, bases).await;
    let leader = st.iter().find_map(|(_, s)| s.leader_id)?;
    let idx = st
        .iter()
        .find(|(_, s)| s.node_id == leader)
        .map(|(i, _)| *i)?;
    Some((leader, idx))
}

/// Waits until every given node answers /readyz and they agree on a leader.
pub async fn wait_ready(
    http: &reqwest::Client,
    bases: &[String],
    timeout: Duration,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + timeout;
    loop {
        let st = statuses(http, bases).await;
        if st.len() == bases.len() {
            let leaders: Vec<Option<u64>> = st.iter().map(|(_, s)| s.leader_id).collect();
            if let Some(Some(l)) = leaders.first() {
                if leaders.iter().all(|x| *x == Some(*l)) {
                    let mut ready = true;
                    for b in bases {
                        let ok = http
                            .get(format!("{b}/readyz"))
                            .timeout(Duration::from_millis(500))
                            .send()
                            .await
                            .map(|r| r.status().is_success())
                            .unwrap_or(false);
                        ready &= ok;
                    }
                    if ready {
                        return Ok(*l);
                    }
                }
            }
        }
        if Instant::now() > deadline {
            bail!("cluster at {bases:?} not ready (no agreed leader) within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts `fencegate node --config CONFIG`, appending its output to `log`. The node's log
/// filter comes from the environment variable `log_env` (default `warn`).
pub fn spawn_node(
    bin: &std::path::Path,
    config: &std::path::Path,
    log: &std::path::Path,
    log_env: &str,
) -> anyhow::Result<std::process::Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Command::new(bin)
        .arg("node")
        .arg("--config")
        .arg(config)
        .env(
            "RUST_LOG",
            std::env::var(log_env).unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("start {} node", bin.display()))
}

/// The directory a cluster's nodes keep their data and logs in: `dir` (created if missing), or a
/// fresh temp dir named `prefix…` that is removed when the returned guard is dropped.
pub fn cluster_dir(
    dir: Option<std::path::PathBuf>,
    prefix: &str,
) -> anyhow::Result<(std::path::PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
            Ok((d, None))
        }
        None => {
            let t = tempfile::Builder::new().prefix(prefix).tempdir()?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}
