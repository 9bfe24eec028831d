//! A real in-process cluster for integration tests: real raft over real TCP sockets on
//! 127.0.0.1 ports chosen by the OS, real fjall in temp dirs, real HTTP.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lock_core::net::PeerSecret;
use lock_core::node::{MemberAddrs, NodeConfig, Policy};
use lock_core::server::{self, NodeHandle};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::net::TcpListener;

pub struct TestCluster {
    pub nodes: BTreeMap<u64, Option<NodeHandle>>,
    pub addrs: BTreeMap<u64, String>,
    pub peer_addrs: BTreeMap<u64, String>,
    pub secret: PeerSecret,
    pub policy: Policy,
    dir: TempDir,
    http: reqwest::Client,
}

/// Logs a test phase, so a failing test's output reads as a story.
pub fn phase(msg: &str) {
    eprintln!("---- {msg}");
}

impl TestCluster {
    pub async fn start(n: u64) -> Self {
        Self::start_with(n, Policy::default()).await
    }

    pub async fn start_with(n: u64, policy: Policy) -> Self {
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
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
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
        c
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

    pub fn url(&self, id: u64, path: &str) -> String {
        format!("http://{}{}", self.addrs[&id], path)
    }

    pub async fn post(&self, id: u64, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(id, path))
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn post_raw(&self, id: u64, path: &str, body: &str) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(id, path))
            .body(body.to_string())
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, id: u64, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(self.url(id, path))
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

    pub async fn acquire(
        &self,
        id: u64,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
    ) -> (u16, Value) {
        self.post(
            id,
            &format!("/v1/locks/{resource}/acquire"),
            json!({ "request_id": request_id, "ttl_ms": ttl_ms }),
        )
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
}

impl TestCluster {
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

// ---- fault-test helpers (tests/faults.rs) ----------------------------------------------------

/// Polls `check` every 50 ms until it returns true; panics naming `what` after `timeout`.
/// Use instead of a sleep wherever the awaited event can be observed.
pub async fn eventually(timeout: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "not within {timeout:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A cloneable HTTP client on the cluster's addresses, for concurrent tasks that must outlive
/// `&mut TestCluster` calls such as `crash`. Transport errors (a crashed node) are returned,
/// not panicked on, so callers can retry elsewhere.
#[derive(Clone)]
pub struct ApiClient {
    pub addrs: BTreeMap<u64, String>,
    http: reqwest::Client,
}

impl ApiClient {
    pub async fn post(
        &self,
        id: u64,
        path: &str,
        body: Value,
    ) -> Result<(u16, Value), reqwest::Error> {
        let resp = self
            .http
            .post(format!("http://{}{}", self.addrs[&id], path))
            .json(&body)
            .send()
            .await?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().await.unwrap_or(Value::Null)))
    }
}

impl TestCluster {
    pub fn api_client(&self) -> ApiClient {
        ApiClient {
            addrs: self.addrs.clone(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("client"),
        }
    }

    /// `GET /v1/cluster` on `id` (this node's own view, not linearizable).
    pub async fn cluster_status(&self, id: u64) -> Value {
        let (s, v) = self.get(id, "/v1/cluster").await;
        assert_eq!(s, 200, "GET /v1/cluster on node {id}: {v}");
        v
    }

    /// `last_applied` as node `id` reports it in `GET /v1/cluster`.
    pub async fn last_applied(&self, id: u64) -> u64 {
        self.cluster_status(id).await["last_applied"]
            .as_u64()
            .unwrap_or(0)
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

// ---- client-test helpers (tests/client.rs) ---------------------------------------------------

/// A TCP relay standing in for the network between one client and one node. It can stall all
/// traffic (a partitioned client: requests hang, nothing is refused) and throw away the
/// answers on the next N connections (a lost response). Like a load balancer, it never passes
/// a client's hang-up on to the node: the node only learns a caller left if the caller says
/// so (e.g. with `cancel`).
pub struct TcpRelay {
    pub addr: String,
    stalled: tokio::sync::watch::Sender<bool>,
    drop_answers: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpRelay {
    pub async fn start(target: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("addr").to_string();
        let (stalled, _) = tokio::sync::watch::channel(false);
        let drop_answers = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let target = target.to_string();
            let stalled = stalled.clone();
            let drop_answers = drop_answers.clone();
            let connections = connections.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    let discard = drop_answers
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    tokio::spawn(relay_connection(
                        client,
                        target.clone(),
                        stalled.subscribe(),
                        discard,
                    ));
                }
            }
        });
        TcpRelay {
            addr,
            stalled,
            drop_answers,
            connections,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds every byte in both directions (on open and new connections) while `on`.
    pub fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }

    /// The next `n` connections reach the node, but the node's answers on them are dropped.
    pub fn drop_answers_on_next(&self, n: usize) {
        self.drop_answers
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay_connection(
    client: tokio::net::TcpStream,
    target: String,
    stalled: tokio::sync::watch::Receiver<bool>,
    discard_answers: bool,
) {
    let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        relay_pump(&mut client_read, &mut server_write, stalled.clone(), false).await;
        // Client hung up: keep the node's side open (see `TcpRelay`).
        std::future::pending::<()>().await;
    };
    let downstream = relay_pump(
        &mut server_read,
        &mut client_write,
        stalled.clone(),
        discard_answers,
    );
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

async fn relay_pump(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    mut stalled: tokio::sync::watch::Receiver<bool>,
    discard: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if discard {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
