//! `fencegate dev` as a user runs it: one OS process with three nodes, their proxies and the
//! demo store, driven over real HTTP. Open (the default), proxy tenants come from `X-Tenant`;
//! with `--auth`, from the API key of each request.

mod common;

use std::time::Duration;

use common::{eventually, fencegate_cli as fencegate, free_ports, phase};
use lock_core::wire::{CreateKeyRequest, CreatedKey, KeyRole};
use reqwest::{Client, RequestBuilder};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const EVENT: Duration = Duration::from_secs(30);

/// A running `fencegate dev`; killed when dropped.
struct Dev {
    child: Child,
    dir: tempfile::TempDir,
    ports: Vec<String>,
    auth: bool,
    api: String,
    proxy: String,
    store: String,
    /// The admin credential it printed.
    admin: String,
    http: Client,
}

impl Dev {
    /// Starts `fencegate dev` on free ports. A port found free can be taken by another
    /// process before `dev` binds it; then `dev` exits naming the port, and this tries again
    /// on other ports.
    async fn start(auth: bool) -> Dev {
        for _ in 0..3 {
            if let Some(dev) = Dev::try_start(auth).await {
                return dev;
            }
        }
        panic!("fencegate dev found a port in use three times");
    }

    /// One start; `None` when `dev` exited because a port was in use.
    async fn try_start(auth: bool) -> Option<Dev> {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports: Vec<String> = free_ports(10).iter().map(u16::to_string).collect();
        Dev::launch(auth, dir, ports).await
    }

    /// Stops `dev` as Ctrl-C does and starts it again on the same data directory and ports.
    async fn restart(self) -> Dev {
        let (auth, dir, ports) = self.stop().await;
        Dev::launch(auth, dir, ports)
            .await
            .expect("dev started again on its ports")
    }

    /// Stops `dev` as Ctrl-C does; what it takes to launch it again.
    async fn stop(mut self) -> (bool, tempfile::TempDir, Vec<String>) {
        let pid = self.child.id().expect("dev is running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .expect("SIGINT");
        let status = tokio::time::timeout(EVENT, self.child.wait())
            .await
            .expect("dev stopped on SIGINT")
            .expect("wait");
        assert!(status.success(), "dev exited with {status}");
        (self.auth, self.dir, self.ports)
    }

    async fn launch(auth: bool, dir: tempfile::TempDir, ports: Vec<String>) -> Option<Dev> {
        let stderr_path = dir.path().join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencegate"));
        cmd.arg("dev")
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--api-ports", &ports[0..3].join(",")])
            .args(["--peer-ports", &ports[3..6].join(",")])
            .args(["--proxy-ports", &ports[6..9].join(",")])
            .args(["--demo-store-port", &ports[9]])
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        if auth {
            cmd.arg("--auth");
        }
        let mut child = cmd.spawn().expect("spawn fencegate dev");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        // The banner names the admin credential once every node and proxy is up.
        let admin = tokio::time::timeout(EVENT, async {
            while let Some(line) = lines.next_line().await.expect("read stdout") {
                let line = line.trim_start();
                if line.starts_with("admin key") || line.starts_with("admin token") {
                    return Some(line.rsplit(' ').next().expect("credential").to_string());
                }
            }
            None
        })
        .await
        .expect("fencegate dev printed its banner");
        let Some(admin) = admin else {
            let _ = child.wait().await;
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            if stderr.contains("in use") {
                eprintln!("fencegate dev found a port in use, trying others: {stderr}");
                return None;
            }
            panic!("fencegate dev ended without printing its admin credential; stderr:\n{stderr}");
        };
        // Keep reading, so the process never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let dev = Dev {
            child,
            auth,
            api: format!("http://127.0.0.1:{}", ports[0]),
            proxy: format!("http://127.0.0.1:{}", ports[6]),
            store: format!("http://127.0.0.1:{}", ports[9]),
            admin,
            http: Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("client"),
            dir,
            ports,
        };
        eventually(EVENT, "node 1 is ready", async || {
            matches!(dev.http.get(format!("{}/readyz", dev.api)).send().await, Ok(r) if r.status() == 200)
        })
        .await;
        Some(dev)
    }

    async fn send(&self, req: RequestBuilder) -> (u16, Value) {
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Acquires `resource` (with `key`, if any) and returns its fencing token.
    async fn acquire(&self, key: Option<&str>, resource: &str, request_id: &str) -> u64 {
        let mut req = self
            .http
            .post(format!("{}/v1/locks/{resource}/acquire", self.api))
            .json(&json!({ "request_id": request_id }));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let (status, body) = self.send(req).await;
        assert_eq!(status, 200, "acquire {resource}: {body}");
        body["fencing_token"].as_u64().expect("token")
    }

    /// `PUT /kv/{key}` through proxy 1 with a token, a key (if any) and extra headers.
    async fn put(
        &self,
        bearer: Option<&str>,
        key: &str,
        token: u64,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut req = self
            .http
            .put(format!("{}/kv/{key}", self.proxy))
            .header("fence-token", token)
            .body("v");
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        self.send(req).await
    }

    async fn store_log(&self) -> Value {
        self.send(self.http.get(format!("{}/log", self.store)))
            .await
            .1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_without_auth_is_open_and_takes_tenants_from_x_tenant() {
    let dev = Dev::start(false).await;

    phase("a lock taken without a key fences a keyless write through the proxy");
    let token = dev.acquire(None, "kv:demo", "r1").await;
    let (status, body) = dev.put(None, "demo", token, &[]).await;
    assert_eq!(status, 200, "{body}");

    phase("orders belong to the X-Tenant the client names; a retry is replayed");
    let order = |tenant: &str| {
        dev.http
            .post(format!("{}/orders", dev.proxy))
            .header("idempotency-key", "order-1")
            .header("x-tenant", tenant)
            .body(r#"{"item":"book"}"#)
    };
    let (status, first) = dev.send(order("t1")).await;
    assert_eq!((status, &first["tenant"]), (201, &json!("t1")), "{first}");
    let (_, again) = dev.send(order("t1")).await;
    assert_eq!(again["id"], first["id"]);
    let (_, other) = dev.send(order("t2")).await;
    assert_ne!(
        other["id"], first["id"],
        "another tenant's key is another record"
    );

    phase("the write landed in the shared copy of the key");
    let log = dev.store_log().await;
    assert_eq!(log[0]["key"], "demo", "{log}");

    phase("the process runs without transparent huge pages");
    let pid = dev.child.id().expect("dev is running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    // Kernels before 5.0 do not report the flag; there is nothing to check.
    if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
        assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_same_data_dir_keeps_locks_and_the_demo_stores_data() {
    let dev = Dev::start(false).await;

    phase("a lock, a fenced write and an order");
    let holder = json!({ "request_id": "keep-1" });
    let (status, lease) = dev
        .send(
            dev.http
                .post(format!("{}/v1/locks/kv:kept/acquire", dev.api))
                .json(&holder),
        )
        .await;
    assert_eq!(status, 200, "{lease}");
    let token = lease["fencing_token"].as_u64().expect("token");
    let (status, body) = dev.put(None, "kept", token, &[]).await;
    assert_eq!(status, 200, "{body}");
    let order = |dev: &Dev, key: &str| {
        dev.http
            .post(format!("{}/orders", dev.proxy))
            .header("idempotency-key", key.to_string())
            .body(r#"{"item":"lamp"}"#)
    };
    let (status, first) = dev.send(order(&dev, "before")).await;
    assert_eq!(status, 201, "{first}");
    let log = dev.store_log().await;

    let dev = dev.restart().await;

    phase("the lock is still held, with its token, and a retry gets the same lease");
    let (status, again) = dev
        .send(
            dev.http
                .post(format!("{}/v1/locks/kv:kept/acquire", dev.api))
                .json(&holder),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["lease_id"], lease["lease_id"]);

    phase("the store holds what it held: the key, its log and the order");
    let value = dev
        .http
        .get(format!("{}/kv/kept", dev.store))
        .send()
        .await
        .expect("get");
    assert_eq!(value.text().await.expect("body"), "v");
    assert_eq!(dev.store_log().await, log);
    let found = dev
        .send(
            dev.http
                .get(format!("{}/orders/by-key/before", dev.store))
                .header("x-tenant", "demo"),
        )
        .await;
    assert_eq!(found, (200, first.clone()));

    phase("the order's retry is replayed, and a new order gets a new id");
    let (status, replayed) = dev.send(order(&dev, "before")).await;
    assert_eq!((status, &replayed["id"]), (201, &first["id"]), "{replayed}");
    let (status, next) = dev.send(order(&dev, "after")).await;
    assert_eq!(status, 201, "{next}");
    assert_ne!(next["id"], first["id"], "{next}");

    phase("a stale token is still refused");
    let (status, body) = dev.put(None, "kept", token - 1, &[]).await;
    assert!(status == 412, "{status} {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_with_auth_takes_tenants_from_the_key() {
    let dev = Dev::start(true).await;

    phase("the printed admin key creates two tenants' client keys");
    let mut keys = Vec::new();
    for tenant in ["acme", "bolt"] {
        let create = dev
            .http
            .post(format!("{}/v1/admin/keys", dev.api))
            .bearer_auth(&dev.admin)
            .json(&CreateKeyRequest {
                tenant: tenant.into(),
                role: KeyRole::Client,
                label: None,
            });
        let (status, body) = dev.send(create).await;
        assert_eq!(status, 200, "{body}");
        let created: CreatedKey = serde_json::from_value(body).expect("created key");
        eventually(EVENT, "node 1 knows the key", async || {
            let req = dev
                .http
                .get(format!("{}/v1/cluster", dev.api))
                .bearer_auth(&created.key);
            dev.send(req).await.0 == 200
        })
        .await;
        keys.push(created.key);
    }
    let (acme, bolt) = (keys[0].as_str(), keys[1].as_str());

    phase("acme's token admits acme's write, not bolt's, and nothing without a key");
    let token = dev.acquire(Some(acme), "kv:demo", "r1").await;
    let (status, body) = dev.put(Some(acme), "demo", token, &[]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = dev.put(None, "demo", token, &[]).await;
    assert_eq!((status, &body["error"]), (401, &json!("unauthenticated")));
    let (status, body) = dev.put(Some(bolt), "demo", token, &[]).await;
    assert_eq!(
        (status, &body["error"]),
        (412, &json!("unknown_fencing_token"))
    );
    let (status, body) = dev
        .put(Some(acme), "demo", token, &[("x-tenant", "bolt")])
        .await;
    assert_eq!((status, &body["error"]), (403, &json!("forbidden")));

    phase("the store got acme's one write, in acme's copy of the key");
    let log = dev.store_log().await;
    assert_eq!(log.as_array().map(Vec::len), Some(1), "{log}");
    assert_eq!(log[0]["key"], "acme#demo", "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_cluster_that_lost_its_nodes_data_is_restored_from_a_backup() {
    let dev = Dev::start(false).await;

    phase("a lock and an order, then `fencegate backup save` with the printed admin token");
    let acquire = dev
        .http
        .post(format!("{}/v1/locks/kv:kept/acquire", dev.api))
        .json(&json!({ "request_id": "keep-1" }));
    let (status, lease) = dev.send(acquire).await;
    assert_eq!(status, 200, "{lease}");
    let order = |dev: &Dev| {
        dev.http
            .post(format!("{}/orders", dev.proxy))
            .header("idempotency-key", "before")
            .body(r#"{"item":"lamp"}"#)
    };
    let (status, first) = dev.send(order(&dev)).await;
    assert_eq!(status, 201, "{first}");
    let file = dev.dir.path().join("dev.backup");
    let file_arg = file.to_str().expect("path").to_string();
    let endpoints = dev.ports[0..3]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let (code, out) = fencegate(
        &["backup", "save", "--out", &file_arg, "-e", &endpoints],
        &dev.admin,
    );
    assert_eq!(code, 0, "{out}");

    phase("a lease granted after the backup; then dev stops and its nodes' data is lost");
    let later = dev.acquire(None, "kv:later", "later-1").await;
    let admin = dev.admin.clone();
    let (auth, dir, ports) = dev.stop().await;
    for id in 1..=3 {
        std::fs::remove_dir_all(dir.path().join(format!("node{id}"))).expect("lose data");
    }

    phase("`fencegate backup restore --dev`, then dev starts on the restored nodes");
    let data_dir = dir.path().to_str().expect("path").to_string();
    let (code, out) = fencegate(
        &[
            "backup",
            "restore",
            "--backup",
            &file_arg,
            "--dev",
            "--data-dir",
            &data_dir,
            "--api-ports",
            &ports[0..3].join(","),
            "--peer-ports",
            &ports[3..6].join(","),
        ],
        &admin,
    );
    assert_eq!(code, 0, "{out}");
    let dev = Dev::launch(auth, dir, ports)
        .await
        .expect("dev started on the restored data");

    phase("the backup's lease ended: its token is refused at the proxy; its order replays");
    let token = lease["fencing_token"].as_u64().expect("token");
    let (status, body) = dev.put(None, "kept", token, &[]).await;
    assert_eq!(status, 412, "a lease of the backup still writes: {body}");
    let (status, replayed) = dev.send(order(&dev)).await;
    assert_eq!((status, &replayed["id"]), (201, &first["id"]), "{replayed}");

    phase("new leases get tokens above the lost cluster's, and write");
    let fresh = dev.acquire(None, "kv:later", "later-2").await;
    assert!(
        fresh > later,
        "token {fresh} after the lost cluster's {later}"
    );
    let kept = dev.acquire(None, "kv:kept", "keep-2").await;
    let (status, body) = dev.put(None, "kept", kept, &[]).await;
    assert_eq!(status, 200, "{body}");
}
