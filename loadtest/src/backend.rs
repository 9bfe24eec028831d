//! The systems under test behind one interface: fencegate's HTTP lock API (plain reqwest, one
//! connection pool and one concurrency limit per node) and etcd's lease + lock API
//! (etcd-client).
//!
//! Each call returns the final outcome after retries plus the code of every failed attempt.
//! Retries reuse the same `request_id` / `lease_id`, which the API makes safe (SPEC §3.6).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// A granted lease, as the client holds it.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The lease id as sent back on renew/release (hex for fencegate, decimal for etcd).
    pub lease_id: String,
    /// The lease id as a number for duplicate checks.
    pub lease_num: u128,
    /// fencegate: the fencing token; etcd: the revision that created the lock key.
    pub token: u64,
    /// etcd: the lock key to unlock.
    pub etcd_key: Vec<u8>,
}

/// Why a call did not succeed.
#[derive(Clone, Debug)]
pub struct Failure {
    pub code: String,
    /// The server gave a final answer (4xx) rather than an uncertain one.
    pub definite: bool,
}

/// The result of one logical call.
pub struct Call<T> {
    pub result: Result<T, Failure>,
    /// Codes of the failed attempts (including the final one).
    pub errors: Vec<String>,
    /// When the first attempt went out (after waiting for a connection): a lease granted by
    /// this call cannot have been stamped earlier, so its validity is counted from here.
    pub first_send: Instant,
    /// When the successful (or last) attempt went out.
    pub last_send: Instant,
    /// When the final answer arrived: a server answer "lease gone" was decided before this.
    pub answered: Instant,
}

pub enum Backend {
    Fencegate(FencegateClient),
    Etcd(EtcdClient),
}

impl Backend {
    pub async fn acquire(
        &self,
        resource: u32,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Call<Grant> {
        match self {
            Backend::Fencegate(c) => c.acquire(resource, request_id, ttl_ms, wait_ms).await,
            Backend::Etcd(c) => c.acquire(resource, ttl_ms, wait_ms).await,
        }
    }

    /// Ok(true) renewed, Ok(false) the server says the lease is gone.
    pub async fn renew(&self, resource: u32, grant: &Grant) -> Call<bool> {
        match self {
            Backend::Fencegate(c) => c.renew(resource, grant).await,
            Backend::Etcd(c) => c.renew(grant).await,
        }
    }

    /// Ok(true) released, Ok(false) the lease was no longer current.
    pub async fn release(&self, resource: u32, grant: &Grant) -> Call<bool> {
        match self {
            Backend::Fencegate(c) => c.release(resource, grant).await,
            Backend::Etcd(c) => c.release(grant).await,
        }
    }

    /// A fenced write through the proxy (fencegate only).
    pub async fn write(&self, resource: u32, grant: &Grant) -> Option<Call<()>> {
        match self {
            Backend::Fencegate(c) if !c.proxies.is_empty() => Some(c.write(resource, grant).await),
            _ => None,
        }
    }

    pub fn supports_writes(&self) -> bool {
        matches!(self, Backend::Fencegate(c) if !c.proxies.is_empty())
    }
}

pub fn resource_name(idx: u32) -> String {
    format!("kv:lt{idx}")
}

// ---- fencegate ------------------------------------------------------------------------------

/// One node's HTTP endpoint: its own connection pool and concurrency limit.
struct Endpoint {
    base: String,
    http: reqwest::Client,
    permits: Semaphore,
    /// Skip until this many ms after the client's epoch (after a connection error).
    down_until_ms: AtomicU64,
}

impl Endpoint {
    fn new(base: String, connections: usize, timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(connections)
            .pool_idle_timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_millis(500))
            .timeout(timeout)
            .tcp_nodelay(true)
            .build()?;
        Ok(Endpoint {
            base,
            http,
            permits: Semaphore::new(connections),
            down_until_ms: AtomicU64::new(0),
        })
    }
}

enum Attempt {
    Ok(Value),
    Definite(String),
    Uncertain(String),
}

pub struct FencegateClient {
    nodes: Vec<Endpoint>,
    proxies: Vec<Endpoint>,
    next: AtomicUsize,
    /// Index of the node believed to be the leader (with `leader_only`).
    leader: Option<Arc<AtomicUsize>>,
    retries: u32,
    epoch: Instant,
}

impl FencegateClient {
    pub fn new(
        nodes: &[String],
        proxies: &[String],
        connections: usize,
        timeout: Duration,
        retries: u32,
        leader: Option<Arc<AtomicUsize>>,
    ) -> anyhow::Result<Self> {
        Ok(FencegateClient {
            nodes: nodes
                .iter()
                .map(|b| Endpoint::new(b.clone(), connections, timeout))
                .collect::<anyhow::Result<_>>()?,
            proxies: proxies
                .iter()
                .map(|b| Endpoint::new(b.clone(), connections, timeout))
                .collect::<anyhow::Result<_>>()?,
            next: AtomicUsize::new(0),
            leader,
            retries,
            epoch: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The node for attempt `n` of a call: round robin (or the leader), skipping nodes that
    /// refused a connection recently; a retry moves to the next node.
    fn pick<'a>(&self, eps: &'a [Endpoint], start: usize, n: u32) -> &'a Endpoint {
        let now = self.now_ms();
        for k in 0..eps.len() {
            let e = &eps[(start + n as usize + k) % eps.len()];
            if e.down_until_ms.load(Ordering::Relaxed) <= now {
                return e;
            }
        }
        &eps[(start + n as usize) % eps.len()]
    }

    fn start_index(&self, eps: &[Endpoint]) -> usize {
        match &self.leader {
            Some(l) if eps.len() == self.nodes.len() => l.load(Ordering::Relaxed),
            _ => self.next.fetch_add(1, Ordering::Relaxed) % eps.len(),
        }
    }

    /// One request; returns the answer and when it went out (after the permit).
    async fn attempt(&self, ep: &Endpoint, req: reqwest::RequestBuilder) -> (Attempt, Instant) {
        // Waiting for a permit is part of the client-visible latency, like waiting for a
        // free connection in any pooled client.
        let _permit = ep.permits.acquire().await;
        let sent = Instant::now();
        let a = self.send(ep, req).await;
        (a, sent)
    }

    async fn send(&self, ep: &Endpoint, req: reqwest::RequestBuilder) -> Attempt {
        match req.send().await {
            Err(e) => {
                if e.is_connect() {
                    ep.down_until_ms
                        .store(self.now_ms() + 500, Ordering::Relaxed);
                    Attempt::Uncertain("connect_error".into())
                } else if e.is_timeout() {
                    Attempt::Uncertain("client_timeout".into())
                } else {
                    Attempt::Uncertain("transport_error".into())
                }
            }
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body = resp.bytes().await.unwrap_or_default();
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if (200..300).contains(&status) {
                    return Attempt::Ok(v);
                }
                let code = v
                    .get("error")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("http_{status}"));
                if status >= 500 {
                    Attempt::Uncertain(code)
                } else {
                    Attempt::Definite(code)
                }
            }
        }
    }

    async fn post(&self, path: &str, body: Value) -> Call<Value> {
        let mut first_send = None;
        let mut errors = Vec::new();
        let start = self.start_index(&self.nodes);
        let mut n = 0;
        loop {
            let ep = self.pick(&self.nodes, start, n);
            let req = ep.http.post(format!("{}{}", ep.base, path)).json(&body);
            let (answer, last_send) = self.attempt(ep, req).await;
            let first_send = *first_send.get_or_insert(last_send);
            let answered = Instant::now();
            match answer {
                Attempt::Ok(v) => {
                    return Call {
                        result: Ok(v),
                        errors,
                        first_send,
                        last_send,
                        answered,
                    };
                }
                Attempt::Definite(code) => {
                    errors.push(code.clone());
                    return Call {
                        result: Err(Failure {
                            code,
                            definite: true,
                        }),
                        errors,
                        first_send,
                        last_send,
                        answered,
                    };
                }
                Attempt::Uncertain(code) => {
                    errors.push(code.clone());
                    if n >= self.retries {
                        return Call {
                            result: Err(Failure {
                                code,
                                definite: false,
                            }),
                            errors,
                            first_send,
                            last_send,
                            answered,
                        };
                    }
                }
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(25u64 << n.min(5))).await;
        }
    }

    async fn acquire(
        &self,
        resource: u32,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Call<Grant> {
        let path = format!("/v1/locks/{}/acquire", resource_name(resource));
        let mut body = json!({ "request_id": request_id, "ttl_ms": ttl_ms, "holder": "loadtest" });
        if wait_ms > 0 {
            body["wait_timeout_ms"] = json!(wait_ms);
        }
        let call = self.post(&path, body).await;
        map_call(call, |v| {
            let lease_id = v.get("lease_id")?.as_str()?.to_string();
            let lease_num = u128::from_str_radix(&lease_id, 16).ok()?;
            let token = v.get("fencing_token")?.as_u64()?;
            Some(Grant {
                lease_id,
                lease_num,
                token,
                etcd_key: Vec::new(),
            })
        })
    }

    async fn renew(&self, resource: u32, grant: &Grant) -> Call<bool> {
        let path = format!("/v1/locks/{}/renew", resource_name(resource));
        let call = self
            .post(&path, json!({ "lease_id": grant.lease_id }))
            .await;
        lease_gone_is_false(map_call(call, |_| Some(true)), "lease_lost")
    }

    async fn release(&self, resource: u32, grant: &Grant) -> Call<bool> {
        let path = format!("/v1/locks/{}/release", resource_name(resource));
        let call = self
            .post(&path, json!({ "lease_id": grant.lease_id }))
            .await;
        map_call(call, |v| v.get("released")?.as_bool())
    }

    async fn write(&self, resource: u32, grant: &Grant) -> Call<()> {
        let start = self.start_index(&self.proxies);
        let ep = self.pick(&self.proxies, start, 0);
        let req = ep
            .http
            .put(format!("{}/kv/lt{resource}", ep.base))
            .header("Fence-Token", grant.token.to_string())
            .body(format!("written with token {}", grant.token));
        let (answer, first_send) = self.attempt(ep, req).await;
        let (result, errors) = match answer {
            Attempt::Ok(_) => (Ok(()), Vec::new()),
            Attempt::Definite(code) | Attempt::Uncertain(code) => (
                Err(Failure {
                    code: code.clone(),
                    definite: true,
                }),
                vec![code],
            ),
        };
        Call {
            result,
            errors,
            first_send,
            last_send: first_send,
            answered: Instant::now(),
        }
    }
}

fn map_call<T>(call: Call<Value>, f: impl FnOnce(&Value) -> Option<T>) -> Call<T> {
    let Call {
        result,
        mut errors,
        first_send,
        last_send,
        answered,
    } = call;
    let result = match result {
        Ok(v) => match f(&v) {
            Some(t) => Ok(t),
            None => {
                errors.push("bad_response".into());
                Err(Failure {
                    code: "bad_response".into(),
                    definite: false,
                })
            }
        },
        Err(e) => Err(e),
    };
    Call {
        result,
        errors,
        first_send,
        last_send,
        answered,
    }
}

/// Turns the definite "lease is gone" answer into Ok(false) (it is an answer, not an error).
fn lease_gone_is_false(mut call: Call<bool>, code: &str) -> Call<bool> {
    if matches!(&call.result, Err(f) if f.definite && f.code == code) {
        call.result = Ok(false);
        call.errors.pop();
    }
    call
}

// ---- etcd -----------------------------------------------------------------------------------

/// etcd: lease grant + lock (with the lease) to acquire, one keep-alive round trip to renew,
/// unlock + lease revoke to release. One gRPC connection per member.
pub struct EtcdClient {
    members: Vec<(etcd_client::Client, Semaphore)>,
    next: AtomicUsize,
    timeout: Duration,
}

impl EtcdClient {
    pub async fn connect(
        endpoints: &[String],
        connections: usize,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let mut members = Vec::new();
        for e in endpoints {
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(timeout);
            let c = etcd_client::Client::connect([e.as_str()], Some(opts)).await?;
            members.push((c, Semaphore::new(connections)));
        }
        Ok(EtcdClient {
            members,
            next: AtomicUsize::new(0),
            timeout,
        })
    }

    fn member(&self) -> &(etcd_client::Client, Semaphore) {
        &self.members[self.next.fetch_add(1, Ordering::Relaxed) % self.members.len()]
    }

    async fn acquire(&self, resource: u32, ttl_ms: u64, wait_ms: u64) -> Call<Grant> {
        let (client, permits) = self.member();
        let _p = permits.acquire().await;
        let first_send = Instant::now();
        let mut c = client.clone();
        let ttl_s = ttl_ms.div_ceil(1000) as i64;
        let r: Result<Grant, Failure> = async {
            let lease = etcd_timeout(self.timeout, c.lease_grant(ttl_s, None)).await?;
            let id = lease.id();
            let opts = etcd_client::LockOptions::new().with_lease(id);
            let name = format!("/lt/lock/{resource}");
            // etcd's lock waits for the key; a try-once acquire gets a short deadline.
            let wait = if wait_ms > 0 {
                Duration::from_millis(wait_ms)
            } else {
                self.timeout
            };
            let lock = match etcd_timeout(wait, c.lock(name, Some(opts))).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = etcd_timeout(self.timeout, c.lease_revoke(id)).await;
                    return Err(e);
                }
            };
            let token = lock.header().map_or(0, |h| h.revision()) as u64;
            Ok(Grant {
                lease_id: id.to_string(),
                lease_num: id as u64 as u128,
                token,
                etcd_key: lock.key().to_vec(),
            })
        }
        .await;
        etcd_call(r, first_send)
    }

    async fn renew(&self, grant: &Grant) -> Call<bool> {
        let (client, permits) = self.member();
        let _p = permits.acquire().await;
        let first_send = Instant::now();
        let mut c = client.clone();
        let id: i64 = grant.lease_id.parse().unwrap_or(0);
        let r = async {
            let (mut keeper, mut stream) =
                etcd_timeout(self.timeout, c.lease_keep_alive(id)).await?;
            etcd_timeout(self.timeout, keeper.keep_alive()).await?;
            match etcd_timeout(self.timeout, stream.message()).await? {
                Some(resp) => Ok(resp.ttl() > 0),
                None => Err(Failure {
                    code: "stream_closed".into(),
                    definite: false,
                }),
            }
        }
        .await;
        etcd_call(r, first_send)
    }

    async fn release(&self, grant: &Grant) -> Call<bool> {
        let (client, permits) = self.member();
        let _p = permits.acquire().await;
        let first_send = Instant::now();
        let mut c = client.clone();
        let id: i64 = grant.lease_id.parse().unwrap_or(0);
        let r = async {
            etcd_timeout(self.timeout, c.unlock(grant.etcd_key.clone())).await?;
            match etcd_timeout(self.timeout, c.lease_revoke(id)).await {
                Ok(_) => Ok(true),
                // Revoking a lease that already expired: the lock key went with it.
                Err(f) if f.code == "lease_not_found" || f.code.contains("NotFound") => Ok(false),
                Err(f) => Err(f),
            }
        }
        .await;
        etcd_call(r, first_send)
    }
}

async fn etcd_timeout<T>(
    d: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(d, f).await {
        Err(_) => Err(Failure {
            code: "client_timeout".into(),
            definite: false,
        }),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(etcd_client::Error::GRpcStatus(s))) => {
            let code = if s.message().contains("lease not found") {
                "lease_not_found".to_string()
            } else {
                format!("grpc_{:?}", s.code())
            };
            Err(Failure {
                code,
                definite: false,
            })
        }
        Ok(Err(e)) => Err(Failure {
            code: format!("etcd_{}", error_kind(&e)),
            definite: false,
        }),
    }
}

fn error_kind(e: &etcd_client::Error) -> &'static str {
    match e {
        etcd_client::Error::TransportError(_) => "transport",
        etcd_client::Error::IoError(_) => "io",
        etcd_client::Error::LeaseKeepAliveError(_) => "keepalive",
        _ => "other",
    }
}

fn etcd_call<T>(r: Result<T, Failure>, first_send: Instant) -> Call<T> {
    let errors = match &r {
        Err(f) => vec![f.code.clone()],
        Ok(_) => Vec::new(),
    };
    Call {
        result: r,
        errors,
        first_send,
        last_send: first_send,
        answered: Instant::now(),
    }
}
