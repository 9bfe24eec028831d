//! [`LocalCluster`]: three `fencegate node` processes with their own configs, data dirs and
//! logs, optionally each with a fencing proxy in front of one shared `fencegate demo-store`.
//!
//! Everything a scenario or the nemesis does to it goes through here: SIGKILL, SIGTERM and
//! restart (same config and data dir), SIGSTOP / SIGCONT, and the nodes'
//! `PUT /v1/admin/faults` (partitions and clock offsets live in each node's transport fault
//! layer, which a restart clears).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lock_core::wire::{ClusterStatus, FaultRule, FaultSnapshot};

use super::process::{self, cluster_dir, free_ports, spawn_demo_store, spawn_node};
use super::status;

/// The fencing proxies: one per node, routing `/kv/{key}` to the demo store as resource
/// `kv:{key}`, and `POST /orders` to its create-order endpoint with `Idempotency-Key` required
/// (tenant from `X-Tenant`, lost answers reconciled through `GET /orders/by-key/{key}`), as in
/// `fencegate dev`.
#[derive(Clone, Copy, Debug)]
pub struct ProxySpec {
    /// How long one admission lets a proxy forward a token's writes; a release defers the
    /// next lease of the resource by at most this much.
    pub grant_ms: u64,
    pub upstream_timeout_ms: u64,
    /// Fence checks off (the chaos harness's proof that its checker can fail).
    pub unsafe_no_fencing: bool,
    /// Idempotency records off (the chaos harness's proof that its duplicate check can fail).
    pub unsafe_no_idempotency: bool,
    /// A global rate limit on `/limited/{key}` (tenant from `X-Tenant`), if any.
    pub quota: Option<QuotaSetup>,
}

impl ProxySpec {
    /// The load harness's proxies.
    pub const LOAD: ProxySpec = ProxySpec {
        grant_ms: 2_000,
        upstream_timeout_ms: 1_000,
        unsafe_no_fencing: false,
        unsafe_no_idempotency: false,
        quota: None,
    };
}

/// The quota `limited` of the proxies' `/limited/{key}` route (`strict`), routed to the demo
/// store, which records every request it answers there (`GET /limited-log`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaSetup {
    pub rate_per_s: u64,
    pub burst: u64,
    pub lease_ms: u64,
    /// Buckets refill on every lease renewal (the chaos harness's proof that its quota check
    /// can fail).
    pub unsafe_refill_on_renew: bool,
}

impl QuotaSetup {
    /// The `[proxy]` key and the tables that define the quota and its route.
    fn toml(&self, store: &str) -> (String, String) {
        let key = format!("unsafe_refill_on_renew = {}\n", self.unsafe_refill_on_renew);
        let tables = format!(
            "\n[[proxy.quotas]]\nname = \"limited\"\nrate_per_s = {rate}\nburst = {burst}\n\
             lease_ms = {lease}\npolicy = \"strict\"\n\n\
             [[proxy.routes]]\npath = \"/limited/{{key}}\"\nresource = \"limited:{{key}}\"\n\
             upstream = \"{store}\"\nprotected_methods = []\nquota = \"limited\"\n",
            rate = self.rate_per_s,
            burst = self.burst,
            lease = self.lease_ms,
        );
        (key, tables)
    }
}

/// What a harness wants of its cluster.
#[derive(Clone, Copy, Debug)]
pub struct ClusterSpec {
    /// Names the temp dir the nodes live in when no directory is given.
    pub tmp_prefix: &'static str,
    /// The environment variable with the nodes' log filter (default `warn`).
    pub log_env: &'static str,
    pub proxies: Option<ProxySpec>,
    /// Lets the nemesis set partitions and clock offsets through `PUT /v1/admin/faults`.
    pub fault_injection: bool,
}

pub struct Node {
    pub id: u64,
    /// `http://127.0.0.1:P` of the node API.
    pub api: String,
    /// `http://127.0.0.1:P` of the node's fencing proxy.
    pub proxy: Option<String>,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

pub struct LocalCluster {
    pub dir: PathBuf,
    /// The temp dir `dir` is, if the harness made it: removed when the cluster is dropped,
    /// after `Drop` has stopped the processes (fields drop after `drop` runs).
    tmp: Option<tempfile::TempDir>,
    bin: PathBuf,
    log_env: &'static str,
    pub nodes: Vec<Node>,
    /// `http://127.0.0.1:P` of the demo store, when the nodes run proxies.
    pub store: Option<String>,
    store_child: Option<Child>,
    http: reqwest::Client,
}

/// Nodes in a cluster the harness starts.
pub const LOCAL_NODES: usize = 3;

/// The demo store's log, in the cluster's directory.
const DEMO_STORE_LOG: &str = "demo-store.log";

impl LocalCluster {
    /// Writes the three node configs and starts the demo store (with proxies) and the nodes.
    pub fn start(bin: PathBuf, dir: Option<PathBuf>, spec: ClusterSpec) -> anyhow::Result<Self> {
        if let Some(d) = &dir {
            Self::check_data_dir(d)?;
        }
        let (dir, tmp) = cluster_dir(dir, spec.tmp_prefix)?;
        const N: usize = LOCAL_NODES;
        let ports = free_ports(3 * N + 1)?;
        let (api_ports, proxy_ports, store_port) = (&ports[0..N], &ports[N..2 * N], ports[2 * N]);
        let peer_ports = &ports[2 * N + 1..3 * N + 1];
        let store = format!("127.0.0.1:{store_port}");
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
        // Every node of the cluster shares one fresh peer secret.
        let secret: String = rand::random::<[u8; 32]>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut cluster = LocalCluster {
            dir: dir.clone(),
            tmp,
            bin,
            log_env: spec.log_env,
            nodes: Vec::new(),
            store: None,
            store_child: None,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()?,
        };
        if spec.proxies.is_some() {
            cluster.store_child = Some(spawn_demo_store(
                &cluster.bin,
                &store,
                &dir.join(DEMO_STORE_LOG),
            )?);
            cluster.store = Some(format!("http://{store}"));
        }
        for (i, (api_port, proxy_port)) in api_ports.iter().zip(proxy_ports).enumerate() {
            let id = i as u64 + 1;
            let mut toml = format!(
                "listen = \"127.0.0.1:{api_port}\"\npeer_listen = \"127.0.0.1:{peer_port}\"\n\n\
                 [node]\nid = {id}\ndata_dir = \"{data}\"\npeer_secret = \"{secret}\"\n\
                 initial_members = {{ {members} }}\n\
                 enable_fault_injection = {faults}\nauth = \"off\"\n",
                peer_port = peer_ports[i],
                data = dir.join(format!("node{id}")).display(),
                members = members.join(", "),
                faults = spec.fault_injection,
            );
            if let Some(p) = spec.proxies {
                toml.push_str(&format!(
                    "\n[proxy]\nlisten = \"127.0.0.1:{proxy_port}\"\ngrant_ms = {grant}\n\
                     unsafe_no_fencing = {unsafe_no_fencing}\n\
                     unsafe_no_idempotency = {unsafe_no_idempotency}\n\n\
                     [[proxy.routes]]\npath = \"/kv/{{key}}\"\nresource = \"kv:{{key}}\"\n\
                     upstream = \"{store}\"\nupstream_timeout_ms = {upstream_timeout}\n\n\
                     [[proxy.routes]]\npath = \"/orders\"\nresource = \"orders\"\n\
                     upstream = \"{store}\"\nupstream_timeout_ms = {upstream_timeout}\n\
                     protected_methods = []\nidempotency = \"required\"\n\
                     idempotency_options = {{ reconcile = \"/orders/by-key/{{key}}\" }}\n",
                    grant = p.grant_ms,
                    unsafe_no_fencing = p.unsafe_no_fencing,
                    unsafe_no_idempotency = p.unsafe_no_idempotency,
                    upstream_timeout = p.upstream_timeout_ms,
                ));
                if let Some(q) = p.quota {
                    let (key, tables) = q.toml(&store);
                    // The key belongs to `[proxy]`: before the first table of routes.
                    let at = toml.find("\n[[proxy.routes]]").unwrap_or(toml.len());
                    toml.insert_str(at, &key);
                    toml.push_str(&tables);
                }
            }
            let config = dir.join(format!("node{id}.toml"));
            std::fs::write(&config, toml).with_context(|| format!("write {}", config.display()))?;
            cluster.nodes.push(Node {
                id,
                api: format!("http://127.0.0.1:{api_port}"),
                proxy: spec
                    .proxies
                    .map(|_| format!("http://127.0.0.1:{proxy_port}")),
                config,
                log: dir.join(format!("node{id}.log")),
                child: None,
                paused: false,
            });
        }
        for id in cluster.ids() {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    /// Refuses a `--data-dir` with an earlier run's nodes in it: their data holds that run's
    /// ports in its membership.
    pub fn check_data_dir(d: &Path) -> anyhow::Result<()> {
        if d.join("node1").exists() {
            bail!(
                "--data-dir {} already holds a cluster; give an empty or new directory",
                d.display()
            );
        }
        Ok(())
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    pub fn api_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.api.clone()).collect()
    }

    pub fn proxy_urls(&self) -> Vec<String> {
        self.nodes.iter().filter_map(|n| n.proxy.clone()).collect()
    }

    fn node(&self, id: u64) -> anyhow::Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let (bin, log_env) = (self.bin.clone(), self.log_env);
        let n = self.node_mut(id)?;
        n.child = Some(spawn_node(&bin, &n.config, &n.log, log_env)?);
        n.paused = false;
        Ok(())
    }

    /// The pid of each running node, by its index in `nodes`.
    pub fn pids(&self) -> BTreeMap<usize, u32> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((i, n.child.as_ref()?.id())))
            .collect()
    }

    /// Running and not paused.
    pub fn is_up(&self, id: u64) -> bool {
        self.node(id).is_ok_and(|n| n.child.is_some() && !n.paused)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        self.end(id, process::kill)
    }

    /// SIGTERM: the node shuts down cleanly.
    pub fn stop(&mut self, id: u64) -> anyhow::Result<()> {
        self.end(id, process::stop)
    }

    fn end(&mut self, id: u64, how: fn(Child)) -> anyhow::Result<()> {
        let n = self.node_mut(id)?;
        if let Some(child) = n.child.take() {
            how(child);
        }
        n.paused = false;
        Ok(())
    }

    /// Deletes a stopped node's data directory (if it has one yet), as a replaced disk
    /// would: it starts empty next.
    pub fn lose_data(&mut self, id: u64) -> anyhow::Result<()> {
        if self.node(id)?.child.is_some() {
            bail!("node {id} is running; stop it before deleting its data");
        }
        let dir = self.dir.join(format!("node{id}"));
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            done => done.with_context(|| format!("delete {}", dir.display())),
        }
    }

    /// Restarts a stopped node with the same config and data dir (a running one is left be).
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
            process::signal(child, libc::SIGSTOP);
            n.paused = true;
        }
        Ok(())
    }

    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        let n = self.node_mut(id)?;
        if let Some(child) = &n.child {
            process::signal(child, libc::SIGCONT);
        }
        n.paused = false;
        Ok(())
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

    pub fn stop_all(&mut self) {
        for n in &mut self.nodes {
            if let Some(c) = n.child.take() {
                process::stop(c);
            }
        }
        if let Some(c) = self.store_child.take() {
            process::stop(c);
        }
    }

    /// Replaces node `id`'s fault rules: `blocked` peers and a clock offset.
    pub async fn set_faults(
        &self,
        id: u64,
        blocked: &[u64],
        clock_offset_ms: i64,
    ) -> anyhow::Result<()> {
        let api = &self.node(id)?.api;
        let rules = FaultSnapshot {
            peers: blocked
                .iter()
                .map(|p| {
                    let cut = FaultRule {
                        blocked: true,
                        ..FaultRule::default()
                    };
                    (*p, cut)
                })
                .collect(),
            clock_offset_ms,
        };
        let req = self.http.put(format!("{api}/v1/admin/faults")).json(&rules);
        status::typed::<FaultSnapshot>(req)
            .await
            .with_context(|| format!("set faults on node {id}"))?;
        Ok(())
    }

    /// The status of every node that is up (a paused one would only time out).
    pub async fn statuses(&self) -> Vec<ClusterStatus> {
        let mut out = Vec::new();
        for n in self.nodes.iter().filter(|n| self.is_up(n.id)) {
            if let Ok(s) = status::fetch(&self.http, &n.api, status::READ_TIMEOUT).await {
                out.push(s);
            }
        }
        out
    }

    pub async fn leader(&self) -> Option<u64> {
        status::leader(&self.statuses().await)
    }

    /// Starts a cluster and waits until it is ready; returns it and its leader. Its ports were
    /// found free by binding port 0 and released for the nodes to bind, so another process
    /// can take one in between (test runs side by side do). A node that cannot bind its port
    /// exits at once; the cluster is then started again on fresh ports, three times at most.
    pub async fn start_ready(
        bin: PathBuf,
        dir: Option<PathBuf>,
        spec: ClusterSpec,
        timeout: Duration,
    ) -> anyhow::Result<(Self, u64)> {
        const ATTEMPTS: u32 = 3;
        for attempt in 1..=ATTEMPTS {
            let mut cluster = Self::start(bin.clone(), dir.clone(), spec)?;
            let deadline = Instant::now() + timeout;
            let mut port_taken = false;
            while Instant::now() < deadline {
                // Checked first: the demo store may have lost its port to a cluster that is
                // ready all the same.
                port_taken = cluster.port_taken();
                if port_taken {
                    break;
                }
                // Any other exit during start-up will not mend itself: say so now, not when
                // the timeout runs out.
                let exited = cluster.exited();
                if !exited.is_empty() {
                    let dir = cluster.keep_dir();
                    bail!(
                        "{} during start-up; the logs are kept in {}{}",
                        exited.join(", "),
                        dir.display(),
                        cluster.last_log_line(),
                    );
                }
                if let Some(leader) = status::ready_leader(&cluster.http, &cluster.api_urls()).await
                {
                    return Ok((cluster, leader));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if !port_taken || attempt == ATTEMPTS {
                let ready = cluster.wait_ready(Duration::ZERO).await;
                if ready.is_err() {
                    // The logs say why: they must outlive this cluster (its Drop would remove a
                    // temp dir), and `wait_ready`'s error names the directory.
                    cluster.keep_dir();
                }
                return ready.map(|l| (cluster, l));
            }
            eprintln!(
                "a node's port was taken by another process before it could bind it; starting \
                 the cluster again on fresh ports"
            );
            cluster.stop_all();
            for id in 1..=LOCAL_NODES as u64 {
                cluster.lose_data(id)?;
            }
        }
        unreachable!("the last attempt returns")
    }

    /// The processes (nodes, demo store) that have exited, each with its exit status.
    fn exited(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(c) = self.store_child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                out.push(format!("the demo store exited ({status})"));
            }
        }
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    out.push(format!("node {} exited ({status})", n.id));
                }
            }
        }
        out
    }

    /// `: "…"` with the last line any node's log has, else nothing.
    fn last_log_line(&self) -> String {
        let logs = self.nodes.iter().map(|n| n.log.clone());
        let store = std::iter::once(self.dir.join(DEMO_STORE_LOG));
        logs.chain(store)
            .filter_map(|log| {
                let text = std::fs::read_to_string(&log).ok()?;
                let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
                Some(format!(
                    "\n{}: {}",
                    log.file_name()?.to_string_lossy(),
                    line.trim()
                ))
            })
            .next()
            .unwrap_or_default()
    }

    /// Keeps the cluster's directory after it is dropped (a temp dir is otherwise removed
    /// with it); returns where it is.
    pub fn keep_dir(&mut self) -> PathBuf {
        if let Some(t) = self.tmp.take() {
            let _ = t.keep();
        }
        self.dir.clone()
    }

    /// Whether a node or the demo store exited because its port was in use (its log says so).
    fn port_taken(&mut self) -> bool {
        let store_log = self.dir.join(DEMO_STORE_LOG);
        let store = self.store_child.as_mut().map(|c| (c, store_log.as_path()));
        let nodes = self
            .nodes
            .iter_mut()
            .filter_map(|n| Some((n.child.as_mut()?, n.log.as_path())));
        store.into_iter().chain(nodes).any(|(child, log)| {
            matches!(child.try_wait(), Ok(Some(_)))
                && std::fs::read_to_string(log)
                    .is_ok_and(|log| log.contains("Address already in use"))
        })
    }

    /// Waits until every node answers, all agree on one leader and say they are ready.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<u64> {
        status::wait_ready(&self.http, &self.api_urls(), timeout)
            .await
            .with_context(|| format!("node logs are in {}", self.dir.display()))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}
