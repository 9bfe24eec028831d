//! fencegate's lock API over plain HTTP, speaking `lock_core::wire`: the harness's own lean
//! HTTP/1.1 connections ([`super::http1`]) rather than `lock_core::client`, because the harness
//! spreads calls over the nodes itself, counts every failed attempt by its code, and must take
//! as little CPU as it can from the cluster it measures.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::Method;
use lock_core::client::NodeRoute;
use lock_core::wire::{
    self, classify, AcquireRequest, AcquireResponse, ErrorBody, ErrorCode, LeaseRequest,
    ReleaseResponse, RenewResponse, FENCE_TOKEN_HEADER,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Semaphore;

use super::http1::{ConnPool, Outgoing, SendError};
use super::{connection, resource_name, Call, Failure, Grant, Lease, Sent};

/// The code of a success whose body does not parse.
const BAD_RESPONSE: &str = "bad_response";

/// One node's HTTP endpoint: its own connection pool and concurrency limit.
struct Endpoint {
    pool: ConnPool,
    permits: Semaphore,
    /// Skip until this many ms after the client's epoch (after a connection error).
    down_until_ms: AtomicU64,
}

impl Endpoint {
    fn new(base: &str, connections: usize, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Endpoint {
            pool: ConnPool::new(base, Duration::from_millis(500), timeout)?,
            permits: Semaphore::new(connections),
            down_until_ms: AtomicU64::new(0),
        })
    }
}

/// How one attempt of a lock call ended.
enum Attempt<T> {
    Ok(T),
    /// A final answer: the call is over.
    Definite(String),
    /// Unknown whether it took effect: safe to retry with the same ids.
    Uncertain(String),
    /// A success whose body does not parse: the call is over, its outcome unknown.
    Garbled,
}

impl<T: DeserializeOwned> Attempt<T> {
    /// Sorts an answer by the wire contract's one rule, keeping the error code of 5xx
    /// answers for the per-code counts.
    fn of_answer(status: u16, body: &[u8]) -> Self {
        match classify::<T>(status, body) {
            Ok(v) => Attempt::Ok(v),
            Err(wire::Failure::Definite { body, .. }) => Attempt::Definite(body.error.to_string()),
            Err(wire::Failure::Uncertain(_)) if (200..300).contains(&status) => Attempt::Garbled,
            Err(wire::Failure::Uncertain(_)) => {
                Attempt::Uncertain(ErrorBody::from_answer(status, body).error.to_string())
            }
        }
    }
}

pub struct FencegateClient {
    nodes: Vec<Endpoint>,
    proxies: Vec<Endpoint>,
    next: AtomicUsize,
    /// With `leader_only`: the node believed to lead, followed through the leader named in
    /// every answer, as the Rust client does.
    leader: Option<Arc<NodeRoute>>,
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
        leader: Option<Arc<NodeRoute>>,
    ) -> anyhow::Result<Self> {
        let endpoints = |bases: &[String]| {
            bases
                .iter()
                .map(|b| Endpoint::new(b, connections, timeout))
                .collect::<anyhow::Result<Vec<_>>>()
        };
        Ok(FencegateClient {
            nodes: endpoints(nodes)?,
            proxies: endpoints(proxies)?,
            next: AtomicUsize::new(0),
            leader,
            retries,
            epoch: Instant::now(),
        })
    }

    pub fn has_proxies(&self) -> bool {
        !self.proxies.is_empty()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The node for attempt `n` of a call: round robin (or the leader), skipping nodes that
    /// refused a connection recently; a retry moves to the next node.
    fn pick(&self, eps: &[Endpoint], start: usize, n: u32) -> usize {
        let now = self.now_ms();
        let first = start + n as usize;
        (first..first + eps.len())
            .map(|i| i % eps.len())
            .find(|&i| eps[i].down_until_ms.load(Ordering::Relaxed) <= now)
            .unwrap_or(first % eps.len())
    }

    fn start_index(&self, eps: &[Endpoint]) -> usize {
        match &self.leader {
            Some(route) if eps.len() == self.nodes.len() => route.current(),
            _ => self.next.fetch_add(1, Ordering::Relaxed) % eps.len(),
        }
    }

    /// One request: the answer's status and body (or the code of a transport failure), and
    /// when it went out (after the permit). `node` is the position of a lock API node, whose
    /// answers move the leader route.
    async fn attempt(
        &self,
        ep: &Endpoint,
        node: Option<usize>,
        req: Option<Outgoing>,
    ) -> (Result<(u16, Bytes), String>, Sent) {
        // Waiting for a permit is part of the client-visible latency, like waiting for a
        // free connection in any pooled client.
        let (_permit, sent) = connection(&ep.permits).await;
        let Some(req) = req else {
            return (Err("bad_request_target".to_string()), sent);
        };
        let answer = match ep.pool.send(req).await {
            Ok(answer) => {
                if let (Some(route), Some(i)) = (&self.leader, node) {
                    route.learn(i, &answer.headers);
                }
                Ok((answer.status, answer.body))
            }
            Err(SendError::Connect) => {
                ep.down_until_ms
                    .store(self.now_ms() + 500, Ordering::Relaxed);
                Err("connect_error".to_string())
            }
            Err(SendError::Timeout) => Err("client_timeout".to_string()),
            Err(SendError::Transport) => Err("transport_error".to_string()),
        };
        (answer, sent)
    }

    /// A lock call, retried on uncertain outcomes on the next node.
    async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Call<T> {
        // Serialising the wire types cannot fail; an empty body would be answered 400.
        let body = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
        let mut first: Option<Sent> = None;
        let mut errors = Vec::new();
        let start = self.start_index(&self.nodes);
        let mut n = 0;
        loop {
            let i = self.pick(&self.nodes, start, n);
            let ep = &self.nodes[i];
            let req = ep.pool.post_json(path, body.clone());
            let (answer, sent) = self.attempt(ep, Some(i), req).await;
            if let (Some(route), Err(_)) = (&self.leader, &answer) {
                route.failed(i);
            }
            let first = *first.get_or_insert(sent);
            let last_send = sent.at;
            let answered = Instant::now();
            let attempt = match answer {
                Ok((status, body)) => Attempt::of_answer(status, &body),
                Err(code) => Attempt::Uncertain(code),
            };
            let (failure, last) = match attempt {
                Attempt::Ok(v) => {
                    return Call {
                        result: Ok(v),
                        errors,
                        first_send: first.at,
                        connection_wait: first.connection_wait,
                        last_send,
                        answered,
                    };
                }
                Attempt::Definite(code) => (
                    Failure {
                        code,
                        definite: true,
                    },
                    true,
                ),
                Attempt::Garbled => (
                    Failure {
                        code: BAD_RESPONSE.into(),
                        definite: false,
                    },
                    true,
                ),
                Attempt::Uncertain(code) => (
                    Failure {
                        code,
                        definite: false,
                    },
                    n >= self.retries,
                ),
            };
            errors.push(failure.code.clone());
            if last {
                return Call {
                    result: Err(failure),
                    errors,
                    first_send: first.at,
                    connection_wait: first.connection_wait,
                    last_send,
                    answered,
                };
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(25u64 << n.min(5))).await;
        }
    }

    pub async fn acquire(
        &self,
        resource: u32,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Call<Grant> {
        let path = format!("/v1/locks/{}/acquire", resource_name(resource));
        let body = AcquireRequest {
            request_id: request_id.to_string(),
            holder: Some("loadtest".into()),
            ttl_ms: Some(ttl_ms),
            wait_timeout_ms: (wait_ms > 0).then_some(wait_ms),
        };
        self.post::<AcquireResponse>(&path, &body)
            .await
            .map(|a| Grant {
                lease: Lease::Fencegate(a.lease_id),
                token: a.fencing_token,
            })
    }

    pub async fn renew(&self, resource: u32, grant: &Grant) -> Call<bool> {
        let path = format!("/v1/locks/{}/renew", resource_name(resource));
        let call = self
            .post::<RenewResponse>(&path, &lease_request(grant))
            .await
            .map(|_| true);
        lease_gone_is_false(call)
    }

    pub async fn release(&self, resource: u32, grant: &Grant) -> Call<bool> {
        let path = format!("/v1/locks/{}/release", resource_name(resource));
        self.post::<ReleaseResponse>(&path, &lease_request(grant))
            .await
            .map(|r| r.released)
    }

    /// A fenced write through a proxy: not retried, and whatever the proxy or the upstream
    /// answers other than 2xx is final.
    pub async fn write(&self, resource: u32, grant: &Grant) -> Call<()> {
        let start = self.start_index(&self.proxies);
        let ep = &self.proxies[self.pick(&self.proxies, start, 0)];
        let req = HeaderName::from_bytes(FENCE_TOKEN_HEADER.as_bytes())
            .ok()
            .and_then(|name| {
                ep.pool.request(
                    Method::PUT,
                    &format!("/kv/lt{resource}"),
                    [(name, HeaderValue::from(grant.token))],
                    Bytes::from(format!("written with token {}", grant.token)),
                )
            });
        let (answer, sent) = self.attempt(ep, None, req).await;
        let result = match answer {
            // The upstream's success body is the upstream's business.
            Ok((status, _)) if (200..300).contains(&status) => Ok(()),
            Ok((status, body)) => Err(ErrorBody::from_answer(status, &body).error.to_string()),
            Err(code) => Err(code),
        };
        let result = result.map_err(|code| Failure {
            code,
            definite: true,
        });
        Call::single(result, sent)
    }
}

fn lease_request(grant: &Grant) -> LeaseRequest {
    let lease_id = match &grant.lease {
        Lease::Fencegate(id) => Some(*id),
        // Not a fencegate lease: the node answers invalid_request.
        Lease::Etcd { .. } => None,
    };
    LeaseRequest { lease_id }
}

/// Turns the definite "lease is gone" answer into Ok(false) (it is an answer, not an error).
fn lease_gone_is_false(mut call: Call<bool>) -> Call<bool> {
    let lost = ErrorCode::LeaseLost.as_str();
    if matches!(&call.result, Err(f) if f.definite && f.code == lost) {
        call.result = Ok(false);
        call.errors.pop();
    }
    call
}
