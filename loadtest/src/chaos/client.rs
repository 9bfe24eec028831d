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

use bytes::Bytes;
use lock_core::wire::{
    classify, AcquireRequest, AcquireResponse, ClusterStatus, ErrorBody, Failure, LeaseId,
    LeaseRequest, LimitedLogEntry, LockView, Order, ReleaseResponse, RenewResponse, StoreLogEntry,
    FENCE_TOKEN_HEADER,
};
use rand::Rng;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Serialize;
use serde_json::Value;

use super::history::{
    EventType, History, LimitedCall, LockCall, OrderCall, ReadCall, Trouble, WriteCall, WriteRole,
};

/// One node's endpoints.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub id: u64,
    pub api: String,
    pub proxy: String,
}

/// What a call came to, for the client that made it (the history has the details).
#[derive(Clone, Debug)]
pub enum Outcome<T> {
    /// It happened; the answer.
    Ok(T),
    /// It did not happen, or its answer is of no use: no point retrying.
    Fail,
    /// No connection could be made: nothing was sent, another node may do.
    Unreachable,
    /// Unknown whether it happened: retry with the same ids.
    Info,
}

impl<T> Outcome<T> {
    /// The answer turned into what the caller wants; one it cannot use is a `Fail`.
    fn and_then<U>(self, f: impl FnOnce(T) -> Option<U>) -> Outcome<U> {
        match self {
            Outcome::Ok(v) => f(v).map_or(Outcome::Fail, Outcome::Ok),
            Outcome::Fail => Outcome::Fail,
            Outcome::Unreachable => Outcome::Unreachable,
            Outcome::Info => Outcome::Info,
        }
    }
}

fn json<T: DeserializeOwned>(body: Bytes) -> Option<T> {
    serde_json::from_slice(&body).ok()
}

/// The drop-responses nemesis: while on, some lock calls and orders lose their answer. Half of them are
/// sent and answered in full, then the answer is thrown away (the server committed; the client
/// never hears it); the other half are abandoned 1–80 ms after sending (the client hangs up
/// mid-request, so it is unknown whether the server acted).
#[derive(Default)]
pub struct DropSwitch {
    on: AtomicBool,
    pub dropped: AtomicU64,
    pub abandoned: AtomicU64,
}

/// Probability that a lock call or order is hit while the drop-responses nemesis is on.
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
    /// A create-order with an `Idempotency-Key` through a fencing proxy.
    Order,
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
    ) -> Outcome<AcquireResponse> {
        let inv = LockCall {
            resource: resource.to_string(),
            body: AcquireRequest {
                request_id: request_id.to_string(),
                holder: Some(process.to_string()),
                ttl_ms: Some(ttl_ms),
                wait_timeout_ms: Some(wait_timeout_ms),
            },
        };
        // A long poll may legitimately take its wait plus the server's slack (cancel and
        // release of an abandoned wait, each bounded by the 2 s write timeout).
        let timeout = Duration::from_millis(wait_timeout_ms + 8_000);
        let url = format!("{}/v1/locks/{resource}/acquire", self.endpoint(node).api);
        self.call(process, "acquire", node, Kind::Lock, &inv, timeout, |h| {
            h.post(url).json(&inv.body)
        })
        .await
        .and_then(json)
    }

    /// `POST /v1/locks/{resource}/renew`.
    pub async fn renew(
        &self,
        process: &str,
        node: u64,
        resource: &str,
        lease_id: LeaseId,
    ) -> Outcome<RenewResponse> {
        self.lease_call(process, "renew", node, resource, lease_id)
            .await
            .and_then(json)
    }

    /// `POST /v1/locks/{resource}/release`.
    pub async fn release(
        &self,
        process: &str,
        node: u64,
        resource: &str,
        lease_id: LeaseId,
    ) -> Outcome<ReleaseResponse> {
        self.lease_call(process, "release", node, resource, lease_id)
            .await
            .and_then(json)
    }

    async fn lease_call(
        &self,
        process: &str,
        f: &'static str,
        node: u64,
        resource: &str,
        lease_id: LeaseId,
    ) -> Outcome<Bytes> {
        let inv = LockCall {
            resource: resource.to_string(),
            body: LeaseRequest {
                lease_id: Some(lease_id),
            },
        };
        let url = format!("{}/v1/locks/{resource}/{f}", self.endpoint(node).api);
        self.call(
            process,
            f,
            node,
            Kind::Lock,
            &inv,
            Duration::from_secs(4),
            |h| h.post(url).json(&inv.body),
        )
        .await
    }

    /// `PUT /kv/{key}` through node `node`'s fencing proxy with the fence token `token`.
    /// `role` marks the write in the history.
    pub async fn write(
        &self,
        process: &str,
        node: u64,
        key: &str,
        token: u64,
        value: &str,
        role: WriteRole,
    ) -> Outcome<()> {
        let inv = WriteCall {
            resource: format!("kv:{key}"),
            key: key.to_string(),
            token,
            value: value.to_string(),
            role,
        };
        let url = format!("{}/kv/{key}", self.endpoint(node).proxy);
        self.call(
            process,
            "write",
            node,
            Kind::Write,
            &inv,
            Duration::from_secs(4),
            |h| {
                h.put(url)
                    .header(FENCE_TOKEN_HEADER, token.to_string())
                    .body(value.to_string())
            },
        )
        .await
        .and_then(|_| Some(()))
    }

    /// `POST /orders` through node `node`'s fencing proxy with `Idempotency-Key: key` and
    /// `X-Tenant: tenant`. The answer is the order: the one this attempt created, or the one a
    /// replay or reconciliation names.
    pub async fn order(&self, process: &str, node: u64, call: &OrderCall) -> Outcome<Order> {
        let url = format!("{}/orders", self.endpoint(node).proxy);
        self.call(
            process,
            "order",
            node,
            Kind::Order,
            call,
            Duration::from_secs(4),
            |h| {
                let mut req = h
                    .post(url)
                    .header("idempotency-key", &call.key)
                    .header("x-tenant", &call.tenant)
                    .header("content-type", "application/json")
                    .body(call.body.clone());
                if let Some(ms) = call.answer_delay_ms {
                    req = req.header("x-demo-answer-delay-ms", ms.to_string());
                }
                req
            },
        )
        .await
        .and_then(json)
    }

    /// `GET /kv/{key}` straight from the store (what a zombie looks at before waking up).
    pub async fn read_kv(&self, process: &str, key: &str) -> Outcome<String> {
        let url = format!("{}/kv/{key}", self.store);
        self.call(
            process,
            "read_kv",
            0,
            Kind::Read,
            &ReadCall::Key(key.to_string()),
            Duration::from_secs(2),
            |h| h.get(url),
        )
        .await
        .and_then(|body| Some(String::from_utf8_lossy(&body).into_owned()))
    }

    /// `GET /v1/locks/{resource}` (linearizable) under the history function name `f`.
    pub async fn read_lock(
        &self,
        process: &str,
        f: &str,
        node: u64,
        resource: &str,
    ) -> Outcome<LockView> {
        let url = format!("{}/v1/locks/{resource}", self.endpoint(node).api);
        self.call(
            process,
            f,
            node,
            Kind::Read,
            &ReadCall::Resource(resource.to_string()),
            Duration::from_secs(4),
            |h| h.get(url),
        )
        .await
        .and_then(json)
    }

    /// `GET /v1/cluster` of node `node`, recorded as `final_cluster`.
    pub async fn final_cluster(&self, process: &str, node: u64) -> Outcome<ClusterStatus> {
        let url = format!("{}/v1/cluster", self.endpoint(node).api);
        self.get(process, "final_cluster", node, url)
            .await
            .and_then(json)
    }

    /// `GET /limited/{key}` through node `node`'s fencing proxy for `tenant`: admitted (`ok`,
    /// the store answered) or refused (`fail`, 429 `rate_limited` and other rejections).
    pub async fn limited(&self, process: &str, node: u64, key: &str, tenant: &str) -> Outcome<()> {
        let inv = LimitedCall {
            key: key.to_string(),
            tenant: tenant.to_string(),
        };
        let url = format!("{}/limited/{key}", self.endpoint(node).proxy);
        self.call(
            process,
            "limited",
            node,
            Kind::Write,
            &inv,
            Duration::from_secs(4),
            |h| h.get(url).header("x-tenant", tenant),
        )
        .await
        .and_then(|_| Some(()))
    }

    /// `GET /limited-log` of the store, recorded as `limited_log`.
    pub async fn limited_log(&self, process: &str) -> Outcome<Vec<LimitedLogEntry>> {
        let url = format!("{}/limited-log", self.store);
        self.get(process, "limited_log", 0, url)
            .await
            .and_then(json)
    }

    /// `GET /log` of the store, recorded as `store_log`.
    pub async fn store_log(&self, process: &str) -> Outcome<Vec<StoreLogEntry>> {
        let url = format!("{}/log", self.store);
        self.get(process, "store_log", 0, url).await.and_then(json)
    }

    async fn get(&self, process: &str, f: &str, node: u64, url: String) -> Outcome<Bytes> {
        self.call(
            process,
            f,
            node,
            Kind::Read,
            &ReadCall::Url(url.clone()),
            Duration::from_secs(10),
            |h| h.get(url),
        )
        .await
    }

    fn drop_mode(&self, kind: Kind) -> Drop {
        if !matches!(kind, Kind::Lock | Kind::Order) || !self.drops.is_on() {
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

    /// Sends one request and records it: the invocation `inv` before, the completion after.
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        process: &str,
        f: &str,
        node: u64,
        kind: Kind,
        inv: &impl Serialize,
        timeout: Duration,
        build: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Outcome<Bytes> {
        let drop = self.drop_mode(kind);
        let node_field = (node != 0).then_some(node);
        let pending = self.hist.invoke(process, f, node_field, recorded(inv));
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
                    let trouble = Trouble {
                        after_ms: Some(after.as_millis() as u64),
                        ..Trouble::new(Trouble::ABANDONED)
                    };
                    self.hist
                        .complete(pending, EventType::Info, recorded(&trouble));
                    return Outcome::Info;
                }
            },
            _ => exchange.await,
        };
        let (event, value, outcome) = match result {
            Err(e) => {
                let (error, event, outcome) = if e.is_connect() {
                    (Trouble::CONNECT, EventType::Fail, Outcome::Unreachable)
                } else if e.is_timeout() {
                    (Trouble::TIMEOUT, EventType::Info, Outcome::Info)
                } else {
                    (Trouble::TRANSPORT, EventType::Info, Outcome::Info)
                };
                let trouble = Trouble {
                    message: Some(e.to_string()),
                    ..Trouble::new(error)
                };
                (event, recorded(&trouble), outcome)
            }
            Ok((status, bytes)) => {
                let body = answer_body(&bytes);
                match sort(kind, status, &bytes) {
                    EventType::Ok if drop == Drop::Lose => {
                        self.drops.dropped.fetch_add(1, Ordering::Relaxed);
                        let trouble = Trouble {
                            status: Some(status),
                            body: Some(body),
                            ..Trouble::new(Trouble::RESPONSE_DROPPED)
                        };
                        (EventType::Info, recorded(&trouble), Outcome::Info)
                    }
                    EventType::Ok => (EventType::Ok, body, Outcome::Ok(bytes)),
                    event => {
                        let trouble = Trouble {
                            status: Some(status),
                            body: Some(body),
                            ..Trouble::new(ErrorBody::from_answer(status, &bytes).error.as_str())
                        };
                        let outcome = match event {
                            EventType::Fail => Outcome::Fail,
                            _ => Outcome::Info,
                        };
                        (event, recorded(&trouble), outcome)
                    }
                }
            }
        };
        self.hist.complete(pending, event, value);
        outcome
    }
}

/// A record for the history (every type recorded serializes to a JSON object).
fn recorded(v: &impl Serialize) -> Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// An answer's body as the history keeps it: its JSON, or its text.
fn answer_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into()))
}

/// Whether an HTTP answer means the call happened, did not, or may have.
fn sort(kind: Kind, status: u16, body: &[u8]) -> EventType {
    let success = (200..300).contains(&status);
    match kind {
        // The lock API's rule: 503 `no_quorum` may still commit later (docs/api.md), as may
        // any other server error; other answers are definite. A success that is not JSON
        // still happened: the checker reports the garbled answer.
        Kind::Lock => match classify::<IgnoredAny>(status, body) {
            Ok(_) => EventType::Ok,
            Err(Failure::Definite { .. }) => EventType::Fail,
            Err(Failure::Uncertain(_)) if success => EventType::Ok,
            Err(Failure::Uncertain(_)) => EventType::Info,
        },
        _ if success => EventType::Ok,
        // An idempotent route: a refusal (400, 409 in use or outcome unknown, 422) forwarded
        // nothing new; any 5xx may follow an effect (even 503: the upstream answered, the
        // answer could not be recorded).
        Kind::Order if status >= 500 => EventType::Info,
        // The proxy: a rejection (400/404/412/428) and 503 `no_quorum` forward nothing
        // (docs/fencing.md); 502/504 "may or may not have reached the upstream".
        Kind::Write if (500..600).contains(&status) && status != 503 => EventType::Info,
        Kind::Write | Kind::Order | Kind::Read => EventType::Fail,
    }
}
