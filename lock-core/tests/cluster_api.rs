//! SPEC §4 on a real 3-node cluster: every call of the table, on leader and followers.
//!
//! Each test starts its own cluster (real raft over TCP, real fjall in a temp dir, real HTTP)
//! and reads as linear phases. Comments name the SPEC rule each phase checks. Where a test
//! has to wait for something (an expiry, a waiter joining a queue) it polls the linearizable
//! `GET /v1/locks/{resource}` for the event instead of sleeping a fixed time.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_core::testkit::{phase, TestCluster};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

// ---- helpers ----------------------------------------------------------------------------

/// The key set of a JSON object.
fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not a JSON object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

fn set<'a>(names: &[&'a str]) -> BTreeSet<&'a str> {
    names.iter().copied().collect()
}

/// SPEC §4: errors are always `{"error": "<code>", "message": "<human text>"}` with the
/// status of the table; `extra` names the additional fields a code carries.
#[track_caller]
fn assert_error(got: &(u16, Value), status: u16, code: &str, extra: &[&str]) {
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

/// SPEC §4: the 200 body of an acquire has exactly these fields.
#[track_caller]
fn assert_grant(got: &(u16, Value), resource: &str, ttl_ms: u64) -> (String, u64) {
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
    // SPEC §4: at least 128 bits of randomness — 32 hex digits.
    assert_eq!(lease.len(), 32, "{g}");
    assert!(lease.bytes().all(|b| b.is_ascii_hexdigit()), "{g}");
    let token = g["fencing_token"].as_u64().expect("fencing_token");
    assert!(token > 0);
    (lease, token)
}

fn lock_path(resource: &str, action: &str) -> String {
    format!("/v1/locks/{resource}/{action}")
}

/// A lease id nobody was ever given.
fn random_lease_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Polls the linearizable `GET /v1/locks/{resource}` on `node` until `pred` holds.
async fn wait_for_lock(
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

async fn wait_waiters(c: &TestCluster, node: u64, resource: &str, n: u64) -> Value {
    wait_for_lock(c, node, resource, &format!("{n} waiters"), |v| {
        v["waiters"].as_u64() == Some(n)
    })
    .await
}

/// A POST from its own task and client, so it can stay pending (a long-poll waiter) while
/// the test makes other calls, and so the test can cut its connection.
fn spawn_post(
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
fn spawn_waiter(
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
async fn answer(h: JoinHandle<reqwest::Result<(u16, Value)>>) -> (u16, Value) {
    tokio::time::timeout(Duration::from_secs(10), h)
        .await
        .expect("spawned request did not finish")
        .expect("spawned task panicked")
        .expect("spawned request failed")
}

async fn metrics(c: &TestCluster, node: u64) -> String {
    let (s, v) = c.get(node, "/metrics").await;
    assert_eq!(s, 200);
    v.as_str().expect("metrics are text").to_string()
}

/// The value of one sample (`name{labels}`) in Prometheus text, 0 if absent (a labelled
/// counter only appears once it was touched).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
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

async fn cluster_status(c: &TestCluster, node: u64) -> Value {
    let (s, v) = c.get(node, "/v1/cluster").await;
    assert_eq!(s, 200, "{v}");
    v
}

/// Polls `GET /v1/cluster` on `node` (a status page, not linearizable) until it names the
/// leader and has applied something: a follower that has not yet heard from the leader shows
/// no membership, and one that has not applied an entry yet shows `last_applied: null`.
async fn wait_cluster_status(c: &TestCluster, node: u64, leader: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = cluster_status(c, node).await;
        if v["leader_id"].as_u64() == Some(leader) && v["last_applied"].is_u64() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} never saw leader {leader}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `GET /v1/cluster` on `node` until its voters are `want` (openraft publishes a
/// membership change to its metrics asynchronously).
async fn wait_voters(c: &TestCluster, node: u64, want: &[u64]) -> Value {
    let want: BTreeSet<u64> = want.iter().copied().collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = cluster_status(c, node).await;
        if voters(&v) == want {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} never showed voters {want:?}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn voters(status: &Value) -> BTreeSet<u64> {
    status["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["voter"] == true)
        .map(|m| m["id"].as_u64().expect("member id"))
        .collect()
}

// ---- acquire / renew / release round trip -----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_through_any_node() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(std::time::Duration::from_secs(5)).await;
    let follower = c.followers(leader)[0];

    phase("acquire on a follower is forwarded and granted");
    let (s, a) = c.acquire(follower, "kv:one", "req-1", 5_000).await;
    assert_eq!(s, 200, "{a}");
    let lease = a["lease_id"].as_str().unwrap().to_string();
    let token = a["fencing_token"].as_u64().unwrap();
    assert_eq!(lease.len(), 32);

    phase("a second acquire is refused with lock_held");
    let (s, b) = c.acquire(leader, "kv:one", "req-2", 5_000).await;
    assert_eq!(s, 409, "{b}");
    assert_eq!(b["error"], "lock_held");
    assert!(b["retry_after_ms"].as_u64().unwrap() <= 5_000);

    phase("renew keeps the token");
    let (s, r) = c
        .post(
            leader,
            "/v1/locks/kv:one/renew",
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["fencing_token"].as_u64().unwrap(), token);

    phase("linearizable read on the other follower shows the holder, never the lease id");
    let other = c.followers(leader)[1];
    let (s, g) = c.get(other, "/v1/locks/kv:one").await;
    assert_eq!(s, 200);
    assert_eq!(g["held"], true);
    assert_eq!(g["fencing_token"].as_u64().unwrap(), token);
    assert!(!g.to_string().contains(&lease));

    phase("release, then the next acquire gets a larger token");
    let (s, r) = c
        .post(
            other,
            "/v1/locks/kv:one/release",
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, r["released"].as_bool()), (200, Some(true)));
    let (s, r) = c
        .post(
            other,
            "/v1/locks/kv:one/release",
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!(
        (s, r["released"].as_bool()),
        (200, Some(false)),
        "release is idempotent"
    );
    let (s, b) = c.acquire(follower, "kv:one", "req-3", 5_000).await;
    assert_eq!(s, 200, "{b}");
    assert!(b["fencing_token"].as_u64().unwrap() > token);
    c.shutdown().await;
}

// ---- acquire ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_grants_exact_fields_and_refuses_a_held_lock() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase(
        "§4 acquire: 200 carries exactly resource, lease_id, fencing_token, ttl_ms, expires_at_ms",
    );
    let got = c
        .post(
            f[0],
            &lock_path("acq:a", "acquire"),
            json!({ "request_id": "acq-1", "holder": "worker-7", "ttl_ms": 20_000 }),
        )
        .await;
    let (lease, token) = assert_grant(&got, "acq:a", 20_000);

    phase("§4 acquire: ttl_ms defaults to 30000 and wait_timeout_ms to 0 (try once)");
    let got = c
        .post(
            leader,
            &lock_path("acq:b", "acquire"),
            json!({ "request_id": "acq-2" }),
        )
        .await;
    let (_, token_b) = assert_grant(&got, "acq:b", 30_000);
    // §3.2: one global counter, across resources.
    assert!(token_b > token);

    phase("§4 acquire: a held lock answers 409 lock_held with retry_after_ms within the TTL");
    let got = c.acquire(f[1], "acq:a", "acq-3", 5_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    // A positive retry_after_ms is the holder's remaining time: the refusal came from the
    // try-once path (wait_timeout_ms 0), not from a wait that timed out (which says 0).
    let retry = got.1["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(retry > 0 && retry <= 20_000, "retry_after_ms {retry}");

    phase("§3.1: the refused acquire left the original holder in place");
    let v = wait_for_lock(&c, leader, "acq:a", "held", |v| v["held"] == true).await;
    assert_eq!(v["holder"], "worker-7");
    assert_eq!(v["fencing_token"].as_u64(), Some(token));
    assert!(!v.to_string().contains(&lease));

    phase("§4 policy bounds are inclusive: ttl 1000 and 300000 are accepted");
    let got = c.acquire(f[0], "acq:min", "acq-min", 1_000).await;
    assert_grant(&got, "acq:min", 1_000);
    let got = c.acquire(f[1], "acq:max", "acq-max", 300_000).await;
    assert_grant(&got, "acq:max", 300_000);

    phase("§4 request_id and holder of exactly 128 chars are accepted");
    let id128 = "r".repeat(128);
    let got = c
        .post(
            leader,
            &lock_path("acq:long", "acquire"),
            json!({ "request_id": id128, "holder": "h".repeat(128), "ttl_ms": 5_000 }),
        )
        .await;
    assert_grant(&got, "acq:long", 5_000);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_rejects_bad_input_with_a_clear_400() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader)[0];
    let path = lock_path("bad:input", "acquire");

    phase("§4: bad bodies get 400 invalid_request with {error, message} — on a follower");
    let cases: Vec<(&str, Value)> = vec![
        ("missing request_id", json!({ "ttl_ms": 5_000 })),
        ("empty request_id", json!({ "request_id": "" })),
        (
            "129-char request_id",
            json!({ "request_id": "r".repeat(129) }),
        ),
        ("null request_id", json!({ "request_id": null })),
        ("numeric request_id", json!({ "request_id": 7 })),
        (
            "129-char holder",
            json!({ "request_id": "b-1", "holder": "h".repeat(129) }),
        ),
        (
            "ttl below policy min",
            json!({ "request_id": "b-2", "ttl_ms": 999 }),
        ),
        (
            "ttl above policy max",
            json!({ "request_id": "b-3", "ttl_ms": 300_001 }),
        ),
        ("ttl zero", json!({ "request_id": "b-4", "ttl_ms": 0 })),
        ("negative ttl", json!({ "request_id": "b-5", "ttl_ms": -1 })),
        (
            "string ttl",
            json!({ "request_id": "b-6", "ttl_ms": "5000" }),
        ),
        (
            "wait_timeout above policy max",
            json!({ "request_id": "b-7", "wait_timeout_ms": 300_001 }),
        ),
        (
            "unknown field",
            json!({ "request_id": "b-8", "ttl": 5_000 }),
        ),
        ("array body", json!(["b-9"])),
    ];
    for (what, body) in cases {
        let got = c.post(f, &path, body).await;
        eprintln!("  {what}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("§4: bodies that are not JSON get 400 too");
    for raw in ["not json", "{", "{\"request_id\": \"b-10\",}", ""] {
        let got = c.post_raw(leader, &path, raw).await;
        eprintln!("  {raw:?}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("§4 resource: anything outside 1–256 bytes of [A-Za-z0-9._:/-] is 400");
    let long = "r".repeat(257);
    let bad_resources = [
        "a%20b",       // space
        long.as_str(), // 257 bytes
        "",            // empty: /v1/locks//acquire
        "caf%C3%A9",   // unicode (é), URL-encoded
        "%E3%83%AD%E3%83%83%E3%82%AF",
        "a%3Fb", // '?'
        "a%25b", // '%'
        "a%2Cb", // ','
    ];
    for r in bad_resources {
        let got = c
            .post(
                f,
                &lock_path(r, "acquire"),
                json!({ "request_id": "b-11", "ttl_ms": 5_000 }),
            )
            .await;
        eprintln!("  resource {r:?}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }
    let got = c.get(f, &format!("/v1/locks/{long}")).await;
    assert_error(&got, 400, "invalid_request", &[]);

    phase("§4: a path that is not UTF-8 after decoding is a JSON 400, not a plain-text one");
    let got = c
        .post(f, "/v1/locks/%FF/acquire", json!({ "request_id": "b-13" }))
        .await;
    assert_error(&got, 400, "invalid_request", &[]);
    let got = c.get(leader, "/v1/locks/%FF").await;
    assert_error(&got, 400, "invalid_request", &[]);

    phase("an oversized body is refused with a JSON 413");
    let huge = format!("{{\"request_id\": \"{}\"}}", "x".repeat(3 << 20));
    let got = c.post_raw(f, &path, &huge).await;
    assert_error(&got, 413, "payload_too_large", &[]);

    phase("§4: no partial write — the rejected acquires left no trace");
    let (s, v) = c.get(leader, "/v1/locks/bad:input").await;
    assert_eq!(s, 200);
    assert_eq!(v["held"], false, "{v}");
    assert_eq!(v["fencing_token"], Value::Null, "{v}");
    let (s, v) = c.get(leader, "/v1/locks?prefix=").await;
    assert_eq!(s, 200);
    assert_eq!(v["locks"], json!([]), "{v}");

    phase("§4 resource: 256 bytes of the full alphabet are accepted");
    let alphabet = "AZaz09._:-/";
    let ok = format!("{alphabet}{}", "x".repeat(256 - alphabet.len()));
    assert_eq!(ok.len(), 256);
    let got = c.acquire(f, &ok, "b-12", 5_000).await;
    assert_grant(&got, &ok, 5_000);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_with_slashes_work_raw_and_percent_encoded() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("§4 resource may contain '/': a raw path acquires 'app/db/primary'");
    let got = c.acquire(f[0], "app/db/primary", "slash-1", 10_000).await;
    let (lease, token) = assert_grant(&got, "app/db/primary", 10_000);

    phase("§4 the %2F-encoded name is the same resource: it is held");
    let got = c
        .acquire(f[1], "app%2Fdb%2Fprimary", "slash-2", 10_000)
        .await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);

    phase("GET works with both spellings and names the decoded resource");
    for spelling in ["app/db/primary", "app%2Fdb%2Fprimary"] {
        let (s, v) = c.get(leader, &format!("/v1/locks/{spelling}")).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["resource"], "app/db/primary");
        assert_eq!(v["held"], true);
        assert_eq!(v["fencing_token"].as_u64(), Some(token));
    }

    phase("renew and release through the encoded spelling");
    let (s, r) = c
        .post(
            f[1],
            &lock_path("app%2Fdb%2Fprimary", "renew"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["fencing_token"].as_u64(), Some(token));
    let (s, r) = c
        .post(
            leader,
            &lock_path("app%2Fdb%2Fprimary", "release"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));

    phase("a resource whose last segment is an action name is still addressable");
    let got = c.acquire(f[0], "jobs/acquire", "slash-3", 5_000).await;
    assert_grant(&got, "jobs/acquire", 5_000);
    let (s, v) = c.get(leader, "/v1/locks/jobs/acquire").await;
    assert_eq!((s, &v["held"]), (200, &json!(true)), "{v}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_queue_is_bounded_with_too_many_waiters() {
    let policy = lock_core::node::Policy {
        max_waiters_per_resource: 2,
        ..Default::default()
    };
    let c = TestCluster::start_with(3, policy).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("hold the lock and fill its queue (policy: 2 waiters per resource)");
    let got = c.acquire(leader, "busy:q", "holder", 30_000).await;
    let (lease, _) = assert_grant(&got, "busy:q", 30_000);
    let w1 = spawn_waiter(&c, f[0], "busy:q", "w-1", 20_000);
    wait_waiters(&c, leader, "busy:q", 1).await;
    let w2 = spawn_waiter(&c, f[1], "busy:q", "w-2", 20_000);
    wait_waiters(&c, leader, "busy:q", 2).await;

    phase("§4: a third waiter gets 429 too_many_waiters and is not queued");
    let got = c
        .post(
            f[0],
            &lock_path("busy:q", "acquire"),
            json!({ "request_id": "w-3", "wait_timeout_ms": 5_000 }),
        )
        .await;
    assert_error(&got, 429, "too_many_waiters", &[]);
    let v = wait_waiters(&c, leader, "busy:q", 2).await;
    assert_eq!(v["waiters"], 2);

    phase("a try-once acquire on the full queue is still a plain 409 lock_held");
    let got = c.acquire(f[1], "busy:q", "w-4", 5_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);

    phase("the bound is per resource: another resource still queues");
    let got = c.acquire(leader, "busy:other", "holder-2", 30_000).await;
    let (lease2, _) = assert_grant(&got, "busy:other", 30_000);
    let w5 = spawn_waiter(&c, f[0], "busy:other", "w-5", 20_000);
    wait_waiters(&c, leader, "busy:other", 1).await;

    phase("releasing hands off to w-1, which frees a queue slot for a new waiter");
    let (s, r) = c
        .post(
            leader,
            &lock_path("busy:q", "release"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let (lease_w1, _) = assert_grant(&answer(w1).await, "busy:q", 30_000);
    let w6 = spawn_waiter(&c, f[1], "busy:q", "w-6", 20_000);
    wait_waiters(&c, leader, "busy:q", 2).await;

    phase("clean up: cancel the remaining waiters so shutdown has no long polls");
    for (res, rid) in [("busy:q", "w-2"), ("busy:q", "w-6"), ("busy:other", "w-5")] {
        let (s, r) = c
            .post(
                leader,
                &lock_path(res, "cancel"),
                json!({ "request_id": rid }),
            )
            .await;
        assert_eq!((s, r), (200, json!({ "cancelled": true })), "{rid}");
    }
    for h in [w2, w5, w6] {
        assert_error(&answer(h).await, 409, "lock_held", &["retry_after_ms"]);
    }
    let (s, _) = c
        .post(
            leader,
            &lock_path("busy:q", "release"),
            json!({ "lease_id": lease_w1 }),
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = c
        .post(
            leader,
            &lock_path("busy:other", "release"),
            json!({ "lease_id": lease2 }),
        )
        .await;
    assert_eq!(s, 200);
    c.shutdown().await;
}

// ---- renew ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_extends_only_the_current_lease() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("§4 renew: 200 carries exactly lease_id, fencing_token, ttl_ms, expires_at_ms");
    let got = c.acquire(f[0], "ren:a", "ren-1", 5_000).await;
    let (lease, token) = assert_grant(&got, "ren:a", 5_000);
    let first_expiry = got.1["expires_at_ms"].as_u64().unwrap();
    let (s, r) = c
        .post(
            f[1],
            &lock_path("ren:a", "renew"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        keys(&r),
        set(&["lease_id", "fencing_token", "ttl_ms", "expires_at_ms"]),
        "{r}"
    );
    assert_eq!(r["lease_id"], lease.as_str());
    // §3.2: renewal keeps the token; §3.7: it never shortens the lease.
    assert_eq!(r["fencing_token"].as_u64(), Some(token));
    assert_eq!(r["ttl_ms"].as_u64(), Some(5_000));
    assert!(r["expires_at_ms"].as_u64().unwrap() >= first_expiry, "{r}");

    phase("§3.4: a random 32-hex lease id cannot renew — held or unknown resource");
    for res in ["ren:a", "ren:never-used"] {
        let got = c
            .post(
                leader,
                &lock_path(res, "renew"),
                json!({ "lease_id": random_lease_id() }),
            )
            .await;
        assert_error(&got, 409, "lease_lost", &[]);
    }
    phase("§3.4: the right lease id on the wrong resource cannot renew");
    let got = c
        .post(
            leader,
            &lock_path("ren:other", "renew"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_error(&got, 409, "lease_lost", &[]);

    phase("§4: a malformed lease_id is 400 invalid_request");
    let malformed = [
        json!({}),
        json!({ "lease_id": "" }),
        json!({ "lease_id": "not-a-lease" }),
        json!({ "lease_id": "0".repeat(31) }),
        json!({ "lease_id": "0".repeat(33) }),
        json!({ "lease_id": "g".repeat(32) }),
        json!({ "lease_id": 12345 }),
        json!({ "lease_id": lease, "ttl_ms": 1_000 }),
    ];
    for body in malformed {
        let got = c
            .post(f[0], &lock_path("ren:a", "renew"), body.clone())
            .await;
        eprintln!("  {body}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("§3.4: a released lease cannot renew");
    let (s, r) = c
        .post(
            f[1],
            &lock_path("ren:a", "release"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let got = c
        .post(
            f[0],
            &lock_path("ren:a", "renew"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_error(&got, 409, "lease_lost", &[]);

    phase("§3.7: a lease of the minimum TTL expires on the server; then renew is lease_lost");
    let expirations_before = sample(
        &metrics(&c, leader).await,
        "fencegate_lease_expirations_total",
        &[],
    );
    let got = c.acquire(f[0], "ren:short", "ren-2", 1_000).await;
    let (short, short_token) = assert_grant(&got, "ren:short", 1_000);
    let v = wait_for_lock(&c, leader, "ren:short", "expiry", |v| v["held"] == false).await;
    // The record keeps the last token for readers (and the proxy) after expiry.
    assert_eq!(v["fencing_token"].as_u64(), Some(short_token), "{v}");
    assert_eq!(v["holder"], Value::Null);
    let got = c
        .post(
            f[1],
            &lock_path("ren:short", "renew"),
            json!({ "lease_id": short }),
        )
        .await;
    assert_error(&got, 409, "lease_lost", &[]);

    phase("§6: the expiry was counted (committed expiry, applied on the leader)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(
        &metrics(&c, leader).await,
        "fencegate_lease_expirations_total",
        &[],
    ) <= expirations_before
    {
        assert!(Instant::now() < deadline, "expiration never counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.shutdown().await;
}

// ---- release ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_release_never_removes_the_new_holder() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("A holds a short lease; a release with someone else's id is {released:false}");
    let got = c.acquire(f[0], "rel:a", "rel-A", 1_000).await;
    let (lease_a, token_a) = assert_grant(&got, "rel:a", 1_000);
    let (s, r) = c
        .post(
            leader,
            &lock_path("rel:a", "release"),
            json!({ "lease_id": random_lease_id() }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": false })));

    phase("A pauses past its lease: wait for the server to expire it");
    wait_for_lock(&c, leader, "rel:a", "expiry of A", |v| v["held"] == false).await;

    phase("B acquires with a larger token (§3.2)");
    let got = c.acquire(f[1], "rel:a", "rel-B", 30_000).await;
    let (lease_b, token_b) = assert_grant(&got, "rel:a", 30_000);
    assert!(token_b > token_a);

    phase("§3.4: A's stale release is {released:false} and B still holds the lock");
    let (s, r) = c
        .post(
            f[0],
            &lock_path("rel:a", "release"),
            json!({ "lease_id": lease_a }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": false })));
    let (s, v) = c.get(f[0], "/v1/locks/rel:a").await;
    assert_eq!(s, 200);
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["fencing_token"].as_u64(), Some(token_b), "{v}");
    let (s, r) = c
        .post(
            leader,
            &lock_path("rel:a", "renew"),
            json!({ "lease_id": lease_b }),
        )
        .await;
    assert_eq!(s, 200, "B can still renew: {r}");

    phase("§3.4: B's release works once and is idempotent after");
    let (s, r) = c
        .post(
            f[1],
            &lock_path("rel:a", "release"),
            json!({ "lease_id": lease_b }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let (s, r) = c
        .post(
            f[0],
            &lock_path("rel:a", "release"),
            json!({ "lease_id": lease_b }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": false })));
    let (s, v) = c.get(leader, "/v1/locks/rel:a").await;
    assert_eq!((s, &v["held"]), (200, &json!(false)), "{v}");

    phase("§4: release of a never-used resource is {released:false}; a malformed id is 400");
    let (s, r) = c
        .post(
            leader,
            &lock_path("rel:none", "release"),
            json!({ "lease_id": lease_b }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": false })));
    let got = c
        .post(
            leader,
            &lock_path("rel:a", "release"),
            json!({ "lease_id": "xyz" }),
        )
        .await;
    assert_error(&got, 400, "invalid_request", &[]);
    let got = c
        .post(leader, &lock_path("rel:a", "release"), json!({}))
        .await;
    assert_error(&got, 400, "invalid_request", &[]);
    c.shutdown().await;
}

// ---- cancel -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_removes_a_waiting_acquire() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("hold the lock; a waiting acquire (wait_timeout_ms) queues on a follower");
    let got = c.acquire(leader, "can:a", "can-holder", 30_000).await;
    let (lease, token) = assert_grant(&got, "can:a", 30_000);
    let waiter = spawn_waiter(&c, f[0], "can:a", "can-w", 20_000);
    wait_waiters(&c, leader, "can:a", 1).await;
    assert!(!waiter.is_finished(), "the waiter is long-polling");

    phase("§4 cancel: through the other follower, by request_id -> {cancelled:true}");
    let (s, r) = c
        .post(
            f[1],
            &lock_path("can:a", "cancel"),
            json!({ "request_id": "can-w" }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "cancelled": true })));

    phase("the waiting request ends with 409 and the queue is empty");
    assert_error(&answer(waiter).await, 409, "lock_held", &["retry_after_ms"]);
    let v = wait_waiters(&c, leader, "can:a", 0).await;
    assert_eq!(
        v["fencing_token"].as_u64(),
        Some(token),
        "holder untouched: {v}"
    );

    phase("a second cancel of the same request, and one of an unknown id -> {cancelled:false}");
    for rid in ["can-w", "never-sent"] {
        let (s, r) = c
            .post(
                leader,
                &lock_path("can:a", "cancel"),
                json!({ "request_id": rid }),
            )
            .await;
        assert_eq!((s, r), (200, json!({ "cancelled": false })), "{rid}");
    }
    let (s, r) = c
        .post(
            leader,
            &lock_path("can:none", "cancel"),
            json!({ "request_id": "x" }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "cancelled": false })));

    phase("§4: a cancel without a valid request_id is 400");
    for body in [
        json!({}),
        json!({ "request_id": "" }),
        json!({ "request_id": "r".repeat(129) }),
    ] {
        let got = c.post(f[0], &lock_path("can:a", "cancel"), body).await;
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("the cancelled waiter got nothing: releasing the holder leaves the lock free");
    let (s, r) = c
        .post(
            f[1],
            &lock_path("can:a", "release"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let (s, v) = c.get(f[0], "/v1/locks/can:a").await;
    assert_eq!(s, 200);
    assert_eq!(
        (&v["held"], &v["waiters"]),
        (&json!(false), &json!(0)),
        "{v}"
    );
    c.shutdown().await;
}

// ---- waiting ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_hands_off_to_waiters_in_fifo_order() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("hold the lock");
    let got = c.acquire(leader, "fifo:a", "fifo-0", 30_000).await;
    let (mut lease, mut token) = assert_grant(&got, "fifo:a", 30_000);

    phase("§4 waiting: three waiters queue in order, each on a different node");
    let mut waiters = Vec::new();
    for (i, node) in [f[0], leader, f[1]].into_iter().enumerate() {
        waiters.push(spawn_waiter(
            &c,
            node,
            "fifo:a",
            &format!("fifo-{}", i + 1),
            20_000,
        ));
        wait_waiters(&c, leader, "fifo:a", i as u64 + 1).await;
    }

    for i in 0..3 {
        phase(&format!(
            "§4 waiting: release hands off to waiter {} only (no thundering herd)",
            i + 1
        ));
        let releaser = [f[1], f[0], leader][i];
        let (s, r) = c
            .post(
                releaser,
                &lock_path("fifo:a", "release"),
                json!({ "lease_id": lease }),
            )
            .await;
        assert_eq!((s, r), (200, json!({ "released": true })));
        let head = waiters.remove(0);
        let (next_lease, next_token) = assert_grant(&answer(head).await, "fifo:a", 30_000);
        // §3.2: every grant, including a hand-off, takes a strictly larger token.
        assert!(next_token > token, "token {next_token} after {token}");
        let v = wait_for_lock(&c, f[0], "fifo:a", "hand-off", |v| {
            v["fencing_token"].as_u64() == Some(next_token)
        })
        .await;
        assert_eq!(v["held"], true);
        assert_eq!(v["waiters"].as_u64(), Some(2 - i as u64), "{v}");
        for (j, w) in waiters.iter().enumerate() {
            assert!(!w.is_finished(), "waiter {} woke early", i + j + 2);
        }
        (lease, token) = (next_lease, next_token);
    }

    phase("the last holder releases: the lock is free, the queue empty");
    let (s, r) = c
        .post(
            leader,
            &lock_path("fifo:a", "release"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let (s, v) = c.get(f[1], "/v1/locks/fifo:a").await;
    assert_eq!(s, 200);
    assert_eq!(
        (&v["held"], &v["waiters"]),
        (&json!(false), &json!(0)),
        "{v}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_time_out_or_disconnect_leave_the_queue() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("hold the lock");
    let got = c.acquire(leader, "gone:a", "gone-holder", 30_000).await;
    let (lease, _) = assert_grant(&got, "gone:a", 30_000);

    phase("§4 waiting: a wait that times out answers 409 lock_held and is removed");
    let started = Instant::now();
    let got = c
        .post(
            f[0],
            &lock_path("gone:a", "acquire"),
            json!({ "request_id": "gone-t", "wait_timeout_ms": 300 }),
        )
        .await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    // It did wait (server-side timer), rather than answering like a try-once acquire.
    assert!(started.elapsed() >= Duration::from_millis(300));
    wait_waiters(&c, leader, "gone:a", 0).await;

    phase("§4 waiting: a waiter whose client goes away (task aborted) is removed");
    let aborted = spawn_waiter(&c, f[1], "gone:a", "gone-abort", 20_000);
    wait_waiters(&c, leader, "gone:a", 1).await;
    aborted.abort();
    wait_waiters(&c, leader, "gone:a", 0).await;

    phase("§4 waiting: a waiter whose client times out (reqwest timeout) is removed");
    let timed = spawn_post(
        c.url(f[0], &lock_path("gone:a", "acquire")),
        json!({ "request_id": "gone-client-timeout", "wait_timeout_ms": 20_000 }),
        Duration::from_millis(1_500),
    );
    wait_waiters(&c, leader, "gone:a", 1).await;
    let err = tokio::time::timeout(Duration::from_secs(10), timed)
        .await
        .expect("client timeout fired")
        .expect("task")
        .expect_err("the server must still be waiting when the client gives up");
    assert!(err.is_timeout(), "{err}");
    wait_waiters(&c, leader, "gone:a", 0).await;

    phase("nobody is left to hand off to: release leaves the lock free");
    let (s, r) = c
        .post(
            f[1],
            &lock_path("gone:a", "release"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let (s, v) = c.get(leader, "/v1/locks/gone:a").await;
    assert_eq!(s, 200);
    assert_eq!(
        (&v["held"], &v["waiters"]),
        (&json!(false), &json!(0)),
        "{v}"
    );
    c.shutdown().await;
}

// ---- idempotent retries -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_acquire_returns_the_original_result() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("first acquire");
    let got = c.acquire(f[0], "retry:a", "retry-1", 10_000).await;
    let (lease, token) = assert_grant(&got, "retry:a", 10_000);

    phase("§3.6: retries on every node return the same lease and token");
    for node in [leader, f[1], f[0]] {
        let got = c.acquire(node, "retry:a", "retry-1", 10_000).await;
        assert_eq!(
            assert_grant(&got, "retry:a", 10_000),
            (lease.clone(), token)
        );
    }
    let (s, v) = c.get(leader, "/v1/locks/retry:a").await;
    assert_eq!(s, 200);
    assert_eq!(
        v["fencing_token"].as_u64(),
        Some(token),
        "no second lease: {v}"
    );

    phase("§3.6: after release, a retry still returns the original result and grants nothing");
    let (s, r) = c
        .post(
            f[1],
            &lock_path("retry:a", "release"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let got = c.acquire(leader, "retry:a", "retry-1", 10_000).await;
    assert_eq!(
        assert_grant(&got, "retry:a", 10_000),
        (lease.clone(), token)
    );
    let (s, v) = c.get(f[0], "/v1/locks/retry:a").await;
    assert_eq!(s, 200);
    assert_eq!(v["held"], false, "the retry must not re-acquire: {v}");
    let got = c
        .post(
            f[0],
            &lock_path("retry:a", "renew"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_error(&got, 409, "lease_lost", &[]);

    phase("a new request id acquires with a larger token; the old retry does not disturb it");
    let got = c.acquire(f[1], "retry:a", "retry-2", 10_000).await;
    let (lease2, token2) = assert_grant(&got, "retry:a", 10_000);
    assert!(token2 > token);
    let got = c.acquire(f[0], "retry:a", "retry-1", 10_000).await;
    assert_eq!(
        assert_grant(&got, "retry:a", 10_000),
        (lease.clone(), token)
    );
    let (s, v) = c.get(leader, "/v1/locks/retry:a").await;
    assert_eq!(s, 200);
    assert_eq!(
        (&v["held"], v["fencing_token"].as_u64()),
        (&json!(true), Some(token2))
    );

    phase("§3.6: a retried waiting acquire joins the same wait, never a second waiter");
    let w = spawn_waiter(&c, f[0], "retry:a", "retry-w", 20_000);
    wait_waiters(&c, leader, "retry:a", 1).await;
    let w_again = spawn_waiter(&c, leader, "retry:a", "retry-w", 20_000);
    // The retry registered its long-poll on the leader (it subscribes just before proposing).
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.node(leader).node.waits.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the retry never reached the leader"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v = wait_waiters(&c, f[1], "retry:a", 1).await;
    assert_eq!(v["waiters"], 1);

    phase("§3.6: a try-once retry of the waiting request reports lock_held and changes nothing");
    let got = c.acquire(f[1], "retry:a", "retry-w", 30_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    let v = wait_waiters(&c, leader, "retry:a", 1).await;
    assert_eq!(v["fencing_token"].as_u64(), Some(token2), "{v}");
    assert!(
        !w.is_finished() && !w_again.is_finished(),
        "the original wait goes on"
    );
    let (s, r) = c
        .post(
            leader,
            &lock_path("retry:a", "release"),
            json!({ "lease_id": lease2 }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let first = assert_grant(&answer(w).await, "retry:a", 30_000);
    let second = assert_grant(&answer(w_again).await, "retry:a", 30_000);
    assert_eq!(first, second, "both calls see the one hand-off");
    assert!(first.1 > token2);
    let (s, v) = c.get(leader, "/v1/locks/retry:a").await;
    assert_eq!(s, 200);
    assert_eq!(
        (v["fencing_token"].as_u64(), &v["waiters"]),
        (Some(first.1), &json!(0))
    );
    c.shutdown().await;
}

// ---- reads ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_list_show_state_but_never_lease_ids() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);
    let view_fields = set(&[
        "resource",
        "held",
        "holder",
        "fencing_token",
        "expires_at_ms",
        "waiters",
    ]);

    phase("§4 GET of a never-used resource: not held, no token");
    let (s, v) = c.get(f[0], "/v1/locks/list:none").await;
    assert_eq!(s, 200);
    assert_eq!(keys(&v), view_fields, "{v}");
    assert_eq!(
        v,
        json!({ "resource": "list:none", "held": false, "holder": null,
                "fencing_token": null, "expires_at_ms": null, "waiters": 0 })
    );

    phase("acquire list:a (with holder), list:b, list:c, other:x");
    let mut leases = Vec::new();
    for (i, res) in ["list:c", "list:a", "other:x", "list:b"]
        .into_iter()
        .enumerate()
    {
        let got = c
            .post(
                f[i % 2],
                &lock_path(res, "acquire"),
                json!({ "request_id": format!("l-{i}"), "holder": format!("svc-{res}"), "ttl_ms": 30_000 }),
            )
            .await;
        leases.push((res, assert_grant(&got, res, 30_000)));
    }

    phase("§4 GET on every node: exact fields, holder and token, never the lease_id");
    let (_, (lease_a, token_a)) = leases.iter().find(|(r, _)| *r == "list:a").unwrap().clone();
    for node in [leader, f[0], f[1]] {
        let (s, v) = c.get(node, "/v1/locks/list:a").await;
        assert_eq!(s, 200);
        assert_eq!(keys(&v), view_fields, "{v}");
        assert_eq!(v["resource"], "list:a");
        assert_eq!(v["held"], true);
        assert_eq!(v["holder"], "svc-list:a");
        assert_eq!(v["fencing_token"].as_u64(), Some(token_a));
        assert!(v["expires_at_ms"].as_u64().is_some());
        assert_eq!(v["waiters"], 0);
        assert!(!v.to_string().contains(&lease_a), "lease id leaked: {v}");
    }

    phase("release list:b; it drops out of the list");
    let (_, (lease_b, _)) = leases.iter().find(|(r, _)| *r == "list:b").unwrap().clone();
    let (s, _) = c
        .post(
            leader,
            &lock_path("list:b", "release"),
            json!({ "lease_id": lease_b }),
        )
        .await;
    assert_eq!(s, 200);

    phase("§4 list: only held resources matching the prefix, in name order, without lease ids");
    let (s, v) = c.get(f[1], "/v1/locks?prefix=list:&limit=10").await;
    assert_eq!(s, 200, "{v}");
    // `now_ms` is the log time read at; `next_after` appears only when more pages follow.
    assert_eq!(keys(&v), set(&["locks", "now_ms"]));
    let locks = v["locks"].as_array().expect("locks");
    let names: Vec<&str> = locks
        .iter()
        .map(|l| l["resource"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["list:a", "list:c"]);
    for l in locks {
        assert_eq!(keys(l), view_fields, "{l}");
        assert_eq!(l["held"], true);
    }
    for (_, (lease, _)) in &leases {
        assert!(
            !v.to_string().contains(lease.as_str()),
            "lease id leaked: {v}"
        );
    }

    phase("§4 list: limit cuts the ordered result; no prefix lists everything held");
    let (s, v) = c.get(leader, "/v1/locks?prefix=list:&limit=1").await;
    assert_eq!(s, 200);
    assert_eq!(v["locks"].as_array().unwrap().len(), 1);
    assert_eq!(v["locks"][0]["resource"], "list:a");
    let (s, v) = c.get(f[0], "/v1/locks").await;
    assert_eq!(s, 200);
    let names: Vec<&str> = v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["resource"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["list:a", "list:c", "other:x"]);
    let (s, v) = c.get(f[0], "/v1/locks?prefix=nothing-here").await;
    assert_eq!((s, &v["locks"]), (200, &json!([])), "{v}");

    phase("§4 list: limit 0, limit 5000 and a non-numeric limit are 400");
    for q in ["limit=0", "limit=5000", "prefix=list:&limit=0", "limit=ten"] {
        let got = c.get(f[1], &format!("/v1/locks?{q}")).await;
        eprintln!("  {q}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }
    c.shutdown().await;
}

// ---- cluster, health, metrics -----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_health_and_metrics_endpoints() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("§4 GET /v1/cluster on every node: node_id, leader_id, term, 3 members, last_applied");
    for node in [leader, f[0], f[1]] {
        let v = wait_cluster_status(&c, node, leader).await;
        assert_eq!(v["node_id"].as_u64(), Some(node), "{v}");
        assert!(v["term"].as_u64().is_some_and(|t| t >= 1), "{v}");
        assert!(v["last_applied"].as_u64().is_some(), "{v}");
        assert_eq!(voters(&v), BTreeSet::from([1, 2, 3]), "{v}");
        for m in v["members"].as_array().unwrap() {
            let id = m["id"].as_u64().unwrap();
            assert_eq!(m["addr"], c.addrs[&id].as_str(), "{v}");
        }
    }

    phase("§4 /healthz and /readyz (a leader is known) answer 200 on every node");
    for node in [leader, f[0], f[1]] {
        let (s, v) = c.get(node, "/healthz").await;
        assert_eq!(s, 200, "{v}");
        let (s, v) = c.get(node, "/readyz").await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["leader_id"].as_u64(), Some(leader), "{v}");
    }

    phase("§4/§6 /metrics is Prometheus text with the SPEC's series");
    let before = metrics(&c, f[0]).await;
    let acquires = |text: &str| {
        sample(
            text,
            "fencegate_op_outcomes_total",
            &[("op", "acquire"), ("outcome", "success")],
        )
    };
    let got = c.acquire(f[0], "met:a", "met-1", 5_000).await;
    let (_, token) = assert_grant(&got, "met:a", 5_000);
    let after = metrics(&c, f[0]).await;
    // Gauges mirror the local state machine: the leader applied the acquire before answering.
    let leader_text = metrics(&c, leader).await;
    for name in [
        "fencegate_op_seconds_bucket",
        "fencegate_op_outcomes_total",
        "fencegate_active_locks",
        "fencegate_raft_commit_seconds",
        "fencegate_leader_changes_total",
        "fencegate_lease_expirations_total",
    ] {
        assert!(after.contains(name), "/metrics lacks {name}:\n{after}");
    }
    assert_eq!(acquires(&after), acquires(&before) + 1.0, "acquire counter");
    assert!(
        sample(&after, "fencegate_op_seconds_count", &[("op", "acquire")]) >= 1.0,
        "acquire latency observed"
    );
    assert!(sample(&leader_text, "fencegate_active_locks", &[]) >= 1.0);
    assert!(sample(&leader_text, "fencegate_last_fencing_token", &[]) >= token as f64);

    phase("§6: a refused acquire is counted under its own outcome");
    let got = c.acquire(f[0], "met:a", "met-2", 5_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    let text = metrics(&c, f[0]).await;
    assert_eq!(
        sample(
            &text,
            "fencegate_op_outcomes_total",
            &[("op", "acquire"), ("outcome", "lock_held")]
        ),
        sample(
            &after,
            "fencegate_op_outcomes_total",
            &[("op", "acquire"), ("outcome", "lock_held")]
        ) + 1.0
    );
    assert_eq!(
        acquires(&text),
        acquires(&after),
        "a refusal is not a success"
    );
    // The leader proposed the acquire (forwarded to it), so it measured a raft commit.
    let text = metrics(&c, leader).await;
    assert!(sample(&text, "fencegate_raft_commit_seconds_count", &[]) >= 1.0);
    c.shutdown().await;
}

// ---- membership -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_serves_reads_and_is_removed() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("a lock acquired before the new node exists");
    let got = c
        .post(
            f[0],
            &lock_path("member:pre", "acquire"),
            json!({ "request_id": "m-1", "holder": "before-join", "ttl_ms": 60_000 }),
        )
        .await;
    let (_, token) = assert_grant(&got, "member:pre", 60_000);

    phase("start node 4 (not a founding member: it does not bootstrap)");
    let addr4 = c.start_joining(4).await;
    let v = cluster_status(&c, 4).await;
    assert_eq!(v["node_id"], 4);
    assert_eq!(
        voters(&v),
        BTreeSet::new(),
        "node 4 has no membership yet: {v}"
    );

    phase("§4 members/add on a follower is relayed to the leader; node 4 becomes a voter");
    let (s, r) = c
        .post(
            f[1],
            "/v1/cluster/members/add",
            json!({ "node_id": 4, "addr": addr4 }),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["voters"], json!([1, 2, 3, 4]), "{r}");
    let v = wait_voters(&c, leader, &[1, 2, 3, 4]).await;
    let node4 = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == 4)
        .cloned()
        .expect("node 4 listed");
    assert_eq!(node4["addr"], addr4.as_str());

    phase("§4: node 4 serves a linearizable GET showing the earlier lock");
    let (s, v) = c.get(4, "/v1/locks/member:pre").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["holder"], "before-join");
    assert_eq!(v["fencing_token"].as_u64(), Some(token));
    let v = wait_voters(&c, 4, &[1, 2, 3, 4]).await;
    assert_eq!(v["leader_id"].as_u64(), Some(leader), "{v}");

    phase("node 4 also takes writes (forwarded to the leader)");
    let got = c.acquire(4, "member:via4", "m-2", 10_000).await;
    let (_, token4) = assert_grant(&got, "member:via4", 10_000);
    assert!(token4 > token);

    phase("§4: bad membership calls are 400 — on the leader and relayed from a follower");
    for node in [leader, f[0]] {
        let got = c
            .post(node, "/v1/cluster/members/remove", json!({ "node_id": 99 }))
            .await;
        assert_error(&got, 400, "invalid_request", &[]);
        let got = c
            .post(node, "/v1/cluster/members/add", json!({ "node_id": 5 }))
            .await;
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("§4 members/remove on a follower: back to 3 voters");
    let (s, r) = c
        .post(f[0], "/v1/cluster/members/remove", json!({ "node_id": 4 }))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["voters"], json!([1, 2, 3]), "{r}");
    let v = wait_voters(&c, leader, &[1, 2, 3]).await;
    assert_eq!(
        v["members"].as_array().unwrap().len(),
        3,
        "node 4 forgotten: {v}"
    );
    c.stop_and_forget(4).await;

    phase("the 3-node cluster keeps serving after the removal");
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];
    let got = c.acquire(follower, "member:after", "m-3", 10_000).await;
    let (_, token5) = assert_grant(&got, "member:after", 10_000);
    assert!(token5 > token4);
    let (s, v) = c.get(follower, "/v1/locks/member:pre").await;
    assert_eq!((s, v["fencing_token"].as_u64()), (200, Some(token)), "{v}");
    c.shutdown().await;
}

// ---- unknown routes ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_actions_and_methods_are_json_errors() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader)[0];

    phase("§4: an unknown path is 404 with a JSON error body");
    for path in ["/nope", "/v1", "/v1/lockz/x", "/v2/locks/x"] {
        let got = c.get(f, path).await;
        assert_error(&got, 404, "not_found", &[]);
        let got = c.post(leader, path, json!({})).await;
        assert_error(&got, 404, "not_found", &[]);
    }

    phase("§4: an unknown lock action is 404; so is a POST without an action");
    let got = c
        .post(f, "/v1/locks/x/frobnicate", json!({ "request_id": "r" }))
        .await;
    assert_error(&got, 404, "not_found", &[]);
    let got = c.post(f, "/v1/locks/x", json!({ "request_id": "r" })).await;
    assert_error(&got, 404, "not_found", &[]);
    let got = c
        .post(leader, "/v1/locks/x/ACQUIRE", json!({ "request_id": "r" }))
        .await;
    assert_error(&got, 404, "not_found", &[]);

    phase("§4: a known path with the wrong method is a JSON 405");
    let got = c.get(f, "/v1/cluster/members/add").await;
    assert_error(&got, 405, "method_not_allowed", &[]);
    for path in ["/v1/cluster", "/healthz", "/v1/locks"] {
        let got = c.post(leader, path, json!({})).await;
        assert_error(&got, 405, "method_not_allowed", &[]);
    }

    phase("nothing was created by those calls");
    let (s, v) = c.get(leader, "/v1/locks").await;
    assert_eq!((s, &v["locks"]), (200, &json!([])), "{v}");
    c.shutdown().await;
}

/// Regression (found by the chaos harness): a waiting acquire whose caller hangs up while it is
/// being committed must not have its lease released behind the retry's back. A retry with the
/// same request_id gets the lease back (§3.6) and it is live: renew succeeds (§3.4, §4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_waiting_acquire_leaves_a_live_lease_for_its_retry() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(3))
        .build()
        .expect("client");
    for i in 0..12 {
        let resource = format!("abandon:{i}");
        let request_id = format!("abandon-{i}");
        phase("the caller hangs up while its waiting acquire is being committed");
        let _ = impatient
            .post(c.url(leader, &format!("/v1/locks/{resource}/acquire")))
            .json(&json!({ "request_id": request_id, "wait_timeout_ms": 2_000 }))
            .send()
            .await;
        // Let the node notice the hang-up and run its cancel.
        tokio::time::sleep(Duration::from_millis(100)).await;

        phase("the retry either gets the original lease, which must be live, or a fresh one");
        let (s, v) = c
            .post(
                leader,
                &format!("/v1/locks/{resource}/acquire"),
                json!({ "request_id": request_id, "wait_timeout_ms": 2_000 }),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        let (s, r) = c
            .post(
                leader,
                &format!("/v1/locks/{resource}/renew"),
                json!({ "lease_id": v["lease_id"] }),
            )
            .await;
        assert_eq!(s, 200, "retry {i} returned a dead lease: {r}");
    }
    c.shutdown().await;
}
