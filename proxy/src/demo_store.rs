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
//! — how the chaos harness makes the proxy's upstream timeout lose answers.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_core::node::HttpLimits;
use lock_core::wire::{LimitedLogEntry, Order};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// One accepted write.
#[derive(Clone, Debug, Serialize)]
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

/// Serves the demo store on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
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
        .with_state(Shared::default());
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
    let slot = kv_slot(&headers, &key);
    let mut s = lock(&store);
    let seq = s.log.len() as u64 + 1;
    s.log.push(LogEntry {
        seq,
        key: slot.clone(),
        fence_token: header("fence-token"),
        value: String::from_utf8_lossy(&body).into_owned(),
        idempotency_key: None,
        tenant: None,
    });
    s.data.insert(slot, body);
    (StatusCode::OK, Json(serde_json::json!({ "seq": seq }))).into_response()
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
    let order = {
        let mut s = lock(&shared);
        let order = Order {
            id: format!("ord-{}", s.orders.len() + 1),
            tenant: tenant_of(&headers),
            idempotency_key: text("idempotency-key"),
            body: String::from_utf8_lossy(&body).into_owned(),
        };
        let seq = s.log.len() as u64 + 1;
        s.log.push(LogEntry {
            seq,
            key: format!("order:{}", order.id),
            fence_token: None,
            value: order.body.clone(),
            idempotency_key: order.idempotency_key.clone(),
            tenant: Some(order.tenant.clone()),
        });
        s.orders.push(order.clone());
        order
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
