//! The bundled demo store: a tiny HTTP key-value store that cannot check tokens — the kind
//! of store the fencing proxy exists for.
//!
//! `PUT /kv/{key}` stores the body, `GET /kv/{key}` returns it, and `GET /log` lists every
//! accepted write in the order it was applied, with the `Fence-Token` header it carried (the
//! store records it, it does not check it), so tests can prove what landed and in which order.
//! A write may ask to be applied late with `X-Demo-Delay-Ms: N` (at most 60 s), which is how
//! tests model a slow upstream.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tokio::net::TcpListener;

/// One accepted write.
#[derive(Clone, Debug, Serialize)]
pub struct LogEntry {
    pub seq: u64,
    pub key: String,
    pub fence_token: Option<u64>,
    pub value: String,
}

#[derive(Default)]
struct Store {
    data: HashMap<String, Bytes>,
    log: Vec<LogEntry>,
}

type Shared = Arc<Mutex<Store>>;

/// Serves the demo store on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/kv/{key}", get(get_key).put(put_key))
        .route("/log", get(log))
        .with_state(Shared::default());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

fn lock(store: &Shared) -> std::sync::MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|e| e.into_inner())
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
    });
    s.data.insert(key, body);
    (StatusCode::OK, Json(serde_json::json!({ "seq": seq }))).into_response()
}

async fn log(State(store): State<Shared>) -> Json<Vec<LogEntry>> {
    Json(lock(&store).log.clone())
}
