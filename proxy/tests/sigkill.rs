//! Durability against a real process kill: three `fencegate node` OS processes, SIGKILL the
//! leader, and check the lease survives (tokens never go back, a retried acquire gets its lease, failover never shortens a lease) and the killed node rejoins
//! from its data dir and catches up. And when every data directory is lost: the cluster made
//! again from a backup with the `fencegate backup` commands.
//!
//! Unlike the in-process clusters of lock-core's tests, nothing here can flush or clean up on
//! the way down: whatever was acknowledged must already be on disk.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_ports, phase};
use serde_json::{json, Value};

const EVENT: Duration = Duration::from_secs(30);

/// Every node's admin credential (backups need it).
const ADMIN_TOKEN: &str = "sigkill-test-admin-token";

/// The three processes and their data. Dropping it SIGKILLs every child that still runs (also
/// when the test panics) and, on a panic, prints the tail of each node's log.
struct Processes {
    dir: tempfile::TempDir,
    addrs: BTreeMap<u64, String>,
    /// Each node's fencing proxy, when started with one.
    proxies: BTreeMap<u64, String>,
    children: BTreeMap<u64, Child>,
    http: reqwest::Client,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for id in self.addrs.keys() {
                let log = std::fs::read_to_string(self.log_path(*id)).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                eprintln!("==== node {id} log (last 30 lines)");
                for line in &lines[lines.len().saturating_sub(30)..] {
                    eprintln!("{line}");
                }
            }
        }
    }
}

impl Processes {
    fn new(n: u64) -> Self {
        Self::with_orders_proxy(n, None)
    }

    /// Like `new`; with `store`, each node also runs a fencing proxy routing `POST /orders` to
    /// that demo store with `Idempotency-Key` required (as `fencegate dev` does).
    fn with_orders_proxy(n: u64, store: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // One call for every port, the proxies' included, so none of them repeats.
        let ports = free_ports(3 * n as usize);
        let (api_ports, rest) = ports.split_at(n as usize);
        let (peer_ports, proxy_ports) = rest.split_at(n as usize);
        let addrs: BTreeMap<u64, String> = (1..=n)
            .zip(api_ports)
            .map(|(id, port)| (id, format!("127.0.0.1:{port}")))
            .collect();
        let members: Vec<String> = (1..=n)
            .zip(api_ports.iter().zip(peer_ports))
            .map(|(id, (api, peer))| {
                format!("\"{id}\" = {{ api = \"127.0.0.1:{api}\", peer = \"127.0.0.1:{peer}\" }}")
            })
            .collect();
        let proxies: BTreeMap<u64, String> = match store {
            Some(_) => (1..=n)
                .zip(proxy_ports)
                .map(|(id, port)| (id, format!("127.0.0.1:{port}")))
                .collect(),
            None => BTreeMap::new(),
        };
        for (i, (id, addr)) in addrs.iter().enumerate() {
            let data_dir = dir.path().join(format!("node{id}"));
            let peer = peer_ports[i];
            let mut config = format!(
                "listen = \"{addr}\"\npeer_listen = \"127.0.0.1:{peer}\"\n\n[node]\nid = {id}\n\
                 data_dir = {data_dir:?}\npeer_secret = \"sigkill-test-peer-secret\"\nauth = \"off\"\n\
                 admin_token = \"{ADMIN_TOKEN}\"\n\
                 initial_members = {{ {} }}\n",
                members.join(", ")
            );
            if let (Some(store), Some(listen)) = (store, proxies.get(id)) {
                config.push_str(&format!(
                    "\n[proxy]\nlisten = \"{listen}\"\n\n[[proxy.routes]]\npath = \"/orders\"\n\
                     resource = \"orders\"\nupstream = \"{store}\"\nprotected_methods = []\n\
                     idempotency = \"required\"\n\n[proxy.routes.idempotency_options]\n\
                     reconcile = \"/orders/by-key/{{key}}\"\n"
                ));
            }
            std::fs::write(dir.path().join(format!("node{id}.toml")), config).expect("config");
        }
        Processes {
            dir,
            addrs,
            proxies,
            children: BTreeMap::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("client"),
        }
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node{id}.log"))
    }

    /// Starts (or restarts) node `id` with its config file and data dir.
    fn spawn(&mut self, id: u64) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .arg("node")
            .arg("--config")
            .arg(self.dir.path().join(format!("node{id}.toml")))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("spawn fencegate");
        self.children.insert(id, child);
    }

    /// SIGKILL: the process gets no chance to flush or shut down.
    fn kill(&mut self, id: u64) {
        let mut child = self.children.remove(&id).expect("node is running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    fn assert_alive(&mut self, id: u64) {
        if let Some(child) = self.children.get_mut(&id) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("node {id} exited: {status}");
            }
        }
    }

    fn url(&self, id: u64, path: &str) -> String {
        format!("http://{}{}", self.addrs[&id], path)
    }

    /// GET, with transport errors (a dead or starting process) as `None`.
    async fn get(&self, id: u64, path: &str) -> Option<(u16, Value)> {
        let resp = self.http.get(self.url(id, path)).send().await.ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.json().await.unwrap_or(Value::Null)))
    }

    async fn post(&self, id: u64, path: &str, body: &Value) -> Option<(u16, Value)> {
        let resp = self
            .http
            .post(self.url(id, path))
            .json(body)
            .send()
            .await
            .ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.json().await.unwrap_or(Value::Null)))
    }

    async fn wait_ready(&mut self, id: u64) {
        let deadline = Instant::now() + EVENT;
        loop {
            self.assert_alive(id);
            if let Some((200, _)) = self.get(id, "/readyz").await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} not ready within {EVENT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn cluster(&self, id: u64) -> Option<Value> {
        match self.get(id, "/v1/cluster").await {
            Some((200, v)) => Some(v),
            _ => None,
        }
    }

    /// The leader as `among` agree on it: every one of them names the same node, and that node
    /// names itself.
    async fn wait_leader(&self, among: &[u64]) -> u64 {
        let deadline = Instant::now() + EVENT;
        loop {
            let mut views = Vec::new();
            for id in among {
                views.push(
                    self.cluster(*id)
                        .await
                        .and_then(|v| v["leader_id"].as_u64()),
                );
            }
            if let Some(Some(l)) = views.first().copied() {
                if views.iter().all(|v| *v == Some(l)) {
                    let own = self.cluster(l).await.and_then(|v| v["leader_id"].as_u64());
                    if own == Some(l) {
                        return l;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader among {among:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Acquire with one request id, retried on `nodes` in turn through transport errors and
    /// 503 until a definitive answer.
    async fn acquire(&self, nodes: &[u64], resource: &str, request_id: &str) -> (u16, Value) {
        let body = json!({ "request_id": request_id, "ttl_ms": 60_000 });
        let path = format!("/v1/locks/{resource}/acquire");
        let deadline = Instant::now() + EVENT;
        for id in nodes.iter().cycle() {
            match self.post(*id, &path, &body).await {
                Some((503, _)) | None => {}
                Some(answer) => return answer,
            }
            assert!(Instant::now() < deadline, "acquire {request_id}: no answer");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        unreachable!("cycle never ends")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_leader_lease_survives_and_node_rejoins() {
    let mut p = Processes::new(3);
    let all: Vec<u64> = p.addrs.keys().copied().collect();

    phase("start three fencegate node processes and wait until each is ready");
    for id in &all {
        p.spawn(*id);
    }
    for id in &all {
        p.wait_ready(*id).await;
    }

    phase("acquire a lock (through node 1, forwarded to the leader if need be)");
    let (s, v) = p.acquire(&[1], "sigkill:job", "req-sigkill").await;
    assert_eq!(s, 200, "{v}");
    let lease_id = v["lease_id"].as_str().expect("lease_id").to_string();
    let token = v["fencing_token"].as_u64().expect("token");
    let expires = v["expires_at_ms"].as_u64().expect("expiry");

    phase("SIGKILL the leader process");
    let leader = p.wait_leader(&all).await;
    p.kill(leader);
    let survivors: Vec<u64> = all.iter().copied().filter(|id| *id != leader).collect();

    phase("the survivors elect a new leader; the lease survived with its token");
    let new = p.wait_leader(&survivors).await;
    assert_ne!(new, leader);
    eprintln!("killed leader {leader}; new leader {new}");
    let (s, v) = p.acquire(&survivors, "sigkill:job", "req-sigkill").await;
    assert_eq!(s, 200, "a retry returns the original lease: {v}");
    assert_eq!(v["lease_id"].as_str(), Some(lease_id.as_str()));
    assert_eq!(v["fencing_token"].as_u64(), Some(token));
    assert!(v["expires_at_ms"].as_u64().unwrap_or(0) >= expires, "{v}");
    let (s, v) = p.acquire(&survivors, "sigkill:job", "req-rival").await;
    assert_eq!(s, 409, "still held: {v}");
    let (s, g) = p
        .get(survivors[0], "/v1/locks/sigkill:job")
        .await
        .expect("GET on a survivor");
    assert_eq!((s, &g["held"]), (200, &json!(true)), "{g}");
    assert_eq!(g["fencing_token"].as_u64(), Some(token));

    phase("restart the killed process on its data dir; it catches up and serves the lock");
    p.spawn(leader);
    p.wait_ready(leader).await;
    let target = p
        .cluster(new)
        .await
        .and_then(|v| v["last_applied"].as_u64())
        .expect("leader's last_applied");
    let deadline = Instant::now() + EVENT;
    loop {
        p.assert_alive(leader);
        let applied = p
            .cluster(leader)
            .await
            .and_then(|v| v["last_applied"].as_u64())
            .unwrap_or(0);
        if applied >= target {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "restarted node stuck at {applied} < {target}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = p.cluster(leader).await.expect("status");
    assert!(
        status["locks"]["last_token"].as_u64().unwrap_or(0) >= token,
        "{status}"
    );
    let (s, g) = p
        .get(leader, "/v1/locks/sigkill:job")
        .await
        .expect("GET on the restarted node");
    assert_eq!((s, &g["held"]), (200, &json!(true)), "{g}");
    assert_eq!(g["fencing_token"].as_u64(), Some(token), "{g}");
}

/// `POST /orders` with `key` through node `id`'s proxy, retried through transport errors and
/// 503 (a starting process, no leader yet) until another answer: (status, replayed, body).
async fn post_order(p: &Processes, id: u64, key: &str, body: &str) -> (u16, bool, Value) {
    let deadline = Instant::now() + EVENT;
    loop {
        let sent = p
            .http
            .post(format!("http://{}/orders", p.proxies[&id]))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await;
        if let Ok(resp) = sent {
            let status = resp.status().as_u16();
            let replayed = resp.headers().get("idempotent-replayed").is_some();
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            if status != 503 && v["error"] != "idempotency_key_in_use" {
                return (status, replayed, v);
            }
        }
        assert!(Instant::now() < deadline, "POST /orders {key}: no answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A demo store, and three ready node processes whose proxies route `POST /orders` to it:
/// the processes, the store's address and the node ids.
async fn running_with_orders() -> (Processes, String, Vec<u64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind store");
    let store = listener.local_addr().expect("addr").to_string();
    tokio::spawn(fencegate_proxy::demo_store::serve(
        listener,
        std::future::pending(),
    ));
    let mut p = Processes::with_orders_proxy(3, Some(&store));
    let all: Vec<u64> = p.addrs.keys().copied().collect();
    for id in &all {
        p.spawn(*id);
    }
    for id in &all {
        p.wait_ready(*id).await;
    }
    (p, store, all)
}

/// Idempotency records are durable against a real kill of every process: SIGKILL all three
/// nodes right after their proxies answered, restart them, and every key still replays its
/// original answer — the store never sees a second order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_every_node_keeps_every_idempotency_record() {
    let (mut p, store, all) = running_with_orders().await;

    phase("12 orders with 12 keys, through the three proxies");
    let mut firsts = Vec::new();
    for i in 0..12u64 {
        let id = all[i as usize % 3];
        let (s, replayed, v) =
            post_order(&p, id, &format!("kill-{i}"), &format!("{{\"n\":{i}}}")).await;
        assert_eq!((s, replayed), (201, false), "{v}");
        firsts.push(v);
    }

    phase("SIGKILL every node, then restart them on their data dirs");
    for id in &all {
        p.kill(*id);
    }
    for id in &all {
        p.spawn(*id);
    }
    for id in &all {
        p.wait_ready(*id).await;
    }

    phase("every key replays its original answer through another proxy; one order per key");
    for i in 0..12u64 {
        let id = all[(i as usize + 1) % 3];
        let (s, replayed, v) =
            post_order(&p, id, &format!("kill-{i}"), &format!("{{\"n\":{i}}}")).await;
        assert_eq!((s, replayed), (201, true), "kill-{i}: {v}");
        assert_eq!(v, firsts[i as usize]);
    }
    let log: Vec<Value> = p
        .http
        .get(format!("http://{store}/log"))
        .send()
        .await
        .expect("store log")
        .json()
        .await
        .expect("log JSON");
    assert_eq!(log.len(), 12, "one order per key: {log:#?}");
}

/// Runs the `fencegate` binary with the nodes' admin token.
fn fencegate(args: &[&str]) -> (i32, String) {
    common::fencegate_cli(args, ADMIN_TOKEN)
}

/// Disaster recovery on real processes with the CLI: a backup saved while the cluster runs,
/// every data directory lost, each member restored from the backup. The backup's lease has
/// ended (its holder must acquire again), its request id and idempotency records answer as
/// before, the lease granted after the backup is unknown and a new grant gets a token above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_lost_every_data_directory_is_restored_from_a_backup() {
    let (mut p, _store, all) = running_with_orders().await;
    let endpoints = p.addrs.values().cloned().collect::<Vec<_>>().join(",");

    phase("a lease and five orders, then `fencegate backup save`");
    let (s, lease) = p.acquire(&all, "dr:job", "req-dr").await;
    assert_eq!(s, 200, "{lease}");
    let mut firsts = Vec::new();
    for i in 0..5u64 {
        let (s, replayed, v) = post_order(&p, all[i as usize % 3], &format!("dr-{i}"), "{}").await;
        assert_eq!((s, replayed), (201, false), "{v}");
        firsts.push(v);
    }
    let file = p.dir.path().join("cluster.backup");
    let file_arg = file.to_str().expect("path");
    let (code, out) = fencegate(&[
        "backup", "save", "--out", file_arg, "-e", &endpoints, "-o", "json",
    ]);
    assert_eq!(code, 0, "{out}");
    let saved: Value = serde_json::from_str(&out).expect("save prints JSON");
    assert_eq!(saved["active_locks"], 1, "{saved}");
    assert_eq!(saved["idempotency_records"], 5, "{saved}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file)
            .expect("backup")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o077,
            0,
            "the backup is readable by others: {mode:o}"
        );
    }

    phase("after the backup, another lease; then every process and data directory is lost");
    let (s, later) = p.acquire(&all, "dr:later", "req-later").await;
    assert_eq!(s, 200, "{later}");
    for id in &all {
        p.kill(*id);
        std::fs::remove_dir_all(p.dir.path().join(format!("node{id}"))).expect("lose data");
    }

    phase("`fencegate backup prepare` once, `backup restore` on every member, then start them");
    let (code, out) = fencegate(&["backup", "inspect", file_arg, "-o", "json"]);
    assert_eq!(code, 0, "{out}");
    let config_of = |id: u64| {
        let config = p.dir.path().join(format!("node{id}.toml"));
        config.to_str().expect("path").to_string()
    };
    let prepared = p.dir.path().join("restore.prepared");
    let prepared_arg = prepared.to_str().expect("path");
    let (code, out) = fencegate(&[
        "backup",
        "prepare",
        "--backup",
        file_arg,
        "--config",
        &config_of(1),
        "--out",
        prepared_arg,
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}");
    let ready: Value = serde_json::from_str(&out).expect("prepare prints JSON");
    assert_eq!(ready["backup"]["active_locks"], 1, "{ready}");
    assert_eq!(ready["state"]["active_locks"], 0, "{ready}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&prepared)
            .expect("prepared")
            .permissions();
        assert_eq!(
            mode.mode() & 0o777,
            0o600,
            "the prepared backup is readable by others"
        );
    }
    let (code, _) = fencegate(&[
        "backup",
        "restore",
        "--prepared",
        file_arg,
        "--config",
        &config_of(1),
    ]);
    // A refused restore is bad input (exit 2), and the backup's file is not called damaged.
    assert_eq!(code, 2, "a backup that was not prepared was restored");
    let restore = |id: u64| {
        fencegate(&[
            "backup",
            "restore",
            "--prepared",
            prepared_arg,
            "--config",
            &config_of(id),
            "-o",
            "json",
        ])
    };
    for id in &all {
        let (code, out) = restore(*id);
        assert_eq!(code, 0, "{out}");
        let restored: Value = serde_json::from_str(&out).expect("restore prints JSON");
        assert_eq!(restored["node_id"], *id, "{restored}");
    }
    let (code, _) = restore(1);
    assert_eq!(
        code, 2,
        "a second restore over the restored directory was accepted"
    );
    for id in &all {
        p.spawn(*id);
    }
    for id in &all {
        p.wait_ready(*id).await;
    }

    phase("the backup's lease ended, its request id and its orders are there");
    let (s, g) = p.get(all[0], "/v1/locks/dr:job").await.expect("GET");
    assert_eq!((s, &g["held"]), (200, &json!(false)), "{g}");
    assert_eq!(g["fencing_token"], lease["fencing_token"], "{g}");
    let (s, renewed) = p
        .post(
            all[0],
            "/v1/locks/dr:job/renew",
            &json!({ "lease_id": lease["lease_id"] }),
        )
        .await
        .expect("renew");
    assert_eq!(
        (s, &renewed["error"]),
        (409, &json!("lease_lost")),
        "{renewed}"
    );
    let (s, again) = p.acquire(&all, "dr:job", "req-dr").await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(
        again["lease_id"], lease["lease_id"],
        "a retry gets its original answer"
    );
    for i in 0..5u64 {
        let (s, replayed, v) =
            post_order(&p, all[(i as usize + 1) % 3], &format!("dr-{i}"), "{}").await;
        assert_eq!((s, replayed), (201, true), "dr-{i}: {v}");
        assert_eq!(v, firsts[i as usize]);
    }

    phase("the lease granted after the backup is unknown; a new one gets a higher token");
    let (s, g) = p.get(all[0], "/v1/locks/dr:later").await.expect("GET");
    assert_eq!((s, &g["held"]), (200, &json!(false)), "{g}");
    let (s, fresh) = p.acquire(&all, "dr:later", "req-later-again").await;
    assert_eq!(s, 200, "{fresh}");
    assert!(
        fresh["fencing_token"].as_u64() > later["fencing_token"].as_u64(),
        "a token of the lost cluster came again: {fresh} after {later}"
    );
}
