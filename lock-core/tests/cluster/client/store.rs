//! A stand-in for a protected store, recording what a fenced writer sends.

use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};

/// One write the stand-in store accepted: key, Fence-Token, Fence-Resource, body.
pub type Write = (String, Option<u64>, Option<String>, String);

/// A tiny store that accepts `PUT /kv/{key}` and records what arrived with which headers. It
/// checks nothing: it shows what a fenced writer actually sends.
#[derive(Clone, Default)]
pub struct Store {
    writes: Arc<Mutex<Vec<Write>>>,
}

impl Store {
    pub async fn start() -> (String, Store) {
        let store = Store::default();
        let app = axum::Router::new()
            .route("/kv/{key}", axum::routing::put(store_put))
            .with_state(store.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(l, app).await.ok() });
        (url, store)
    }

    pub fn writes(&self) -> Vec<Write> {
        self.writes.lock().expect("lock").clone()
    }
}

async fn store_put(
    State(store): State<Store>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let token = header("fence-token").and_then(|t| t.parse().ok());
    store
        .writes
        .lock()
        .expect("lock")
        .push((key, token, header("fence-resource"), body));
    StatusCode::OK
}
