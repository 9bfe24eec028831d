//! The clients' view of the system: raw HTTP calls to the lock API and the fencing proxies,
//! each recorded in the history as an invocation and a completion.
//!
//! Raw HTTP rather than `lock_core::client`: the checker needs every attempt (the library
//! retries inside one call) and the exact answer of each.
//!
//! Outcomes are classified as Jepsen does: `ok` (it happened, here is the answer), `fail` (it
//! definitely did not happen: a 4xx, a refused connection, a proxy rejection) or `info`
//! (unknown: a timeout, a lost connection, 503 `no_quorum` from the lock API — a write that
//! timed out may still commit — or a response the drop-responses nemesis threw away).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};

use super::history::{EventType, History};

/// One node's endpoints.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub id: u64,
    pub api: String,
    pub proxy: String,
}

/// What a call came to.
#[derive(Clone, Debug)]
pub enum Outcome {
    Ok(Value),
    Fail(Value),
    Info,
}

/// The drop-responses nemesis: while on, some lock calls lose their answer. Half of them are
/// sent and answered in full, then the answer is thrown away (the server committed; the client
/// never hears it); the other half are abandoned 1–80 ms after sending (the client hangs up
/// mid-request, so it is unknown whether the server acted).
#[derive(Default)]
pub struct DropSwitch {
    on: AtomicBool,
    pub dropped: AtomicU64,
    pub abandoned: AtomicU64,
}

/// Probability that a lock call is hit while the drop-responses nemesis is on.
const DROP_P: f64 = 0.4;

impl DropSwitch {
    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }

    fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Drop {
    Keep,
    /// Receive the answer, then act as if it never came.
    Lose,
    /// Hang up this long after sending.
    Abandon(Duration),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// acquire / renew / release / cancel on the lock API.
    Lock,
    /// A protected write through a fencing proxy.
    Write,
    /// A read; never retried on, never checked as an effect.
    Read,
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    pub nodes: Arc<Vec<Endpoint>>,
    pub store: String,
    hist: Arc<History>,
    drops: Arc<DropSwitch>,
}

impl Client {
    pub fn new(
        nodes: Vec<Endpoint>,
        store: String,
        hist: Arc<History>,
        drops: Arc<DropSwitch>,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            .pool_max_idle_per_host(16)
            .build()?;
        Ok(Client {
            http,
            nodes: Arc::new(nodes),
            store,
            hist,
            drops,
        })
    }

    pub fn history(&self) -> &History {
        &self.hist
    }

    fn endpoint(&self, node: u64) -> &Endpoint {
        self.nodes
            .iter()
            .find(|n| n.id == node)
            .unwrap_or(&self.nodes[0])
    }

    /// `POST /v1/locks/{resource}/acquire`.
    pub async fn acquire(
        &self,
        process: &str,
        node: u64,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
        wait_timeout_ms: u64,
    ) -> Outcome {
        let body = json!({
            "request_id": request_id,
            "holder": process,
            "ttl_ms": ttl_ms,
            "wait_timeout_ms": wait_timeout_ms,
        });
        let mut inv = body.clone();
        inv["resource"] = json!(resource);
        // A long poll may legitimately take its wait plus the server's slack (cancel and
        // release of an abandoned wait, each bounded by the 2 s write timeout).
        let timeout = Duration::from_millis(wait_timeout_ms + 8_000);
        let url = format!("{}/v1/locks/{resource}/acquire", self.endpoint(node).api);
        self.call(process, "acquire", node, Kind::Lock, inv, timeout, |h| {
            h.post(url).json(&body)
        })
        .await
    }

    /// `POST /v1/locks/{resource}/renew` (or `release`).
    pub async fn lease_call(
        &self,
        process: &str,
        f: &'static str,
        node: u64,
        resource: &str,
        lease_id: &str,
    ) -> Outcome {
        let body = json!({ "lease_id": lease_id });
        let inv = json!({ "resource": resource, "lease_id": lease_id });
        let url = format!("{}/v1/locks/{resource}/{f}", self.endpoint(node).api);
        self.call(
            process,
            f,
            node,
            Kind::Lock,
            inv,
            Duration::from_secs(4),
            |h| h.post(url).json(&body),
        )
        .await
    }

    /// `PUT /kv/{key}` through node `node`'s fencing proxy with `Fence-Token: token`.
    /// `role` marks the write in the history (`normal`, `zombie`, `foreign`).
    pub async fn write(
        &self,
        process: &str,
        node: u64,
        key: &str,
        token: u64,
        value: &str,
        role: &str,
    ) -> Outcome {
        let inv = json!({
            "resource": format!("kv:{key}"),
            "key": key,
            "token": token,
            "value": value,
            "role": role,
        });
        let url = format!("{}/kv/{key}", self.endpoint(node).proxy);
        let body = value.to_string();
        self.call(
            process,
            "write",
            node,
            Kind::Write,
            inv,
            Duration::from_secs(4),
            |h| {
                h.put(url)
                    .header("Fence-Token", token.to_string())
                    .body(body)
            },
        )
        .await
    }

    /// `GET /kv/{key}` straight from the store (what a zombie looks at before waking up).
    pub async fn read_kv(&self, process: &str, key: &str) -> Outcome {
        let url = format!("{}/kv/{key}", self.store);
        self.call(
            process,
            "read_kv",
            0,
            Kind::Read,
            json!({ "key": key }),
            Duration::from_secs(2),
            |h| h.get(url),
        )
        .await
    }

    /// `GET /v1/locks/{resource}` (linearizable) under the history function name `f`.
    pub async fn read_lock(&self, process: &str, f: &str, node: u64, resource: &str) -> Outcome {
        let url = format!("{}/v1/locks/{resource}", self.endpoint(node).api);
        self.call(
            process,
            f,
            node,
            Kind::Read,
            json!({ "resource": resource }),
            Duration::from_secs(4),
            |h| h.get(url),
        )
        .await
    }

    /// Any GET, recorded under `f` (the final cluster views and the store's log).
    pub async fn get(&self, process: &str, f: &str, node: Option<u64>, url: String) -> Outcome {
        self.call(
            process,
            f,
            node.unwrap_or(0),
            Kind::Read,
            json!({ "url": url }),
            Duration::from_secs(10),
            |h| h.get(url.clone()),
        )
        .await
    }

    fn drop_mode(&self, kind: Kind) -> Drop {
        if kind != Kind::Lock || !self.drops.is_on() {
            return Drop::Keep;
        }
        let mut rng = rand::rng();
        if !rng.random_bool(DROP_P) {
            return Drop::Keep;
        }
        if rng.random_bool(0.5) {
            Drop::Lose
        } else {
            // Mostly within a commit's time (a few ms): hanging up while the server is still
            // deciding is where a lost answer is most interesting.
            let ms = if rng.random_bool(0.6) {
                rng.random_range(1..=15)
            } else {
                rng.random_range(15..=80)
            };
            Drop::Abandon(Duration::from_millis(ms))
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        process: &str,
        f: &str,
        node: u64,
        kind: Kind,
        inv: Value,
        timeout: Duration,
        build: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Outcome {
        let drop = self.drop_mode(kind);
        let node_field = (node != 0).then_some(node);
        let pending = self.hist.invoke(process, f, node_field, inv);
        let req = build(&self.http).timeout(timeout);
        let exchange = async move {
            let resp = req.send().await?;
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await?;
            Ok::<_, reqwest::Error>((status, bytes))
        };
        let result = match drop {
            Drop::Abandon(after) => match tokio::time::timeout(after, exchange).await {
                Ok(r) => r,
                Err(_) => {
                    self.drops.abandoned.fetch_add(1, Ordering::Relaxed);
                    let v = json!({ "error": "abandoned", "after_ms": after.as_millis() as u64 });
                    self.hist.complete(pending, EventType::Info, v);
                    return Outcome::Info;
                }
            },
            _ => exchange.await,
        };
        let (kind_out, value) = match result {
            Err(e) if e.is_connect() => (
                EventType::Fail,
                json!({ "error": "connect", "message": e.to_string() }),
            ),
            Err(e) => (
                EventType::Info,
                json!({
                    "error": if e.is_timeout() { "timeout" } else { "transport" },
                    "message": e.to_string(),
                }),
            ),
            Ok((status, bytes)) => {
                let body: Value = serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
                let class = classify(kind, status);
                if class == EventType::Ok {
                    if drop == Drop::Lose {
                        self.drops.dropped.fetch_add(1, Ordering::Relaxed);
                        (
                            EventType::Info,
                            json!({ "error": "response_dropped", "status": status, "body": body }),
                        )
                    } else {
                        (EventType::Ok, body)
                    }
                } else {
                    let code = body.get("error").cloned().unwrap_or(Value::Null);
                    (
                        class,
                        json!({ "status": status, "error": code, "body": body }),
                    )
                }
            }
        };
        self.hist.complete(pending, kind_out, value.clone());
        match kind_out {
            EventType::Ok => Outcome::Ok(value),
            EventType::Fail => Outcome::Fail(value),
            _ => Outcome::Info,
        }
    }
}

/// Whether an HTTP answer means the call happened, did not, or may have.
fn classify(kind: Kind, status: u16) -> EventType {
    match (kind, status) {
        (_, 200..=299) => EventType::Ok,
        // The lock API: 503 `no_quorum` may still commit later (docs/api.md), as may any
        // other server error; 4xx answers are definite.
        (Kind::Lock, 500..=599) => EventType::Info,
        (Kind::Lock, _) => EventType::Fail,
        // The proxy: a rejection (400/404/412/428) and 503 `no_quorum` forward nothing
        // (docs/fencing.md); 502/504 "may or may not have reached the upstream".
        (Kind::Write, 502 | 504) => EventType::Info,
        (Kind::Write, 500..=599) if status != 503 => EventType::Info,
        (Kind::Write, _) => EventType::Fail,
        (Kind::Read, _) => EventType::Fail,
    }
}
