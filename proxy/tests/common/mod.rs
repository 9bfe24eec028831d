//! The fencing proxy's test harness: a real in-process 3-node cluster (lock-core's
//! `TestCluster`: real raft, real fjall, real HTTP), the bundled demo store, and one fencing
//! proxy per node in front of it — everything on `127.0.0.1:0` ports, so tests run in parallel.
//!
//! Proxies can be stopped and restarted (with an empty grant cache) independently of their
//! node, and a crashed node takes its proxy down with it, as a real process crash would.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fencegate_proxy::config::ProxyConfig;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub use lock_core::testkit::{eventually, phase, TestCluster};

/// How long a test waits for an event it can observe (an election, an expiry, a hand-off).
pub const EVENT: Duration = Duration::from_secs(20);

/// One accepted write as the demo store's `GET /log` lists it (in apply order).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct StoreWrite {
    pub seq: u64,
    pub key: String,
    pub fence_token: Option<u64>,
    pub value: String,
    /// For an order: the tenant the store created it for.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// An answer from a proxy (or the store), with the instant it arrived.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub at: Instant,
}

impl Reply {
    /// The `error` code of a JSON error body.
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
}

/// A lease as `acquire` returned it.
#[derive(Clone, Debug)]
pub struct Lease {
    pub resource: String,
    pub lease_id: String,
    pub token: u64,
}

struct RunningProxy {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// A cloneable client for the proxies and the store, usable from spawned tasks. Proxy
/// addresses are shared with the harness, so a restarted proxy is found on its new port.
#[derive(Clone)]
pub struct FenceClient {
    proxy_addrs: Arc<RwLock<BTreeMap<u64, String>>>,
    pub store_addr: String,
    http: reqwest::Client,
}

/// A request to send through a proxy: method, path, headers, body.
#[derive(Clone, Debug)]
pub struct Write {
    pub method: reqwest::Method,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Write {
    /// `PUT /kv/{key}` with `Fence-Token: token` and `value` as the body.
    pub fn put(key: &str, token: u64, value: &str) -> Write {
        Write::new(reqwest::Method::PUT, &format!("/kv/{key}"), value).header("fence-token", token)
    }

    pub fn new(method: reqwest::Method, path: &str, body: &str) -> Write {
        Write {
            method,
            path: path.to_string(),
            headers: Vec::new(),
            body: body.to_string(),
        }
    }

    pub fn header(mut self, name: &str, value: impl ToString) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

impl FenceClient {
    pub fn proxy_addr(&self, id: u64) -> Option<String> {
        self.proxy_addrs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    pub fn proxy_ids(&self) -> Vec<u64> {
        self.proxy_addrs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// Sends `w` to proxy `id`; a transport error (proxy down) is returned, not panicked on.
    pub async fn try_send(&self, id: u64, w: &Write) -> Result<Reply, String> {
        let addr = self
            .proxy_addr(id)
            .ok_or_else(|| format!("proxy {id} is not running"))?;
        let mut req = self
            .http
            .request(w.method.clone(), format!("http://{addr}{}", w.path))
            .body(w.body.clone());
        for (name, value) in &w.headers {
            req = req.header(name, value);
        }
        let resp = req.send().await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        Ok(Reply {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
            at: Instant::now(),
        })
    }

    pub async fn send(&self, id: u64, w: &Write) -> Reply {
        match self.try_send(id, w).await {
            Ok(r) => r,
            Err(e) => panic!("{} {} via proxy {id}: {e}", w.method, w.path),
        }
    }

    /// `PUT /kv/{key}` with a fencing token, through proxy `id`.
    pub async fn put(&self, id: u64, key: &str, token: u64, value: &str) -> Reply {
        self.send(id, &Write::put(key, token, value)).await
    }

    /// Like `put`, but a 503 `no_quorum` (nothing was forwarded; e.g. right after a restart,
    /// before the cluster has a leader again) is retried until another answer, for up to
    /// `EVENT`.
    pub async fn put_decided(&self, id: u64, key: &str, token: u64, value: &str) -> Reply {
        let deadline = Instant::now() + EVENT;
        loop {
            let r = self.put(id, key, token, value).await;
            if r.status != 503 || Instant::now() >= deadline {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The demo store's log of accepted writes, in apply order.
    pub async fn store_log(&self) -> Vec<StoreWrite> {
        self.http
            .get(format!("http://{}/log", self.store_addr))
            .send()
            .await
            .expect("GET /log")
            .json()
            .await
            .expect("store log is JSON")
    }

    /// The value the store holds for `key`, read directly from the store.
    pub async fn store_value(&self, key: &str) -> Option<String> {
        let resp = self
            .http
            .get(format!("http://{}/kv/{key}", self.store_addr))
            .send()
            .await
            .expect("GET store");
        match resp.status().as_u16() {
            200 => Some(resp.text().await.expect("body")),
            404 => None,
            s => panic!("store GET /kv/{key}: {s}"),
        }
    }
}

/// The cluster, the demo store and a proxy per node.
pub struct FenceHarness {
    pub cluster: TestCluster,
    pub client: FenceClient,
    proxies: BTreeMap<u64, RunningProxy>,
    store_stop: watch::Sender<bool>,
    store_task: JoinHandle<std::io::Result<()>>,
    config: ProxyConfig,
}

impl FenceHarness {
    /// A 3-node cluster, the demo store and the `fencegate dev` proxy config (route `/kv/{key}`
    /// → `kv:{key}`, upstream timeout 1 s, grant 2 s) on every node.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut ProxyConfig)) -> Self {
        Self::start_on(TestCluster::start(3).await, adjust).await
    }

    /// Like `start_with`, on a cluster that requires API keys (`auth = "on"`), with
    /// `admin_token` as the bootstrap admin credential the harness's own lock calls carry.
    pub async fn start_with_auth(admin_token: &str, adjust: impl FnOnce(&mut ProxyConfig)) -> Self {
        let cluster =
            TestCluster::start_with_auth(3, admin_token, lock_core::node::TenantPolicy::default())
                .await;
        Self::start_on(cluster, adjust).await
    }

    async fn start_on(cluster: TestCluster, adjust: impl FnOnce(&mut ProxyConfig)) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind store");
        let store_addr = listener.local_addr().expect("addr").to_string();
        let (store_stop, mut stop_rx) = watch::channel(false);
        let store_task = tokio::spawn(fencegate_proxy::demo_store::serve(listener, async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        }));
        let mut config = ProxyConfig::dev(String::new(), store_addr.clone());
        adjust(&mut config);
        let mut h = FenceHarness {
            cluster,
            client: FenceClient {
                proxy_addrs: Arc::default(),
                store_addr,
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .expect("client"),
            },
            proxies: BTreeMap::new(),
            store_stop,
            store_task,
            config,
        };
        for id in h.cluster.running() {
            h.start_proxy(id);
        }
        h
    }

    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    /// Starts node `id`'s proxy on a fresh port, with an empty grant cache.
    pub fn start_proxy(&mut self, id: u64) {
        assert!(!self.proxies.contains_key(&id), "proxy {id} already runs");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("addr").to_string();
        let (stop, stop_rx) = oneshot::channel();
        let task = fencegate_proxy::server::start(
            self.cluster.node(id).node.clone(),
            &self.config,
            listener,
            async move {
                let _ = stop_rx.await;
            },
        )
        .expect("start proxy");
        self.proxies.insert(id, RunningProxy { stop, task });
        self.client
            .proxy_addrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, addr);
    }

    /// Stops node `id`'s proxy and waits until its service has exited.
    pub async fn stop_proxy(&mut self, id: u64) {
        self.client
            .proxy_addrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if let Some(p) = self.proxies.remove(&id) {
            let _ = p.stop.send(());
            let mut task = p.task;
            if tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
            {
                task.abort();
                panic!("proxy {id} did not stop within 5 s of its shutdown signal");
            }
        }
    }

    /// A fresh proxy process for node `id`: stopped, then started with no cached grants.
    pub async fn restart_proxy(&mut self, id: u64) {
        self.stop_proxy(id).await;
        self.start_proxy(id);
    }

    /// Crashes node `id` and its proxy (they share a process in production).
    pub async fn crash(&mut self, id: u64) {
        self.stop_proxy(id).await;
        self.cluster.crash(id).await;
    }

    /// Restarts a crashed node on its data dir, and its proxy.
    pub async fn restart(&mut self, id: u64) {
        self.cluster.restart(id).await;
        self.start_proxy(id);
    }

    pub fn proxy_ids(&self) -> Vec<u64> {
        self.client.proxy_ids()
    }

    pub async fn leader(&self) -> u64 {
        self.cluster.wait_leader(EVENT).await
    }

    /// The first running node (any node accepts any lock request).
    fn api_node(&self) -> u64 {
        self.cluster.running()[0]
    }

    /// Acquires `resource`, asserting success.
    pub async fn acquire(
        &self,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
        wait_timeout_ms: u64,
    ) -> Lease {
        let (s, v) = self
            .cluster
            .post(
                self.api_node(),
                &format!("/v1/locks/{resource}/acquire"),
                json!({
                    "request_id": request_id,
                    "holder": request_id,
                    "ttl_ms": ttl_ms,
                    "wait_timeout_ms": wait_timeout_ms,
                }),
            )
            .await;
        assert_eq!(s, 200, "acquire {resource} as {request_id}: {v}");
        Lease {
            resource: resource.to_string(),
            lease_id: v["lease_id"].as_str().expect("lease_id").to_string(),
            token: v["fencing_token"].as_u64().expect("fencing_token"),
        }
    }

    /// A try-once acquire that must be refused: returns (status, body).
    pub async fn try_acquire(&self, resource: &str, request_id: &str) -> (u16, Value) {
        self.cluster
            .post(
                self.api_node(),
                &format!("/v1/locks/{resource}/acquire"),
                json!({ "request_id": request_id, "ttl_ms": 30_000 }),
            )
            .await
    }

    pub async fn release(&self, lease: &Lease) {
        self.release_on(self.api_node(), lease).await;
    }

    /// Releases `lease` through node `id`, asserting success.
    pub async fn release_on(&self, id: u64, lease: &Lease) {
        let (s, v) = self
            .cluster
            .post(
                id,
                &format!("/v1/locks/{}/release", lease.resource),
                json!({ "lease_id": lease.lease_id }),
            )
            .await;
        assert_eq!((s, &v["released"]), (200, &json!(true)), "release: {v}");
    }

    /// `GET /v1/locks/{resource}` (linearizable).
    pub async fn lock_view(&self, resource: &str) -> Value {
        let (s, v) = self
            .cluster
            .get(self.api_node(), &format!("/v1/locks/{resource}"))
            .await;
        assert_eq!(s, 200, "GET lock {resource}: {v}");
        v
    }

    /// Waits until `lease`'s lock is no longer held (it expired or was released).
    pub async fn wait_lease_gone(&self, resource: &str, token: u64) {
        eventually(
            EVENT,
            &format!("{resource} token {token} ends"),
            async || {
                let v = self.lock_view(resource).await;
                v["held"] == json!(false) || v["fencing_token"].as_u64() != Some(token)
            },
        )
        .await;
    }

    /// Asserts that a write with `token` for `key` is refused with 412 `code` by every running
    /// proxy (a 503 is retried: it is no verdict), and returns the replies.
    pub async fn assert_refused_everywhere(&self, key: &str, token: u64, code: &str) -> Vec<Reply> {
        let mut replies = Vec::new();
        for id in self.proxy_ids() {
            let r = self
                .client
                .put_decided(id, key, token, &format!("stale-{token}-via-{id}"))
                .await;
            assert_eq!(
                (r.status, r.code()),
                (412, code),
                "token {token} on /kv/{key} via proxy {id}: {}",
                r.body
            );
            assert_eq!(
                r.body["presented_token"].as_u64(),
                Some(token),
                "{}",
                r.body
            );
            replies.push(r);
        }
        replies
    }

    pub async fn shutdown(mut self) {
        for id in self.proxy_ids() {
            self.stop_proxy(id).await;
        }
        let _ = self.store_stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.store_task).await;
        self.cluster.shutdown().await;
    }
}

/// Writes in the store log that carry `token`.
pub fn writes_with(log: &[StoreWrite], token: u64) -> Vec<&StoreWrite> {
    log.iter()
        .filter(|w| w.fence_token == Some(token))
        .collect()
}

/// No stale write is forwarded, as seen from the store: per key, the tokens of applied writes never decrease —
/// no write with an older token landed after a newer one.
#[track_caller]
pub fn assert_tokens_non_decreasing_per_key(log: &[StoreWrite]) {
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    for w in log {
        let t = w.fence_token.unwrap_or(0);
        let h = highest.entry(&w.key).or_default();
        assert!(
            t >= *h,
            "stale write landed: seq {} on key {} with token {t} after token {h}\nlog: {log:#?}",
            w.seq,
            w.key
        );
        *h = t;
    }
}

/// Ports the OS has just handed out, for processes that take their ports as arguments. The
/// listeners are dropped so the processes can bind them. A port is never handed out twice in
/// one test binary: tests run in parallel, and the OS readily gives a just-released port to the
/// next `bind(0)`. A collision with another process in between is still possible but unlikely.
pub fn free_ports(n: usize) -> Vec<u16> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let mut held = Vec::new();
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        if handed_out.insert(port) {
            ports.push(port);
        }
        held.push(listener);
    }
    ports
}

/// Reads a request head byte by byte (nothing of the body): `None` if the connection ends
/// first.
pub async fn read_head(conn: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Reads a request head and its `Content-Length` body: the head, or `None` if the connection
/// ends first.
pub async fn read_request(conn: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
    read_request_with_body(conn).await.map(|(head, _)| head)
}

/// [`read_request`], with the body.
pub async fn read_request_with_body(
    conn: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let head = read_head(conn).await?;
    let len = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body).await.ok()?;
    Some((head, body))
}

/// A store that answers every request `200 ok` (reading its `Content-Length` body) and
/// records each request head it got: its address and the heads.
pub async fn recording_upstream() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Some(head) = read_request(&mut conn).await else {
                    return;
                };
                seen.lock().unwrap_or_else(|e| e.into_inner()).push(head);
                let _ = conn
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    (addr, heads)
}

/// Runs the `fencegate` binary with `args` and `admin` as `FENCEGATE_ADMIN_TOKEN`; its exit
/// code and stdout (stderr is shown on a failure).
pub fn fencegate_cli(args: &[&str], admin: &str) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args(args)
        .env("NO_COLOR", "1")
        .env("FENCEGATE_ADMIN_TOKEN", admin)
        .output()
        .expect("run fencegate");
    let code = out.status.code().unwrap_or(-1);
    if code != 0 {
        eprintln!(
            "fencegate {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (code, String::from_utf8_lossy(&out.stdout).into_owned())
}
