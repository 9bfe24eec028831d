//! Helpers of the API tests: exact-shape assertions on answers, polls on a lock's state, long-poll
//! requests in their own tasks, and readers of `/metrics` and `/v1/cluster`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_core::testkit::TestCluster;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// The key set of a JSON object.
pub fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not a JSON object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

pub fn set<'a>(names: &[&'a str]) -> BTreeSet<&'a str> {
    names.iter().copied().collect()
}

/// The API contract: errors are always `{"error": "<code>", "message": "<human text>"}` with the
/// status of the table; `extra` names the additional fields a code carries.
#[track_caller]
pub fn assert_error(got: &(u16, Value), status: u16, code: &str, extra: &[&str]) {
    let (s, body) = got;
    assert_eq!(*s, status, "expected {status} {code}, got {s} {body}");
    assert_eq!(body["error"], code, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| !m.trim().is_empty()),
        "error without a message: {body}"
    );
    let mut want = set(&["error", "message"]);
    want.extend(extra);
    assert_eq!(keys(body), want, "error body fields: {body}");
}

/// The API contract: the 200 body of an acquire has exactly these fields.
#[track_caller]
pub fn assert_grant(got: &(u16, Value), resource: &str, ttl_ms: u64) -> (String, u64) {
    let (s, g) = got;
    assert_eq!(*s, 200, "{g}");
    assert_eq!(
        keys(g),
        set(&[
            "resource",
            "lease_id",
            "fencing_token",
            "ttl_ms",
            "expires_at_ms"
        ]),
        "{g}"
    );
    assert_eq!(g["resource"], resource);
    assert_eq!(g["ttl_ms"].as_u64(), Some(ttl_ms));
    assert!(g["expires_at_ms"].as_u64().is_some_and(|e| e > 0), "{g}");
    let lease = g["lease_id"].as_str().expect("lease_id").to_string();
    // Lease ids are unguessable: at least 128 bits of randomness — 32 hex digits.
    assert_eq!(lease.len(), 32, "{g}");
    assert!(lease.bytes().all(|b| b.is_ascii_hexdigit()), "{g}");
    let token = g["fencing_token"].as_u64().expect("fencing_token");
    assert!(token > 0);
    (lease, token)
}

pub fn lock_path(resource: &str, action: &str) -> String {
    format!("/v1/locks/{resource}/{action}")
}

/// A lease id nobody was ever given.
pub fn random_lease_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Polls the linearizable `GET /v1/locks/{resource}` on `node` until `pred` holds.
pub async fn wait_for_lock(
    c: &TestCluster,
    node: u64,
    resource: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, v) = c.get(node, &format!("/v1/locks/{resource}")).await;
        assert_eq!(s, 200, "{v}");
        if pred(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{resource}: never saw {what}; last {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn wait_waiters(c: &TestCluster, node: u64, resource: &str, n: u64) -> Value {
    wait_for_lock(c, node, resource, &format!("{n} waiters"), |v| {
        v["waiters"].as_u64() == Some(n)
    })
    .await
}

/// A POST from its own task and client, so it can stay pending (a long-poll waiter) while
/// the test makes other calls, and so the test can cut its connection.
pub fn spawn_post(
    url: String,
    body: Value,
    timeout: Duration,
) -> JoinHandle<reqwest::Result<(u16, Value)>> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder().timeout(timeout).build()?;
        let resp = client.post(url).json(&body).send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().await.unwrap_or(Value::Null)))
    })
}

/// A waiting acquire (`wait_timeout_ms > 0`) sent to `node` in a spawned task.
pub fn spawn_waiter(
    c: &TestCluster,
    node: u64,
    resource: &str,
    request_id: &str,
    wait_timeout_ms: u64,
) -> JoinHandle<reqwest::Result<(u16, Value)>> {
    spawn_post(
        c.url(node, &lock_path(resource, "acquire")),
        json!({ "request_id": request_id, "ttl_ms": 30_000, "wait_timeout_ms": wait_timeout_ms }),
        Duration::from_secs(30),
    )
}

/// The answer of a spawned request, which must arrive within 10 s.
pub async fn answer(h: JoinHandle<reqwest::Result<(u16, Value)>>) -> (u16, Value) {
    tokio::time::timeout(Duration::from_secs(10), h)
        .await
        .expect("spawned request did not finish")
        .expect("spawned task panicked")
        .expect("spawned request failed")
}

pub async fn metrics(c: &TestCluster, node: u64) -> String {
    let (s, v) = c.get(node, "/metrics").await;
    assert_eq!(s, 200);
    v.as_str().expect("metrics are text").to_string()
}

/// The value of one sample (`name{labels}`) in Prometheus text, 0 if absent (a labelled
/// counter only appears once it was touched).
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("bad sample line {l}"))
        })
        .sum()
}

pub async fn cluster_status(c: &TestCluster, node: u64) -> Value {
    let (s, v) = c.get(node, "/v1/cluster").await;
    assert_eq!(s, 200, "{v}");
    v
}

pub fn voters(status: &Value) -> BTreeSet<u64> {
    status["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["voter"] == true)
        .map(|m| m["id"].as_u64().expect("member id"))
        .collect()
}

/// `POST /v1/locks/{resource}/release` with `lease` on `node`.
pub async fn release(c: &TestCluster, node: u64, resource: &str, lease: &str) -> (u16, Value) {
    c.post(
        node,
        &lock_path(resource, "release"),
        json!({ "lease_id": lease }),
    )
    .await
}

/// `POST /v1/locks/{resource}/renew` with `lease` on `node`.
pub async fn renew(c: &TestCluster, node: u64, resource: &str, lease: &str) -> (u16, Value) {
    c.post(
        node,
        &lock_path(resource, "renew"),
        json!({ "lease_id": lease }),
    )
    .await
}

/// Asserts that node `node` reads `resource` as neither held nor waited on.
pub async fn assert_free(c: &TestCluster, node: u64, resource: &str) {
    let (s, v) = c.get(node, &format!("/v1/locks/{resource}")).await;
    assert_eq!(s, 200);
    assert_eq!(
        (&v["held"], &v["waiters"]),
        (&json!(false), &json!(0)),
        "{v}"
    );
}
