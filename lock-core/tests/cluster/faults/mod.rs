//! The invariants under faults, on real 3-node clusters: leader kills, partitions, clock skew,
//! whole-cluster restarts and follower catch-up (log replay and snapshot install).
//!
//! Each test names the invariant it checks. Waits poll observable state with deadlines; the only
//! sleeps are "until wall-clock time T", where the passage of time itself is what a test is
//! about (lease expiry).

mod clock;
mod failover;
mod leader_kill;
mod lost_data;
mod partition;
mod restart;
mod restore;

use std::time::{Duration, Instant};

use lock_core::testkit::{ApiClient, TestCluster};
use serde_json::{json, Value};

/// Deadline for elections, catch-up and similar events (generous: CI machines are slow).
pub const EVENT: Duration = Duration::from_secs(15);

/// A granted lease as a client saw it in a 200 acquire answer.
#[derive(Clone, Debug)]
pub struct Granted {
    pub resource: String,
    pub lease_id: String,
    pub token: u64,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
}

impl Granted {
    pub fn parse(v: &Value) -> Self {
        let field = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
        Granted {
            resource: v["resource"].as_str().expect("resource").to_string(),
            lease_id: v["lease_id"].as_str().expect("lease_id").to_string(),
            token: field("fencing_token"),
            ttl_ms: field("ttl_ms"),
            expires_at_ms: field("expires_at_ms"),
        }
    }

    /// Log time at which the lease was granted: grants expire at `now + ttl`. A retried
    /// acquire reports the current (possibly failover-extended) expiry, which only moves this
    /// later, so checks built on it can miss an overlap but never invent one.
    pub fn granted_at_ms(&self) -> u64 {
        self.expires_at_ms - self.ttl_ms
    }
}

/// Acquires on node `id`, retrying with the *same* request id while the cluster answers 503
/// (election in progress). Returns the first definitive answer.
pub async fn acquire_answered(
    c: &TestCluster,
    id: u64,
    resource: &str,
    request_id: &str,
    ttl_ms: u64,
) -> (u16, Value) {
    let deadline = Instant::now() + EVENT;
    loop {
        let (s, v) = c.acquire(id, resource, request_id, ttl_ms).await;
        if s != 503 || Instant::now() > deadline {
            return (s, v);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One client's acquire, retried with the same request id on the next node while the answer
/// is a transport error (crashed node) or 503. Returns the definitive 200 or 409.
pub async fn stream_acquire(
    api: &ApiClient,
    first: u64,
    resource: &str,
    request_id: &str,
    ttl_ms: u64,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = json!({ "request_id": request_id, "ttl_ms": ttl_ms });
    let path = format!("/v1/locks/{resource}/acquire");
    let n = api.addrs.len() as u64;
    for attempt in 0.. {
        let id = (first - 1 + attempt) % n + 1;
        match api.post(id, &path, body.clone()).await {
            Ok((s @ (200 | 409), v)) => return (s, v),
            Ok((503, _)) | Err(_) => {}
            Ok((s, v)) => panic!("acquire {request_id} on node {id}: {s} {v}"),
        }
        assert!(
            Instant::now() < deadline,
            "acquire {request_id} got no answer within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!()
}

/// The lease node `id`'s replicated state records for `resource`: (lease_id, token, expiry).
pub fn recorded_lease(c: &TestCluster, id: u64, resource: &str) -> Option<(String, u64, u64)> {
    c.node(id).node.machine.read(|m| {
        m.lease(resource)
            .map(|l| (l.lease_id.to_string(), l.fencing_token, l.expires_at_ms))
    })
}

pub fn machine_last_token(c: &TestCluster, id: u64) -> u64 {
    c.node(id).node.machine.read(|m| m.last_token())
}
