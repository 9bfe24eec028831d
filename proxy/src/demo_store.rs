//! The bundled demo store: a tiny HTTP key-value store that cannot check tokens — the kind
//! of store the fencing proxy exists for.
//!
//! `PUT /kv/{key}` stores the body, `GET /kv/{key}` returns it, and `GET /log` lists every
//! accepted write in the order it was applied, with the `Fence-Token` header it carried (the
//! store records it, it does not check it), so tests can prove what landed and in which order.
//! A write may ask to be applied late with `X-Demo-Delay-Ms: N` (at most 60 s), which is how
//! tests model a slow upstream.
//!
//! `/limited/{key}` answers 200 to GET, PUT and POST: the upstream of the rate-limited route.
//!
//! Orders, for the proxy's `Idempotency-Key` handling: `POST /orders` creates an order with a
//! new id (201 and the order as JSON; logged in `GET /log` with the `Idempotency-Key` it was
//! sent), and `GET /orders/by-key/{key}` finds the order created with that key (404 if none) —
//! the lookup the proxy reconciles lost answers with. The store itself knows nothing of
//! deduplication: two posts with one key make two orders. A post may carry
//! `X-Demo-Hold: NAME`: the order is created, then the answer waits until
//! `POST /holds/NAME/release` (at most 60 s) — how tests lose an answer after the effect.

use std::collections::{HashMap, HashSet};
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
use serde::{Deserialize, Serialize};
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
}

/// One created order, as `POST /orders` and the by-key lookup return it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
    pub idempotency_key: Option<String>,
    pub body: String,
}

#[derive(Default)]
struct Store {
    data: HashMap<String, Bytes>,
    log: Vec<LogEntry>,
    orders: Vec<Order>,
    released: HashSet<String>,
}

#[derive(Clone, Default)]
struct Shared {
    store: Arc<Mutex<Store>>,
    /// Wakes held order answers when a hold is released.
    holds: Arc<Notify>,
}

/// `GET/PUT/POST /limited/{key}`: answers 200 and does nothing else, the upstream of the
/// rate-limited route of `fencegate dev`.
async fn limited(Path(key): Path<String>) -> String {
    format!("ok {key}\n")
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
        .with_state(Shared::default());
    let limits = limits();
    let app = lock_core::api::listen::limit_bodies(app, &limits);
    lock_core::api::listen::serve(listener, app, &limits, None, shutdown).await
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

async fn get_key(State(store): State<Shared>, Path(key): Path<String>) -> Response {
    match lock(&store).data.get(&key) {
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
    s.log.push(LogEntry {
        seq,
        key: key.clone(),
        fence_token: header("fence-token"),
        value: String::from_utf8_lossy(&body).into_owned(),
        idempotency_key: None,
    });
    s.data.insert(key, body);
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
    (StatusCode::CREATED, Json(order)).into_response()
}

async fn order_by_key(State(shared): State<Shared>, Path(key): Path<String>) -> Response {
    let found = lock(&shared)
        .orders
        .iter()
        .find(|o| o.idempotency_key.as_deref() == Some(key.as_str()))
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
