//! An in-process cluster of real nodes on OS-chosen ports, with helpers to crash, restart,
//! partition and query them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use tempfile::TempDir;
use tokio::net::TcpListener;

use super::{eventually, ApiClient};
use crate::net::PeerSecret;
use crate::node::{AuthMode, MemberAddrs, NodeConfig, Policy, TenantPolicy};
use crate::server::{self, NodeHandle};
use crate::wire::{AcquireRequest, ClusterStatus};

/// A change a test makes to every node's config, at the first start and every restart.
type Adjust = std::sync::Arc<dyn Fn(&mut NodeConfig) + Send + Sync>;

/// The admin token of a cluster started without API keys.
pub const TEST_ADMIN_TOKEN: &str = "testkit-admin-token-0123456789";

/// A real cluster in this process: real raft over real TCP sockets on 127.0.0.1 ports chosen
/// by the OS, real fjall in temp dirs, real HTTP. Nodes are numbered from 1; a crashed node
/// keeps its id, address and data dir so it can be restarted.
pub struct TestCluster {
    pub nodes: BTreeMap<u64, Option<NodeHandle>>,
    pub addrs: BTreeMap<u64, String>,
    /// Each node's peer listener.
    pub peer_addrs: BTreeMap<u64, String>,
    /// The cluster's peer secret.
    pub secret: PeerSecret,
    pub policy: Policy,
    /// Every node's admin token, which this harness's own calls carry; with API keys on (see
    /// [`start_with_auth`](Self::start_with_auth)) also the bootstrap admin key.
    pub admin_token: Option<String>,
    /// Whether the nodes require API keys.
    keys_on: bool,
    /// Per-tenant bounds with keys on.
    pub tenants: TenantPolicy,
    /// What a test changes in every node's config (see [`start_adjusted`](Self::start_adjusted)).
    adjust: Option<Adjust>,
    dir: TempDir,
    http: reqwest::Client,
}

impl TestCluster {
    pub async fn start(n: u64) -> Self {
        Self::start_with(n, Policy::default()).await
    }

    pub async fn start_with(n: u64, policy: Policy) -> Self {
        Self::start_configured(n, policy, None, TenantPolicy::default(), None).await
    }

    /// A cluster whose peer ports accept bodies of at most `bytes`.
    pub async fn start_with_peer_body_limit(n: u64, bytes: usize) -> Self {
        Self::start_adjusted(n, move |c| c.peer_limits.max_body_bytes = bytes).await
    }

    /// A cluster whose nodes' configs `adjust` changes (the default policy otherwise), at the
    /// first start and at every restart.
    pub async fn start_adjusted(
        n: u64,
        adjust: impl Fn(&mut NodeConfig) + Send + Sync + 'static,
    ) -> Self {
        let adjust: Adjust = std::sync::Arc::new(adjust);
        Self::start_configured(
            n,
            Policy::default(),
            None,
            TenantPolicy::default(),
            Some(adjust),
        )
        .await
    }

    /// A cluster that requires API keys, with `admin_token` as every node's bootstrap admin
    /// credential and `tenants` as the per-tenant bounds. The harness's own calls (`get`,
    /// `post`, the leader checks) carry the admin token.
    pub async fn start_with_auth(n: u64, admin_token: &str, tenants: TenantPolicy) -> Self {
        let token = Some(admin_token.to_string());
        Self::start_configured(n, Policy::default(), token, tenants, None).await
    }

    async fn start_configured(
        n: u64,
        policy: Policy,
        admin_token: Option<String>,
        tenants: TenantPolicy,
        adjust: Option<Adjust>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut listeners = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        let mut peer_addrs = BTreeMap::new();
        for id in 1..=n {
            let (l, p) = bind_pair().await;
            addrs.insert(id, l.local_addr().expect("addr").to_string());
            peer_addrs.insert(id, p.local_addr().expect("addr").to_string());
            listeners.insert(id, (l, p));
        }
        let mut cluster = TestCluster {
            nodes: BTreeMap::new(),
            addrs,
            peer_addrs,
            secret: PeerSecret::new(&PeerSecret::generate()).expect("secret"),
            policy,
            keys_on: admin_token.is_some(),
            // Operator actions and membership changes need an admin token: every cluster has
            // one, and the harness's calls carry it.
            admin_token: Some(admin_token.unwrap_or_else(|| TEST_ADMIN_TOKEN.to_string())),
            tenants,
            adjust,
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .pool_idle_timeout(Duration::from_secs(5))
                .build()
                .expect("client"),
        };
        for (id, (l, p)) in listeners {
            let h = server::start(cluster.config(id), l, p, std::future::pending())
                .await
                .expect("start node");
            cluster.nodes.insert(id, Some(h));
        }
        cluster.wait_leader(Duration::from_secs(10)).await;
        // The members of a brand-new cluster start empty, so each holds back its vote until
        // it heard the leader's first commit: only then does losing a member leave a quorum
        // that can elect. Tests that kill the leader at once need that moment behind them.
        eventually(
            Duration::from_secs(10),
            "every member of the new cluster votes",
            async || {
                cluster
                    .running()
                    .iter()
                    .all(|id| !cluster.node(*id).node.vote_hold.is_held())
            },
        )
        .await;
        cluster
    }

    pub fn config(&self, id: u64) -> NodeConfig {
        let members = self
            .addrs
            .iter()
            .map(|(id, api)| {
                let addrs = MemberAddrs {
                    api: api.clone(),
                    peer: self.peer_addrs[id].clone(),
                };
                (*id, addrs)
            })
            .collect();
        let mut c = NodeConfig::new(
            id,
            self.dir.path().join(format!("node{id}")),
            members,
            self.secret.clone(),
        );
        c.policy = self.policy.clone();
        c.enable_fault_injection = true;
        c.admin_token = self.admin_token.clone();
        if self.keys_on {
            c.auth = AuthMode::On;
            c.tenants = self.tenants.clone();
        }
        if let Some(adjust) = &self.adjust {
            adjust(&mut c);
        }
        c
    }

    /// The directory holding every node's data dir (`node<id>/`).
    pub fn data_root(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn node(&self, id: u64) -> &NodeHandle {
        self.nodes[&id].as_ref().expect("node is running")
    }

    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, h)| h.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Waits until a majority of running nodes agree on one leader, and returns it.
    pub async fn wait_leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
            for id in self.running() {
                let n = &self.node(id).node;
                if let Some(l) = n.current_leader() {
                    if self.nodes.get(&l).is_some_and(|h| h.is_some()) {
                        *votes.entry(l).or_default() += 1;
                    }
                }
            }
            if let Some((l, _)) = votes.iter().find(|(l, c)| {
                **c * 2 > self.nodes.len() && self.node(**l).node.current_leader() == Some(**l)
            }) {
                return *l;
            }
            assert!(Instant::now() < deadline, "no leader within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn followers(&self, leader: u64) -> Vec<u64> {
        self.running()
            .into_iter()
            .filter(|id| *id != leader)
            .collect()
    }

    /// The request with the admin token.
    fn authorized(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.admin_token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    pub fn url(&self, id: u64, path: &str) -> String {
        format!("http://{}{}", self.addrs[&id], path)
    }

    pub async fn post(&self, id: u64, path: &str, body: impl Serialize) -> (u16, Value) {
        let resp = self
            .authorized(self.http.post(self.url(id, path)))
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn post_raw(&self, id: u64, path: &str, body: &str) -> (u16, Value) {
        let resp = self
            .authorized(self.http.post(self.url(id, path)))
            .body(body.to_string())
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A GET; a body that is not JSON (e.g. `/metrics`) comes back as a JSON string.
    pub async fn get(&self, id: u64, path: &str) -> (u16, Value) {
        let resp = self
            .authorized(self.http.get(self.url(id, path)))
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Takes a backup on node `id` (`POST /v1/admin/backup`) into the file `to`; returns the
    /// raft term and log index it covers, as its answer's headers name them.
    pub async fn backup(&self, id: u64, to: &std::path::Path) -> (u64, u64) {
        let resp = self
            .authorized(self.http.post(self.url(id, "/v1/admin/backup")))
            .json(&serde_json::json!({"operator": "testkit"}))
            .timeout(Duration::from_secs(180))
            .send()
            .await
            .expect("backup request");
        assert_eq!(resp.status().as_u16(), 200, "backup on node {id}");
        let header = |name: &str| -> u64 {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("backup answer without {name}"))
        };
        let at = (
            header(crate::wire::BACKUP_TERM_HEADER),
            header(crate::wire::BACKUP_INDEX_HEADER),
        );
        let bytes = resp.bytes().await.expect("backup body");
        std::fs::write(to, &bytes).expect("write the backup");
        at
    }

    /// A try-once acquire of `resource` on node `id`.
    pub async fn acquire(
        &self,
        id: u64,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
    ) -> (u16, Value) {
        let body = AcquireRequest {
            request_id: request_id.to_string(),
            ttl_ms: Some(ttl_ms),
            ..AcquireRequest::default()
        };
        self.post(id, &format!("/v1/locks/{resource}/acquire"), body)
            .await
    }

    /// Stops a node abruptly (tasks aborted, raft stopped, nothing flushed beyond what was
    /// acknowledged).
    pub async fn crash(&mut self, id: u64) {
        if let Some(h) = self.nodes.get_mut(&id).and_then(Option::take) {
            h.crash().await;
        }
        // Give the storage a moment to be dropped by the stopped raft task.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// Stops a node the way SIGTERM does: it stops accepting, answers the calls in flight
    /// and stops raft. [`restart`](Self::restart) starts it again.
    pub async fn stop(&mut self, id: u64) {
        if let Some(h) = self.nodes.get_mut(&id).and_then(Option::take) {
            h.shutdown().await;
        }
    }

    /// Starts a stopped node again on its old address and data dir.
    pub async fn restart(&mut self, id: u64) {
        let listener = rebind(&self.addrs[&id]).await;
        let peer_listener = rebind(&self.peer_addrs[&id]).await;
        let handle = server::start(
            self.config(id),
            listener,
            peer_listener,
            std::future::pending(),
        )
        .await
        .unwrap_or_else(|e| panic!("restart node {id}: {e}"));
        self.nodes.insert(id, Some(handle));
    }

    /// Cuts `id` off from every other node, in both directions.
    pub fn isolate(&self, id: u64) {
        for other in self.running() {
            if other != id {
                self.node(other).node.faults().block([id]);
                self.node(id).node.faults().block([other]);
            }
        }
    }

    pub fn heal(&self) {
        for id in self.running() {
            self.node(id).node.faults().heal();
        }
    }

    pub async fn shutdown(mut self) {
        for id in self.running() {
            if let Some(h) = self.nodes.get_mut(&id).and_then(Option::take) {
                h.shutdown().await;
            }
        }
    }

    /// Starts node `id` on a fresh OS-chosen port as a node that joins later: its
    /// `initial_members` is the cluster's existing map, whose lowest id is not `id`, so it
    /// never bootstraps (see `maybe_initialize`) and waits for `POST /v1/cluster/members/add`.
    /// The node is registered so `get`/`post`/`node` work with its id; returns its address.
    pub async fn start_joining(&mut self, id: u64) -> String {
        assert!(!self.addrs.contains_key(&id), "node {id} already exists");
        let (l, p) = bind_pair().await;
        let addr = l.local_addr().expect("addr").to_string();
        let peer_addr = p.local_addr().expect("addr").to_string();
        let config = self.config(id);
        let h = server::start(config, l, p, std::future::pending())
            .await
            .expect("start joining node");
        self.addrs.insert(id, addr.clone());
        self.peer_addrs.insert(id, peer_addr);
        self.nodes.insert(id, Some(h));
        addr
    }

    /// Stops node `id` gracefully and forgets it (after it was removed from the membership),
    /// so leader checks count only the remaining members.
    pub async fn stop_and_forget(&mut self, id: u64) {
        if let Some(h) = self.nodes.remove(&id).flatten() {
            h.shutdown().await;
        }
        self.addrs.remove(&id);
        self.peer_addrs.remove(&id);
    }

    /// A client for tasks that run beside the test (see [`ApiClient`]).
    pub fn api_client(&self) -> ApiClient {
        ApiClient {
            addrs: self.addrs.clone(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                // Below the nodes' idle close (10 s): never reuse a connection being closed.
                .pool_idle_timeout(Duration::from_secs(5))
                .build()
                .expect("client"),
        }
    }

    /// `GET /v1/cluster` on `id` (this node's own view, not linearizable).
    pub async fn cluster_status(&self, id: u64) -> ClusterStatus {
        let (s, v) = self.get(id, "/v1/cluster").await;
        assert_eq!(s, 200, "GET /v1/cluster on node {id}: {v}");
        serde_json::from_value(v.clone())
            .unwrap_or_else(|e| panic!("GET /v1/cluster on node {id}: {e}: {v}"))
    }

    /// `last_applied` as node `id` reports it in `GET /v1/cluster`.
    pub async fn last_applied(&self, id: u64) -> u64 {
        self.cluster_status(id).await.last_applied
    }

    /// Waits until node `id` has applied everything the current leader had applied when the
    /// call started (both read from `GET /v1/cluster`), and returns that index.
    pub async fn wait_caught_up(&self, id: u64, timeout: Duration) -> u64 {
        let leader = self.wait_leader(timeout).await;
        let target = self.last_applied(leader).await;
        eventually(
            timeout,
            &format!("node {id} applies up to {target}"),
            async || self.last_applied(id).await >= target,
        )
        .await;
        target
    }
}

/// An API and a peer listener on OS-chosen ports.
async fn bind_pair() -> (TcpListener, TcpListener) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let p = TcpListener::bind("127.0.0.1:0").await.expect("bind peer");
    (l, p)
}

/// Binds `addr` again after its node stopped (the old socket may linger for a moment).
async fn rebind(addr: &str) -> TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("rebind {addr}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("rebind {addr}: {e}"),
        }
    }
}
