//! The system under test as real OS processes: three `fencegate node` processes, each with a
//! fencing proxy in front of one shared `fencegate demo-store`, fault injection enabled.
//!
//! Everything the nemesis does to it goes through here: SIGKILL and restart (same config and
//! data dir), SIGSTOP / SIGCONT, and the nodes' `PUT /v1/admin/faults` (partitions and clock
//! offsets live in each node's transport fault layer, which a restart clears). The port and
//! binary helpers come from the load harness's `cluster` module.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::cluster::{free_ports, node_toml, peer_secret};

/// Proxy settings of the chaos cluster. A short grant keeps hand-offs on contended keys quick
/// (a release defers the next lease by at most one grant, docs/fencing.md).
pub const GRANT_MS: u64 = 1_500;
pub const UPSTREAM_TIMEOUT_MS: u64 = 1_000;
/// Raft election timeout upper bound (lock-core `raft/`): a pause must outlast it.
pub const ELECTION_TIMEOUT_MS: u64 = 800;

pub struct ChaosNode {
    pub id: u64,
    /// `http://127.0.0.1:P` of the node API.
    pub api: String,
    /// `http://127.0.0.1:P` of the node's fencing proxy.
    pub proxy: String,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

pub struct ChaosCluster {
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    bin: PathBuf,
    pub nodes: Vec<ChaosNode>,
    pub store: String,
    store_child: Option<Child>,
    http: reqwest::Client,
}

/// The view `GET /v1/cluster` gives of one node.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub id: u64,
    pub leader_id: Option<u64>,
    pub term: u64,
    pub is_leader: bool,
    pub last_applied: u64,
}

impl ChaosCluster {
    /// Writes the configs and starts the demo store and the three nodes.
    pub fn start(
        bin: PathBuf,
        dir: Option<PathBuf>,
        unsafe_no_fencing: bool,
    ) -> anyhow::Result<Self> {
        let (dir, tmp) = crate::cluster::cluster_dir(dir, "fencegate-chaos-")?;
        let ports = free_ports(10)?;
        let (api_ports, proxy_ports, store_port) = (&ports[0..3], &ports[3..6], ports[6]);
        let peer_ports = &ports[7..10];
        let secret = peer_secret();
        let store = format!("127.0.0.1:{store_port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let mut cluster = ChaosCluster {
            dir: dir.clone(),
            _tmp: tmp,
            bin,
            nodes: Vec::new(),
            store: format!("http://{store}"),
            store_child: None,
            http,
        };
        let log = std::fs::File::create(dir.join("demo-store.log"))?;
        cluster.store_child = Some(
            Command::new(&cluster.bin)
                .args(["demo-store", "--listen", &store])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("start {} demo-store", cluster.bin.display()))?,
        );
        for i in 0..3 {
            let id = i as u64 + 1;
            let data = dir.join(format!("node{id}"));
            let toml = format!(
                "{head}enable_fault_injection = true\n\n\
                 [proxy]\nlisten = \"127.0.0.1:{proxy}\"\ngrant_ms = {GRANT_MS}\n\
                 unsafe_no_fencing = {unsafe_no_fencing}\n\n\
                 [[proxy.routes]]\npath = \"/kv/{{key}}\"\nresource = \"kv:{{key}}\"\n\
                 upstream = \"{store}\"\nupstream_timeout_ms = {UPSTREAM_TIMEOUT_MS}\n",
                head = node_toml(id, api_ports, peer_ports, &data, &secret),
                proxy = proxy_ports[i],
            );
            let config = dir.join(format!("node{id}.toml"));
            std::fs::write(&config, toml)?;
            cluster.nodes.push(ChaosNode {
                id,
                api: format!("http://127.0.0.1:{}", api_ports[i]),
                proxy: format!("http://127.0.0.1:{}", proxy_ports[i]),
                config,
                log: dir.join(format!("node{id}.log")),
                child: None,
                paused: false,
            });
        }
        for id in 1..=3 {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    fn node(&self, id: u64) -> anyhow::Result<&ChaosNode> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut ChaosNode> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let bin = self.bin.clone();
        let n = self.node_mut(id)?;
        let child =
            crate::cluster::spawn_node(&bin, &n.config, &n.log, "FENCEGATE_CHAOS_NODE_LOG")?;
        n.child = Some(child);
        n.paused = false;
        Ok(())
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.node(id).is_ok_and(|n| n.child.is_some() && !n.paused)
    }

    /// SIGKILL: nothing flushes, nothing is said goodbye to.
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let n = self.node_mut(id)?;
        if let Some(mut child) = n.child.take() {
            signal(&child, libc::SIGKILL);
            let _ = child.wait();
        }
        n.paused = false;
        Ok(())
    }

    /// Restarts a killed node with the same config and data dir.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.node(id)?.child.is_some() {
            return Ok(());
        }
        self.spawn(id)
    }

    /// SIGSTOP: the process keeps its sockets but does nothing (a GC pause, a VM stall).
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        let n = self.node_mut(id)?;
        if let Some(child) = &n.child {
            signal(child, libc::SIGSTOP);
            n.paused = true;
        }
        Ok(())
    }

    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        let n = self.node_mut(id)?;
        if let Some(child) = &n.child {
            signal(child, libc::SIGCONT);
        }
        n.paused = false;
        Ok(())
    }

    /// Replaces node `id`'s fault rules: `blocked` peers and a clock offset.
    pub async fn set_faults(
        &self,
        id: u64,
        blocked: &[u64],
        clock_offset_ms: i64,
    ) -> anyhow::Result<()> {
        let api = self.node(id)?.api.clone();
        let peers: BTreeMap<String, Value> = blocked
            .iter()
            .map(|p| (p.to_string(), json!({ "blocked": true })))
            .collect();
        let body = json!({ "peers": peers, "clock_offset_ms": clock_offset_ms });
        let resp = self
            .http
            .put(format!("{api}/v1/admin/faults"))
            .json(&body)
            .send()
            .await
            .with_context(|| format!("set faults on node {id}"))?;
        if !resp.status().is_success() {
            bail!("set faults on node {id}: {}", resp.status());
        }
        Ok(())
    }

    pub async fn view(&self, id: u64) -> Option<NodeView> {
        let api = &self.node(id).ok()?.api;
        let v: Value = self
            .http
            .get(format!("{api}/v1/cluster"))
            .timeout(Duration::from_millis(700))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        Some(NodeView {
            id,
            leader_id: v.get("leader_id").and_then(Value::as_u64),
            term: v.get("term").and_then(Value::as_u64).unwrap_or(0),
            is_leader: v.get("role").and_then(Value::as_str) == Some("leader"),
            last_applied: v.get("last_applied").and_then(Value::as_u64).unwrap_or(0),
        })
    }

    pub async fn views(&self) -> Vec<NodeView> {
        let mut out = Vec::new();
        for id in self.ids() {
            if self.is_up(id) {
                if let Some(v) = self.view(id).await {
                    out.push(v);
                }
            }
        }
        out
    }

    /// The node that says it leads in the highest term any reachable node reports.
    pub async fn leader(&self) -> Option<u64> {
        let views = self.views().await;
        views
            .iter()
            .filter(|v| v.is_leader)
            .max_by_key(|v| v.term)
            .map(|v| v.id)
            .or_else(|| {
                views
                    .iter()
                    .max_by_key(|v| v.term)
                    .and_then(|v| v.leader_id)
            })
    }

    /// Waits until every node answers and all agree on one leader.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let views = self.views().await;
            if views.len() == self.nodes.len() {
                if let Some(l) = views[0].leader_id {
                    if views.iter().all(|v| v.leader_id == Some(l)) {
                        return Ok(l);
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "cluster not ready (no agreed leader) within {timeout:?}; logs in {}",
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Processes that exited on their own (a crash is a finding, not noise).
    pub fn crashed(&mut self) -> Vec<String> {
        let mut dead = Vec::new();
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    dead.push(format!(
                        "node {} exited on its own ({status}); see {}",
                        n.id,
                        n.log.display()
                    ));
                    n.child = None;
                }
            }
        }
        dead
    }

    fn stop_all(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                // A stopped process stays stopped under SIGTERM: continue it first.
                signal(&c, libc::SIGCONT);
                stop_child(&mut c);
            }
        }
        if let Some(mut c) = self.store_child.take() {
            stop_child(&mut c);
        }
    }
}

impl Drop for ChaosCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: `child` is our own, not yet reaped child (we hold its `Child`), so the pid
    // cannot have been reused.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// SIGTERM, then SIGKILL if it has not exited after 5 s.
fn stop_child(child: &mut Child) {
    signal(child, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}
