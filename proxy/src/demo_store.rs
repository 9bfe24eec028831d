//! The bundled demo store: a tiny HTTP key-value store that cannot check tokens — the kind
//! of store the fencing proxy exists for.
//!
//! `PUT /kv/{key}` stores the body, `GET /kv/{key}` returns it, and `GET /log` lists every
//! accepted write in the order it was applied, with the `Fence-Token` header it carried (the
//! store records it, it does not check it), so tests can prove what landed and in which order.
//! A write may ask to be applied late with `X-Demo-Delay-Ms: N` (at most 60 s), which is how
//! tests model a slow upstream. A `/kv` request with `X-Tenant: T` reaches tenant T's own copy
//! of the key (logged as `T#key`); without it, the shared one.
//!
//! `/limited/{key}` answers 200 to GET, PUT and POST: the upstream of the rate-limited route.
//! The store records each such request with its own wall-clock time of arrival and the
//! `X-Tenant` it carried; `GET /limited-log` lists them (the last million), so a test can
//! judge what the proxies admitted over any window of time.
//!
//! Orders, for the proxy's `Idempotency-Key` handling: `POST /orders` creates an order with a
//! new id for the tenant named by `X-Tenant` (default `demo`) (201 and the order as JSON;
//! logged in `GET /log` with the `Idempotency-Key` and tenant it was sent), and
//! `GET /orders/by-key/{key}` finds the order the `X-Tenant` tenant created with that key (404
//! if none) — the lookup the proxy reconciles lost answers with. The store itself knows nothing
//! of deduplication: two posts with one key make two orders. A post may carry
//! `X-Demo-Hold: NAME`: the order is created, then the answer waits until
//! `POST /holds/NAME/release` (at most 60 s) — how tests lose an answer after the effect; or
//! `X-Demo-Answer-Delay-Ms: N`: the order is created, then the answer waits N ms (at most 60 s)
//! — how the chaos harness makes the proxy's upstream timeout lose answers; or
//! `X-Demo-Delay-Ms: N`: the store waits N ms (at most 60 s) before it creates the order, like a
//! store that applies a request some time after receiving it.
//!
//! Opened on a journal file ([`DemoStore::open`], as `fencegate dev` does under its data
//! directory), the store appends every accepted write to it before answering, and replays it at
//! start: keys, orders and the log survive a restart (or a SIGKILL) of the process. The
//! `/limited` log and held answers are not kept.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Write};
use std::path::Path as FilePath;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_core::node::HttpLimits;
use lock_core::wire::{hex, LimitedLogEntry, Order};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// One accepted write.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogEntry {
    pub seq: u64,
    pub key: String,
    pub fence_token: Option<u64>,
    pub value: String,
    /// The `Idempotency-Key` header the write carried (orders).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The tenant the order was created for (orders).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// The tenant of an order posted without `X-Tenant` (the dev proxy's default tenant too).
const DEFAULT_TENANT: &str = "demo";

fn tenant_of(headers: &HeaderMap) -> String {
    headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(DEFAULT_TENANT)
        .to_string()
}

#[derive(Default)]
struct Store {
    data: HashMap<String, Bytes>,
    log: Vec<LogEntry>,
    orders: Vec<Order>,
    released: HashSet<String>,
    /// Requests answered on `/limited/{key}`, the newest [`LIMITED_LOG_MAX`].
    limited: VecDeque<LimitedLogEntry>,
    limited_seq: u64,
    /// Where accepted writes are appended, if the store keeps them.
    journal: Option<File>,
}

/// One line of the journal: a write as `/log` shows it, with its bytes in hex when they are
/// not UTF-8 (the log's `value` is then a lossy rendering).
#[derive(Serialize, Deserialize)]
struct JournalLine {
    #[serde(flatten)]
    entry: LogEntry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
}

impl Store {
    /// Records an accepted write: appended to the journal first (if any), then applied. A
    /// write the journal refused is not applied.
    fn accept(&mut self, entry: LogEntry, body: &Bytes) -> io::Result<()> {
        if let Some(journal) = &mut self.journal {
            let hex = std::str::from_utf8(body)
                .is_err()
                .then(|| hex::encode(body));
            let line = JournalLine {
                entry: entry.clone(),
                hex,
            };
            let mut bytes = serde_json::to_vec(&line).map_err(io::Error::other)?;
            bytes.push(b'\n');
            // One write per line: a SIGKILL leaves whole lines and at most one torn last one.
            journal.write_all(&bytes)?;
        }
        self.apply(entry, body.clone());
        Ok(())
    }

    fn apply(&mut self, entry: LogEntry, body: Bytes) {
        // Orders are the writes logged with their tenant; keys are logged without one.
        match (entry.key.strip_prefix("order:"), &entry.tenant) {
            (Some(id), Some(tenant)) => self.orders.push(Order {
                id: id.to_string(),
                tenant: tenant.clone(),
                idempotency_key: entry.idempotency_key.clone(),
                body: entry.value.clone(),
            }),
            _ => {
                self.data.insert(entry.key.clone(), body);
            }
        }
        self.log.push(entry);
    }

    /// Replays `journal`'s lines; a torn last line (the process died writing it) is cut off,
    /// and a whole last line that lost only its newline gets it back.
    fn replay(&mut self, path: &FilePath, journal: &mut File) -> io::Result<()> {
        let bad = |n: usize, why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} line {n}: {why}", path.display()),
            )
        };
        let mut bytes = Vec::new();
        journal.read_to_end(&mut bytes)?;
        let mut kept = 0;
        for (i, line) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
            let last = kept + line.len() == bytes.len();
            let text = line.strip_suffix(b"\n").unwrap_or(line);
            let JournalLine { entry, hex } = match serde_json::from_slice(text) {
                Ok(parsed) => parsed,
                Err(_) if last => break,
                Err(e) => return Err(bad(i + 1, e.to_string())),
            };
            let body = match hex {
                Some(hex) => hex::decode(&hex).ok_or_else(|| bad(i + 1, "bad hex".into()))?,
                None => entry.value.clone().into_bytes(),
            };
            if entry.seq != self.log.len() as u64 + 1 {
                return Err(bad(i + 1, format!("write {} out of order", entry.seq)));
            }
            self.apply(entry, Bytes::from(body));
            kept += line.len();
        }
        journal.set_len(kept as u64)?;
        if bytes[..kept].last().is_some_and(|b| *b != b'\n') {
            journal.write_all(b"\n")?;
        }
        Ok(())
    }
}

/// How many `/limited` requests the store remembers (about 100 MB at most).
const LIMITED_LOG_MAX: usize = 1_000_000;

#[derive(Clone, Default)]
struct Shared {
    store: Arc<Mutex<Store>>,
    /// Wakes held order answers when a hold is released.
    holds: Arc<Notify>,
}

/// `PUT/POST /sink/{...}`: reads the body and answers 200, nothing else (the benchmark's
/// upstream, so every path through the proxy and nginx ends at the same cheap handler).
async fn sink(_body: Bytes) -> &'static str {
    "ok"
}

/// `GET/PUT/POST /limited/{key}`: answers 200 and records the arrival, the upstream of the
/// rate-limited route of `fencegate dev`. The body is read and dropped: left unread, a large
/// one would cost the caller its keep-alive connection.
async fn limited(
    State(shared): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
    _body: Bytes,
) -> String {
    // Read the clock under the lock, so the log's times are in its order.
    let mut s = lock(&shared);
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_micros() as f64 / 1000.0);
    s.limited_seq += 1;
    let entry = LimitedLogEntry {
        seq: s.limited_seq,
        key: key.clone(),
        tenant: headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        at_ms,
    };
    if s.limited.len() >= LIMITED_LOG_MAX {
        s.limited.pop_front();
    }
    s.limited.push_back(entry);
    format!("ok {key}\n")
}

async fn limited_log(State(shared): State<Shared>) -> Json<Vec<LimitedLogEntry>> {
    Json(lock(&shared).limited.iter().cloned().collect())
}

/// Serves an in-memory demo store on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    DemoStore::in_memory().serve(listener, shutdown).await
}

/// A demo store's state, in memory or kept in a journal file as well.
pub struct DemoStore {
    shared: Shared,
}

impl DemoStore {
    pub fn in_memory() -> Self {
        DemoStore {
            shared: Shared::default(),
        }
    }

    /// The store kept in the journal file `path` (created if missing), with the writes it
    /// already holds.
    pub fn open(path: &FilePath) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut journal = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let mut store = Store::default();
        store.replay(path, &mut journal)?;
        store.journal = Some(journal);
        let shared = Shared {
            store: Arc::new(Mutex::new(store)),
            ..Shared::default()
        };
        Ok(DemoStore { shared })
    }

    /// Writes the store holds (keys and orders, in the order they were accepted).
    pub fn writes(&self) -> usize {
        lock(&self.shared).log.len()
    }

    /// Serves the store on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        serve_shared(listener, self.shared, shutdown).await
    }
}

async fn serve_shared(
    listener: TcpListener,
    shared: Shared,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let app = Router::new()
        .route("/kv/{key}", get(get_key).put(put_key))
        .route("/log", get(log))
        .route("/orders", post(create_order))
        .route("/orders/by-key/{key}", get(order_by_key))
        .route("/holds/{name}/release", post(release_hold))
        .route("/limited/{key}", get(limited).put(limited).post(limited))
        .route("/limited-log", get(limited_log))
        // The proxy benchmark's upstream: reads the body, answers 200, keeps nothing.
        .route("/sink/{*path}", post(sink).put(sink))
        .with_state(shared);
    let limits = limits();
    let app = lock_core::api::listen::limit_bodies(app, &limits);
    lock_core::api::listen::serve(listener, app, &limits, None, None, shutdown).await
}

/// The demo store's listener limits: the public API's, with room for larger values, and idle
/// keep-alive connections kept a minute so the proxies' pooled upstream connections are rarely
/// closed under them.
pub fn limits() -> HttpLimits {
    HttpLimits {
        max_body_bytes: 1 << 20,
        header_timeout_ms: 60_000,
        ..HttpLimits::default()
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Store> {
    shared.store.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where `key` is kept: a request with `X-Tenant` (a proxy whose routes take the tenant from
/// API keys sets it to the key's tenant) reaches that tenant's own copy, so two tenants'
/// independent locks on the same name never guard the same data; without it, the shared one.
fn kv_slot(headers: &HeaderMap, key: &str) -> String {
    match headers.get("x-tenant").and_then(|v| v.to_str().ok()) {
        Some(tenant) => format!("{tenant}#{key}"),
        None => key.to_string(),
    }
}

async fn get_key(
    State(store): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    match lock(&store).data.get(&kv_slot(&headers, &key)) {
        Some(v) => v.clone().into_response(),
        None => (StatusCode::NOT_FOUND, "no such key\n").into_response(),
    }
}

async fn put_key(
    State(store): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if let Some(ms) = header("x-demo-delay-ms") {
        tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
    }
    let mut s = lock(&store);
    let seq = s.log.len() as u64 + 1;
    let entry = LogEntry {
        seq,
        key: kv_slot(&headers, &key),
        fence_token: header("fence-token"),
        value: String::from_utf8_lossy(&body).into_owned(),
        idempotency_key: None,
        tenant: None,
    };
    if let Err(e) = s.accept(entry, &body) {
        return journal_failed(&e);
    }
    (StatusCode::OK, Json(serde_json::json!({ "seq": seq }))).into_response()
}

/// The answer to a write the journal could not keep: nothing of it happened.
fn journal_failed(e: &io::Error) -> Response {
    tracing::error!(error = %e, "demo store: cannot append to its journal");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the write was not stored: cannot append to the journal: {e}\n"),
    )
        .into_response()
}

async fn log(State(store): State<Shared>) -> Json<Vec<LogEntry>> {
    Json(lock(&store).log.clone())
}

async fn create_order(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let make = {
        let (shared, tenant, key, body) = (
            shared.clone(),
            tenant_of(&headers),
            text("idempotency-key"),
            body.clone(),
        );
        let before = text("x-demo-delay-ms").and_then(|v| v.trim().parse::<u64>().ok());
        async move {
            if let Some(ms) = before {
                tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
            }
            add_order(&shared, tenant, key, &body)
        }
    };
    // Once received, the order is made even if the client goes away meanwhile (the connection's
    // end would otherwise cancel this handler).
    let order = match tokio::spawn(make).await {
        Ok(Ok(order)) => order,
        Ok(Err(e)) => return journal_failed(&e),
        Err(e) => return journal_failed(&io::Error::other(e)),
    };
    if let Some(name) = text("x-demo-hold") {
        // The effect has happened; the answer waits for the test to release it.
        let wait = async {
            loop {
                let notified = shared.holds.notified();
                if lock(&shared).released.contains(&name) {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(60), wait).await;
    }
    let delay = text("x-demo-answer-delay-ms").and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(ms) = delay {
        tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
    }
    (StatusCode::CREATED, Json(order)).into_response()
}

/// Creates and journals an order; the error is the journal's.
fn add_order(
    shared: &Shared,
    tenant: String,
    idempotency_key: Option<String>,
    body: &Bytes,
) -> io::Result<Order> {
    let mut s = lock(shared);
    let order = Order {
        id: format!("ord-{}", s.orders.len() + 1),
        tenant,
        idempotency_key,
        body: String::from_utf8_lossy(body).into_owned(),
    };
    let entry = LogEntry {
        seq: s.log.len() as u64 + 1,
        key: format!("order:{}", order.id),
        fence_token: None,
        value: order.body.clone(),
        idempotency_key: order.idempotency_key.clone(),
        tenant: Some(order.tenant.clone()),
    };
    s.accept(entry, body)?;
    Ok(order)
}

async fn order_by_key(
    State(shared): State<Shared>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    let tenant = tenant_of(&headers);
    let found = lock(&shared)
        .orders
        .iter()
        .find(|o| o.idempotency_key.as_deref() == Some(key.as_str()) && o.tenant == tenant)
        .cloned();
    match found {
        Some(order) => (StatusCode::OK, Json(order)).into_response(),
        None => (StatusCode::NOT_FOUND, "no order with this key\n").into_response(),
    }
}

async fn release_hold(State(shared): State<Shared>, Path(name): Path<String>) -> StatusCode {
    lock(&shared).released.insert(name);
    shared.holds.notify_waiters();
    StatusCode::NO_CONTENT
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves `store` on a free port; returns its base URL and the serving task (stopped by
    /// dropping the sender).
    async fn start(
        store: DemoStore,
    ) -> (
        String,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(store.serve(listener, async move {
            let _ = stopped.await;
        }));
        (base, stop, task)
    }

    async fn store_log(http: &reqwest::Client, base: &str) -> serde_json::Value {
        let got = http.get(format!("{base}/log")).send().await.expect("log");
        got.json().await.expect("json")
    }

    #[tokio::test]
    async fn a_journaled_store_keeps_keys_orders_and_its_log_across_a_restart() {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = dir.path().join("store/journal.jsonl");
        let http = reqwest::Client::new();
        let binary: &[u8] = &[0, 159, 146, 150, 255];

        let (base, stop, task) = start(DemoStore::open(&journal).expect("open")).await;
        for (key, body, token) in [
            ("a", &b"one"[..], "7"),
            ("b", binary, "8"),
            ("a", b"two", "9"),
        ] {
            let got = http
                .put(format!("{base}/kv/{key}"))
                .header("fence-token", token)
                .body(body.to_vec())
                .send()
                .await
                .expect("put");
            assert_eq!(got.status(), 200);
        }
        let order = http
            .post(format!("{base}/orders"))
            .header("idempotency-key", "k1")
            .header("x-tenant", "t1")
            .body("first order")
            .send()
            .await
            .expect("post");
        assert_eq!(order.status(), 201);
        let log_before = store_log(&http, &base).await;
        drop(stop);
        task.await.expect("task").expect("served");

        let reopened = DemoStore::open(&journal).expect("reopen");
        assert_eq!(reopened.writes(), 4);
        let (base, _stop, _task) = start(reopened).await;
        let get = |key: &str| http.get(format!("{base}/kv/{key}")).send();
        let a = get("a").await.expect("get a").bytes().await.expect("body");
        assert_eq!(&a[..], b"two");
        let b = get("b").await.expect("get b").bytes().await.expect("body");
        assert_eq!(
            &b[..],
            binary,
            "bytes that are not UTF-8 come back unchanged"
        );
        let log_after = store_log(&http, &base).await;
        assert_eq!(log_after, log_before);
        let found: Order = http
            .get(format!("{base}/orders/by-key/k1"))
            .header("x-tenant", "t1")
            .send()
            .await
            .expect("by key")
            .json()
            .await
            .expect("order");
        assert_eq!(
            (found.id.as_str(), found.body.as_str()),
            ("ord-1", "first order")
        );
        let next: Order = http
            .post(format!("{base}/orders"))
            .body("second order")
            .send()
            .await
            .expect("post")
            .json()
            .await
            .expect("order");
        assert_eq!(next.id, "ord-2", "order ids go on where they stopped");
    }

    #[test]
    fn a_torn_last_line_is_cut_and_a_bad_line_before_it_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = dir.path().join("journal.jsonl");
        let line = |seq: u64, value: &str| {
            format!(r#"{{"seq":{seq},"key":"k","fence_token":null,"value":"{value}"}}"#)
        };
        // A SIGKILL in the middle of the second write.
        std::fs::write(&journal, format!("{}\n{{\"seq\":2,\"ke", line(1, "v1"))).expect("write");
        let store = DemoStore::open(&journal).expect("a torn last line is no error");
        assert_eq!(store.writes(), 1);
        drop(store);
        assert_eq!(
            std::fs::read_to_string(&journal).expect("read"),
            format!("{}\n", line(1, "v1")),
            "the torn line is cut, so the next write starts on a line of its own"
        );

        std::fs::write(&journal, format!("garbage\n{}\n", line(1, "v1"))).expect("write");
        let err = DemoStore::open(&journal).err().expect("refused");
        assert!(err.to_string().contains("journal.jsonl line 1"), "{err}");
        std::fs::write(&journal, format!("{}\n{}\n", line(1, "a"), line(3, "b"))).expect("write");
        let err = DemoStore::open(&journal).err().expect("refused");
        assert!(err.to_string().contains("write 3 out of order"), "{err}");

        // Whole, but cut just before its newline: kept, and the newline restored.
        std::fs::write(&journal, line(1, "a")).expect("write");
        assert_eq!(DemoStore::open(&journal).expect("open").writes(), 1);
        assert_eq!(
            std::fs::read_to_string(&journal).expect("read"),
            format!("{}\n", line(1, "a"))
        );
    }
}
