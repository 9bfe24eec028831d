//! `Idempotency-Key` end to end: a real 3-node cluster, one proxy per node, the demo store's
//! `POST /orders` behind them (see `common/`). The store's `/log` is the ground truth: each
//! order it created is one upstream effect.
//!
//! The rule checked throughout: at most one upstream effect per (tenant, route, key), also when
//! requests race over all proxies, when the proxy's node dies between the effect and the commit
//! of its answer, and across a restart of every node.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, phase, FenceHarness, StoreWrite, EVENT};
use fencegate_proxy::idempotency::contract::fingerprint;
use lock_core::machine::{Command, IdemCommand, IdemOutcome, IdemScope, IdemState, Response};
use serde_json::Value;

/// An answer from a proxy with the headers the idempotency contract is about.
#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    reconciled: bool,
    retry_after: Option<String>,
    body: Value,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
}

/// `POST /orders` through proxy `id` with `key` (if any) and extra headers.
async fn post_order(
    h: &FenceHarness,
    id: u64,
    key: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let addr = h.client.proxy_addr(id).expect("proxy runs");
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(20))
        .body(body.to_string());
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = req.send().await.expect("POST /orders");
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let reconciled = header("idempotent-reconciled").as_deref() == Some("true");
    let retry_after = header("retry-after");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    Answer {
        status,
        replayed,
        reconciled,
        retry_after,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

/// Orders in the store's log created with `key`.
async fn orders_with_key(h: &FenceHarness, key: &str) -> Vec<StoreWrite> {
    let log: Vec<Value> = reqwest::get(format!("http://{}/log", h.client.store_addr))
        .await
        .expect("GET /log")
        .json()
        .await
        .expect("log JSON");
    log.into_iter()
        .filter(|e| e["idempotency_key"].as_str() == Some(key))
        .map(|e| serde_json::from_value(e).expect("log entry"))
        .collect()
}

/// Sends until the answer is not "in flight" (409 `idempotency_key_in_use`) nor 503.
async fn post_until_settled(h: &FenceHarness, id: u64, key: &str, body: &str) -> Answer {
    post_until_settled_with(h, id, key, body, &[]).await
}

/// [`post_until_settled`] with extra headers.
async fn post_until_settled_with(
    h: &FenceHarness,
    id: u64,
    key: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let deadline = std::time::Instant::now() + EVENT;
    loop {
        let a = post_order(h, id, Some(key), body, headers).await;
        let busy = a.code() == "idempotency_key_in_use" || a.status == 503;
        if !busy || std::time::Instant::now() >= deadline {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_fifty_concurrent_requests_with_one_key_make_one_order() {
    let h = std::sync::Arc::new(FenceHarness::start().await);
    let ids = h.proxy_ids();

    phase("50 requests with one key, spread over the three proxies, all at once");
    let mut tasks = Vec::new();
    for i in 0..50 {
        let h = h.clone();
        let id = ids[i % ids.len()];
        tasks.push(tokio::spawn(async move {
            post_order(&h, id, Some("race-1"), r#"{"item":"book","qty":1}"#, &[]).await
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("task"));
    }

    phase("exactly one order in the store; every other answer is a replay of it or a 409");
    let orders = orders_with_key(&h, "race-1").await;
    assert_eq!(orders.len(), 1, "one effect per key: {orders:#?}");
    let originals: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed)
        .collect();
    assert_eq!(originals.len(), 1, "one original answer: {answers:#?}");
    let order_id = originals[0].body["id"].clone();
    for a in &answers {
        match (a.status, a.replayed) {
            (201, _) => assert_eq!(a.body["id"], order_id, "{a:?}"),
            (409, false) => {
                assert_eq!(a.code(), "idempotency_key_in_use", "{a:?}");
                assert!(a.retry_after.is_some(), "409 carries Retry-After: {a:?}");
            }
            // A claim that did not commit within the write timeout on a busy machine: nothing
            // was forwarded for it.
            (503, false) => assert_eq!(a.code(), "no_quorum", "{a:?}"),
            _ => panic!("unexpected answer {a:?}"),
        }
    }

    phase("a later retry through each proxy is a replay of the same order");
    for id in ids {
        let a = post_until_settled(&h, id, "race-1", r#"{"qty":1,"item":"book"}"#).await;
        assert_eq!((a.status, a.replayed), (201, true), "{a:?}");
        assert_eq!(a.body["id"], order_id);
    }
    assert_eq!(orders_with_key(&h, "race-1").await.len(), 1);
    match std::sync::Arc::try_unwrap(h) {
        Ok(h) => h.shutdown().await,
        Err(_) => panic!("harness still shared"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_contract_replay_mismatch_missing_malformed_tenants() {
    let h = FenceHarness::start().await;

    phase("missing key on a required route: 400, nothing forwarded");
    let a = post_order(&h, 1, None, "{}", &[]).await;
    assert_eq!(
        (a.status, a.code()),
        (400, "idempotency_key_required"),
        "{a:?}"
    );
    let long = "k".repeat(256);
    for bad in [long.as_str(), "tab\tkey"] {
        let a = post_order(&h, 2, Some(bad), "{}", &[]).await;
        assert_eq!(
            (a.status, a.code()),
            (400, "invalid_idempotency_key"),
            "{a:?}"
        );
    }

    phase("two Idempotency-Key headers: 400, nothing forwarded");
    let two = post_order(&h, 1, Some("k-a"), "{}", &[("idempotency-key", "k-b")]).await;
    assert_eq!(
        (two.status, two.code()),
        (400, "invalid_idempotency_key"),
        "{two:?}"
    );
    let underscored = post_order(&h, 1, Some("k-a"), "{}", &[("idempotency_key", "k-b")]).await;
    assert_eq!(
        (underscored.status, underscored.code()),
        (400, "invalid_idempotency_key"),
        "Idempotency_Key is a second key to servers that read it as the same header: \
         {underscored:?}"
    );

    phase("first request: 201 from the store, not marked as a replay");
    let first = post_order(&h, 1, Some("k-1"), r#"{"a":1,"b":2}"#, &[]).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");

    phase("the same request (JSON keys reordered) through another proxy: the stored answer");
    let again = post_order(&h, 2, Some("k-1"), r#"{ "b": 2, "a": 1 }"#, &[]).await;
    assert_eq!((again.status, again.replayed), (201, true), "{again:?}");
    assert_eq!(again.body, first.body);

    phase("the same key with another body: 422 mismatch");
    let other = post_order(&h, 3, Some("k-1"), r#"{"a":2}"#, &[]).await;
    assert_eq!(
        (other.status, other.code()),
        (422, "idempotency_key_mismatch"),
        "{other:?}"
    );

    phase("the same key for another tenant is another record: a new order");
    let acme = post_order(
        &h,
        3,
        Some("k-1"),
        r#"{"a":1,"b":2}"#,
        &[("X-Tenant", "acme")],
    )
    .await;
    assert_eq!((acme.status, acme.replayed), (201, false), "{acme:?}");
    assert_ne!(acme.body["id"], first.body["id"]);
    assert_eq!(orders_with_key(&h, "k-1").await.len(), 2);

    phase("two tenant headers (in any spelling) are refused: a store might read the other");
    for second in ["X-Tenant", "X_Tenant"] {
        let twice = post_order(
            &h,
            1,
            Some("k-2"),
            "{}",
            &[("X-Tenant", "acme"), (second, "other")],
        )
        .await;
        assert_eq!(
            (twice.status, twice.code()),
            (400, "invalid_request"),
            "{twice:?}"
        );
    }
    assert!(orders_with_key(&h, "k-2").await.is_empty());

    phase("the metrics count the replay and the mismatch (each proxy on its node's /metrics)");
    assert_counted(&h, &["replayed", "mismatch", "key_required", "invalid_key"]).await;
    h.shutdown().await;
}

/// Every node's `/metrics`, concatenated.
async fn metrics_text(h: &FenceHarness) -> String {
    let mut text = String::new();
    for id in h.cluster.running() {
        let (_, page) = h.cluster.get(id, "/metrics").await;
        text.push_str(page.as_str().unwrap_or_default());
    }
    text
}

/// The sum over the nodes of the samples of `series` (a name and its first label, e.g.
/// `fencegate_proxy_idempotency_requests_total{outcome="replayed"`).
fn summed(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Some proxy counted each of `outcomes` in `fencegate_proxy_idempotency_requests_total` (the
/// series exist at 0 from the start: a count is a value above it).
async fn assert_counted(h: &FenceHarness, outcomes: &[&str]) {
    let text = metrics_text(h).await;
    for outcome in outcomes {
        let series = format!("fencegate_proxy_idempotency_requests_total{{outcome=\"{outcome}\"");
        assert!(
            summed(&text, &series) > 0.0,
            "{outcome} in metrics:\n{text}"
        );
    }
}

/// Starts a request through node `x`'s proxy whose store answer is held after the order is
/// created, then kills node `x` (cut off first, so its dying proxy cannot commit anything):
/// the effect happened, its answer was never committed.
async fn lose_the_answer(h: &mut FenceHarness, x: u64, key: &str, body: &str) {
    let addr = h.client.proxy_addr(x).expect("proxy");
    let (key_s, body_s) = (key.to_string(), body.to_string());
    let request = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("http://{addr}/orders"))
            .header("content-type", "application/json")
            .header("idempotency-key", key_s)
            .header("x-demo-hold", "h1")
            .timeout(Duration::from_secs(30))
            .body(body_s)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    let store = h.client.store_addr.clone();
    eventually(EVENT, "the store created the order", async || {
        orders_with_key(h, key).await.len() == 1
    })
    .await;
    phase(&format!(
        "node {x} dies after the store created the order, before the answer is committed"
    ));
    h.cluster.isolate(x);
    h.cluster.crash(x).await;
    // Let the store answer the dead node's proxy; it can no longer record anything.
    reqwest::Client::new()
        .post(format!("http://{store}/holds/h1/release"))
        .send()
        .await
        .expect("release hold");
    let status = request.await.expect("task");
    assert!(
        !matches!(status, Ok(201)),
        "the dead node's proxy must not hand out an unrecorded answer: {status:?}"
    );
    h.stop_proxy(x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_lost_answer_after_leader_death_is_reconciled_not_rerun() {
    let mut h = FenceHarness::start().await;
    let leader = h.leader().await;
    let body = r#"{"item":"lamp"}"#;

    phase("a create-order through the leader's proxy; the leader dies mid-request");
    lose_the_answer(&mut h, leader, "lost-1", body).await;

    phase("a retry through another node: in flight until the dead owner's claim ends, then reconciled");
    let other = h.proxy_ids()[0];
    let a = post_until_settled(&h, other, "lost-1", body).await;
    assert_eq!(
        (a.status, a.replayed, a.reconciled),
        (200, true, true),
        "the lookup's answer, replayed: {a:?}"
    );
    let orders = orders_with_key(&h, "lost-1").await;
    assert_eq!(orders.len(), 1, "never a second order: {orders:#?}");
    assert_eq!(a.body["idempotency_key"], "lost-1");

    phase("later retries replay the reconciled answer");
    let b = post_order(&h, h.proxy_ids()[1], Some("lost-1"), body, &[]).await;
    assert_eq!(
        (b.status, b.replayed, b.reconciled),
        (200, true, true),
        "{b:?}"
    );
    assert_eq!(b.body, a.body);
    assert_eq!(orders_with_key(&h, "lost-1").await.len(), 1);
    assert_counted(&h, &["reconciled"]).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t31_lost_answer_without_lookup_is_an_unknown_error() {
    let mut h = FenceHarness::start_with(|c| {
        c.routes[1].idempotency_options.reconcile = None;
    })
    .await;
    let body = r#"{"item":"chair"}"#;
    let victim = h.cluster.followers(h.leader().await)[0];
    lose_the_answer(&mut h, victim, "lost-2", body).await;

    phase("a retry gets the unknown error once the claim ends, and the request is not run again");
    let other = h.proxy_ids()[0];
    let a = post_until_settled(&h, other, "lost-2", body).await;
    assert_eq!(
        (a.status, a.code()),
        (409, "idempotency_outcome_unknown"),
        "{a:?}"
    );
    let again = post_order(&h, other, Some("lost-2"), body, &[]).await;
    assert_eq!(again.code(), "idempotency_outcome_unknown", "{again:?}");
    assert_eq!(orders_with_key(&h, "lost-2").await.len(), 1);
    assert_counted(&h, &["unknown"]).await;
    h.shutdown().await;
}

/// A proxy on node 1 claims `key` for `tenant` and dies before forwarding (the claim is
/// committed directly, as attempt 42 with a 1 s lease).
async fn claim_and_vanish(h: &FenceHarness, tenant: &str, key: &str, body: &str) {
    let fp = fingerprint(
        "POST",
        "/orders",
        Some("application/json"),
        body.as_bytes(),
        std::iter::empty(),
    );
    let claim = IdemCommand::Claim {
        scope: IdemScope {
            tenant: tenant.into(),
            route: "/orders".into(),
            key: key.into(),
        },
        fingerprint: fp,
        owner: 1,
        attempt: 42,
        lease_ms: 1_000,
        retain_ms: 3_600_000,
        tombstone_ms: 3_600_000,
    };
    let resp = h
        .cluster
        .node(1)
        .node
        .propose(Command::Idem(claim))
        .await
        .expect("claim");
    assert_eq!(resp, Response::Idem(IdemOutcome::Claimed { attempt: 42 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t32_claim_lost_before_forwarding_allows_one_new_attempt() {
    let h = FenceHarness::start().await;
    let body = r#"{"item":"desk"}"#;

    phase("a proxy on node 1 claims the key and dies before forwarding (claim committed directly)");
    claim_and_vanish(&h, "demo", "never-sent", body).await;

    phase("a retry: the lookup proves it never ran, so it runs once; later retries replay");
    let a = post_until_settled(&h, 2, "never-sent", body).await;
    assert_eq!((a.status, a.replayed), (201, false), "{a:?}");
    let b = post_order(&h, 3, Some("never-sent"), body, &[]).await;
    assert_eq!((b.status, b.replayed), (201, true), "{b:?}");
    assert_eq!(b.body["id"], a.body["id"]);
    assert_eq!(orders_with_key(&h, "never-sent").await.len(), 1);
    assert_counted(&h, &["reconciled_new_attempt"]).await;
    h.shutdown().await;
}

/// Sends for `tenant` until the answer is not "in flight" (the vanished claim's lease).
async fn post_while_in_use(
    h: &FenceHarness,
    id: u64,
    key: &str,
    body: &str,
    tenant: &str,
) -> Answer {
    let deadline = std::time::Instant::now() + EVENT;
    loop {
        let a = post_order(h, id, Some(key), body, &[("x-tenant", tenant)]).await;
        if a.code() != "idempotency_key_in_use" || std::time::Instant::now() >= deadline {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two tenants may use the same key: reconciling one tenant's lost attempt asks the lookup
/// for that tenant's effect only, so another tenant's order with the same key proves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t33_reconciliation_asks_for_the_tenants_own_effect() {
    let h = FenceHarness::start().await;
    let body = r#"{"item":"stool"}"#;

    phase("tenant acme creates an order with key shared-1");
    let acme = post_order(&h, 2, Some("shared-1"), body, &[("x-tenant", "acme")]).await;
    assert_eq!(acme.status, 201, "{acme:?}");

    phase("tenant globex's claim of the same key is lost before forwarding");
    claim_and_vanish(&h, "globex", "shared-1", body).await;

    phase("globex's retry: its own effect is absent, so it runs once (not acme's order replayed)");
    let globex = post_while_in_use(&h, 3, "shared-1", body, "globex").await;
    assert_eq!((globex.status, globex.replayed), (201, false), "{globex:?}");
    assert_eq!(globex.body["tenant"], "globex");
    assert_ne!(globex.body["id"], acme.body["id"]);
    let orders = orders_with_key(&h, "shared-1").await;
    assert_eq!(orders.len(), 2, "one order per tenant: {orders:#?}");

    phase("globex's own effect of a lost attempt is found by the lookup: replayed, not rerun");
    let created = reqwest::Client::new()
        .post(format!("http://{}/orders", h.client.store_addr))
        .header("idempotency-key", "shared-2")
        .header("x-tenant", "globex")
        .body(body)
        .send()
        .await
        .expect("the lost attempt's effect");
    assert_eq!(created.status().as_u16(), 201);
    claim_and_vanish(&h, "globex", "shared-2", body).await;
    let found = post_while_in_use(&h, 2, "shared-2", body, "globex").await;
    assert_eq!(
        (found.status, found.replayed, found.reconciled),
        (200, true, true),
        "{found:?}"
    );
    assert_eq!(found.body["tenant"], "globex");
    assert_eq!(orders_with_key(&h, "shared-2").await.len(), 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_expired_key_is_refused_for_the_tombstone_window() {
    let h = FenceHarness::start_with(|c| {
        let o = &mut c.routes[1].idempotency_options;
        o.retain_ms = 1_000;
        o.tombstone_ms = 3_600_000;
    })
    .await;
    let first = post_order(&h, 1, Some("old"), "{}", &[]).await;
    assert_eq!(first.status, 201, "{first:?}");

    phase("after retention the key is refused as expired, never run a second time");
    eventually(EVENT, "the key expires", async || {
        let a = post_order(&h, 2, Some("old"), "{}", &[]).await;
        match (a.status, a.replayed) {
            (201, true) => false,
            _ => {
                assert_eq!(
                    (a.status, a.code()),
                    (422, "idempotency_key_expired"),
                    "{a:?}"
                );
                true
            }
        }
    })
    .await;
    assert_eq!(orders_with_key(&h, "old").await.len(), 1);
    assert_counted(&h, &["expired"]).await;
    h.shutdown().await;
}

/// After retention and tombstone the record is forgotten on every node (counted in
/// `fencegate_idempotency_records_forgotten_total`) and the key is new again: the documented
/// end of the guarantee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t41_a_record_past_its_tombstone_is_forgotten_and_counted() {
    let h = FenceHarness::start_with(|c| {
        let o = &mut c.routes[1].idempotency_options;
        o.retain_ms = 300;
        o.tombstone_ms = 300;
    })
    .await;
    let first = post_order(&h, 1, Some("short"), "{}", &[]).await;
    assert_eq!(first.status, 201, "{first:?}");

    phase("every node forgets the record once its tombstone window is over");
    eventually(EVENT, "the record forgotten on every node", async || {
        let text = metrics_text(&h).await;
        let forgotten = text
            .lines()
            .filter(|l| l.starts_with("fencegate_idempotency_records_forgotten_total"))
            .filter(|l| l.rsplit(' ').next().is_some_and(|v| v != "0"))
            .count();
        forgotten == h.cluster.running().len()
    })
    .await;

    phase("the key is new again: a request with it runs");
    let again = post_order(&h, 2, Some("short"), "{}", &[]).await;
    assert_eq!((again.status, again.replayed), (201, false), "{again:?}");
    assert_eq!(orders_with_key(&h, "short").await.len(), 2);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_restart_of_every_node_keeps_every_record() {
    let mut h = FenceHarness::start().await;
    let keys: Vec<String> = (0..20).map(|i| format!("durable-{i}")).collect();

    phase("20 orders with 20 keys");
    let mut firsts = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let id = h.proxy_ids()[i % 3];
        let a = post_order(&h, id, Some(k), &format!("{{\"n\":{i}}}"), &[]).await;
        assert_eq!((a.status, a.replayed), (201, false), "{a:?}");
        firsts.push(a.body);
    }

    phase("a snapshot on every node (records travel in it), then every node crashes and restarts");
    for id in h.cluster.running() {
        h.cluster
            .node(id)
            .node
            .raft
            .trigger()
            .snapshot()
            .await
            .expect("trigger snapshot");
    }
    for id in h.cluster.running() {
        let raft = h.cluster.node(id).node.raft.clone();
        raft.wait(Some(EVENT))
            .metrics(|m| m.snapshot.is_some(), "snapshot built")
            .await
            .expect("snapshot");
    }
    // One more record after the snapshot: it must come back from the log, not the snapshot.
    let late = post_order(&h, 1, Some("after-snapshot"), "{}", &[]).await;
    assert_eq!(late.status, 201, "{late:?}");
    for id in [1, 2, 3] {
        h.crash(id).await;
    }
    for id in [1, 2, 3] {
        h.restart(id).await;
    }
    h.leader().await;

    phase("every key replays its original answer; the store still has one order per key");
    for (i, k) in keys.iter().enumerate() {
        let a =
            post_until_settled(&h, h.proxy_ids()[(i + 1) % 3], k, &format!("{{\"n\":{i}}}")).await;
        assert_eq!((a.status, a.replayed), (201, true), "{k}: {a:?}");
        assert_eq!(a.body, firsts[i]);
        assert_eq!(orders_with_key(&h, k).await.len(), 1);
    }
    let a = post_until_settled(&h, 2, "after-snapshot", "{}").await;
    assert_eq!((a.status, a.replayed), (201, true), "{a:?}");
    assert_eq!(a.body, late.body);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_follower_behind_a_compacted_log_gets_the_records_in_the_snapshot() {
    let mut h = FenceHarness::start().await;
    let leader = h.leader().await;
    let f = h.cluster.followers(leader)[0];

    phase("a follower is down while 10 orders are created");
    h.crash(f).await;
    let keys: Vec<String> = (0..10).map(|i| format!("snap-{i}")).collect();
    for k in &keys {
        let a = post_order(&h, leader, Some(k), "{}", &[]).await;
        assert_eq!(a.status, 201, "{a:?}");
    }

    phase("the leader snapshots and purges its log past the follower's last entry");
    let snapshot_index = h.cluster.snapshot_and_purge(leader).await;

    phase("the follower restarts, installs the snapshot, and holds every record itself");
    h.restart(f).await;
    eventually(EVENT, "the follower installs the snapshot", async || {
        h.cluster
            .cluster_status(f)
            .await
            .snapshot_index
            .is_some_and(|i| i >= snapshot_index)
    })
    .await;
    h.cluster.wait_caught_up(f, EVENT).await;
    for k in &keys {
        let scope = IdemScope {
            tenant: "demo".into(),
            route: "/orders".into(),
            key: k.clone(),
        };
        let rec = h
            .cluster
            .node(f)
            .node
            .machine
            .idem_record(&scope)
            .expect("read record")
            .unwrap_or_else(|| panic!("{k} missing on the follower"));
        assert!(matches!(rec.state, IdemState::Succeeded(_)), "{k}: {rec:?}");
    }

    phase("with the old leader gone, retries through the follower replay");
    h.crash(leader).await;
    for k in &keys {
        let a = post_until_settled(&h, f, k, "{}").await;
        assert_eq!((a.status, a.replayed), (201, true), "{k}: {a:?}");
        assert_eq!(orders_with_key(&h, k).await.len(), 1);
    }
    h.shutdown().await;
}

/// `PUT /kv/{key}` through proxy `id` with a fencing token and an idempotency key.
async fn put_kv(
    h: &FenceHarness,
    id: u64,
    key: &str,
    token: Option<u64>,
    idem: &str,
    value: &str,
) -> Answer {
    let addr = h.client.proxy_addr(id).expect("proxy runs");
    let mut req = reqwest::Client::new()
        .put(format!("http://{addr}/kv/{key}"))
        .header("idempotency-key", idem)
        .timeout(Duration::from_secs(20))
        .body(value.to_string());
    if let Some(t) = token {
        req = req.header("fence-token", t);
    }
    let resp = req.send().await.expect("PUT /kv");
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    Answer {
        status,
        replayed,
        reconciled: false,
        retry_after: None,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_fenced_idempotent_route_fence_first_replay_without_admission() {
    let h = FenceHarness::start_with(|c| {
        c.routes[0].idempotency = fencegate_proxy::idempotency::IdempotencyMode::Required;
    })
    .await;

    phase("the fence's own checks come first: no token is 428 before any record is touched");
    let a = put_kv(&h, 1, "x", None, "w1", "v1").await;
    assert_eq!(
        (a.status, a.code()),
        (428, "fencing_token_required"),
        "{a:?}"
    );

    phase("A writes with its token and key w1; a retry replays");
    let lease_a = h.acquire("kv:x", "A", 30_000, 0).await;
    let a = put_kv(&h, 1, "x", Some(lease_a.token), "w1", "v1").await;
    assert_eq!((a.status, a.replayed), (200, false), "{a:?}");
    let again = put_kv(&h, 2, "x", Some(lease_a.token), "w1", "v1").await;
    assert_eq!((again.status, again.replayed), (200, true), "{again:?}");

    phase("B takes the lock: A's retry of w1 still replays (no upstream effect, no admission)");
    h.release(&lease_a).await;
    // The release defers the next lease while the proxies' grants for A live: B waits.
    let lease_b = h.acquire("kv:x", "B", 30_000, 10_000).await;
    assert!(lease_b.token > lease_a.token);
    let late = put_kv(&h, 3, "x", Some(lease_a.token), "w1", "v1").await;
    assert_eq!((late.status, late.replayed), (200, true), "{late:?}");
    assert_eq!(late.body, a.body);

    phase("B sending A's key and body with its own token is another write: 422, not A's answer");
    let reuse = put_kv(&h, 1, "x", Some(lease_b.token), "w1", "v1").await;
    assert_eq!(
        (reuse.status, reuse.code(), reuse.replayed),
        (422, "idempotency_key_mismatch", false),
        "{reuse:?}"
    );

    phase("a new write with A's stale token is refused 412, and its key is left free");
    let stale = put_kv(&h, 1, "x", Some(lease_a.token), "w2", "v2").await;
    assert_eq!(
        (stale.status, stale.code()),
        (412, "stale_fencing_token"),
        "{stale:?}"
    );
    let b = put_kv(&h, 2, "x", Some(lease_b.token), "w2", "v2").await;
    assert_eq!((b.status, b.replayed), (200, false), "{b:?}");

    phase("the store saw exactly A's v1 then B's v2");
    let log = h.client.store_log().await;
    let writes: Vec<(&str, Option<u64>)> = log
        .iter()
        .map(|w| (w.value.as_str(), w.fence_token))
        .collect();
    assert_eq!(
        writes,
        [("v1", Some(lease_a.token)), ("v2", Some(lease_b.token))],
        "{log:#?}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t80_unreachable_upstream_releases_the_key() {
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .to_string();
    let h = FenceHarness::start_with(move |c| c.routes[1].upstream = closed).await;

    phase("no connection could be made: 502, and the key is not left in flight or unknown");
    for _ in 0..2 {
        let a = post_order(&h, 1, Some("nowhere"), "{}", &[]).await;
        assert_eq!((a.status, a.code()), (502, "upstream_error"), "{a:?}");
        assert!(
            a.body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("nothing was sent"),
            "{a:?}"
        );
    }
    let text = metrics_text(&h).await;
    let connect = r#"fencegate_proxy_upstream_errors_total{kind="connect""#;
    assert_eq!(summed(&text, connect), 2.0, "{text}");
    h.shutdown().await;
}

/// A store may apply a request some time after it received it. When the proxy's upstream
/// timeout ends the exchange first, the key stays in use until the owner's lease is over, so no
/// reconciliation lookup runs before the store has had that time: the retry then finds the
/// order and replays it instead of creating a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t81_a_request_applied_after_the_timeout_is_reconciled_not_run_twice() {
    let h = FenceHarness::start().await;
    let body = r#"{"item":"late"}"#;

    phase("the store applies the order 1.3 s after receiving it; the proxy gives up at 1 s");
    let a = post_order(&h, 1, Some("late-1"), body, &[("x-demo-delay-ms", "1300")]).await;
    assert_eq!((a.status, a.code()), (504, "upstream_timeout"), "{a:?}");
    let timeouts = r#"fencegate_proxy_upstream_errors_total{kind="timeout""#;
    assert_eq!(summed(&metrics_text(&h).await, timeouts), 1.0);

    phase("a retry at once is told the key is in use, with Retry-After");
    let b = post_order(&h, 2, Some("late-1"), body, &[("x-demo-delay-ms", "1300")]).await;
    assert_eq!(
        (b.status, b.code()),
        (409, "idempotency_key_in_use"),
        "{b:?}"
    );
    assert!(b.retry_after.is_some(), "{b:?}");

    phase("after the owner's lease the retry is reconciled with the order the store made");
    let settled = post_until_settled(&h, 3, "late-1", body).await;
    assert_eq!(
        (settled.status, settled.reconciled),
        (200, true),
        "{settled:?}"
    );
    assert_eq!(orders_with_key(&h, "late-1").await.len(), 1, "one effect");
    h.shutdown().await;
}

/// On a route whose tenant comes from a header, a request without it belongs to the route's
/// default tenant: the store must hear the same tenant the reconciliation lookup asks for, or
/// the lookup misses the request's own effect and the request runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t82_the_default_tenant_reaches_the_store_and_its_lookup_alike() {
    let h = FenceHarness::start_with(|c| {
        let orders = c
            .routes
            .iter_mut()
            .find(|r| r.path == "/orders")
            .expect("orders route");
        orders.idempotency_options.default_tenant = "acme".into();
    })
    .await;
    let body = r#"{"item":"anvil"}"#;

    phase("no X-Tenant: the order is made, its answer is lost to the upstream timeout");
    let a = post_order(
        &h,
        1,
        Some("dflt-1"),
        body,
        &[("x-demo-answer-delay-ms", "1500")],
    )
    .await;
    assert_eq!((a.status, a.code()), (504, "upstream_timeout"), "{a:?}");

    phase("the retry is reconciled: the lookup for tenant acme finds the order");
    let settled = post_until_settled(&h, 2, "dflt-1", body).await;
    assert_eq!(
        (settled.status, settled.reconciled),
        (200, true),
        "{settled:?}"
    );
    let orders = orders_with_key(&h, "dflt-1").await;
    assert_eq!(orders.len(), 1, "one effect: {orders:?}");
    assert_eq!(orders[0].tenant.as_deref(), Some("acme"), "{orders:?}");
    h.shutdown().await;
}

/// A `Content-Disposition` whose filename is UTF-8, as stores send it.
const DISPOSITION: &[u8] = "attachment; filename=\"résumé.pdf\"".as_bytes();
/// An answer body past what the proxy holds whole (1 MiB).
const BIG: usize = 3 << 20;

fn big_body() -> Vec<u8> {
    (0..BIG).map(|i| (i % 251) as u8).collect()
}

/// A store that answers `POST` bodies naming `big` with 201 and [`BIG`] bytes (with
/// [`DISPOSITION`]), the last MiB only once `release` is notified, and any other with 204; its
/// address, how many requests it answered, and `release`.
async fn answering_upstream() -> (String, Arc<AtomicUsize>, Arc<tokio::sync::Notify>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    let release = Arc::new(tokio::sync::Notify::new());
    let released = release.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let count = count.clone();
            let released = released.clone();
            tokio::spawn(async move {
                while let Some((_, body)) = common::read_request_with_body(&mut conn).await {
                    count.fetch_add(1, Ordering::SeqCst);
                    let mut answer = Vec::new();
                    if String::from_utf8_lossy(&body).contains("big") {
                        answer.extend_from_slice(b"HTTP/1.1 201 Created\r\nContent-Disposition: ");
                        answer.extend_from_slice(DISPOSITION);
                        answer.extend_from_slice(
                            format!("\r\nContent-Length: {BIG}\r\n\r\n").as_bytes(),
                        );
                        let body = big_body();
                        let (early, last) = body.split_at(BIG - (1 << 20));
                        answer.extend_from_slice(early);
                        if conn.write_all(&answer).await.is_err() {
                            return;
                        }
                        released.notified().await;
                        answer = last.to_vec();
                    } else {
                        answer.extend_from_slice(b"HTTP/1.1 204 No Content\r\n\r\n");
                    }
                    if conn.write_all(&answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, answered, release)
}

/// An answer larger than the proxy holds whole is relayed as it arrives: the client gets every
/// byte, and a retry replays its status and headers with the body's length and digest. Header
/// values outside ASCII pass byte for byte, first and replayed, and a 204 gets no
/// `Content-Length`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t83_large_answers_are_relayed_and_header_bytes_kept() {
    let (upstream, answered, release) = answering_upstream().await;
    let h = FenceHarness::start_with(move |c| c.routes[1].upstream = upstream).await;
    let addr = h.client.proxy_addr(1).expect("proxy runs");
    let client = reqwest::Client::new();
    let post = |key: &'static str, body: &'static str| {
        client
            .post(format!("http://{addr}/orders"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .timeout(Duration::from_secs(20))
            .body(body)
            .send()
    };

    phase("a 3 MiB answer reaches the client whole, with its header's bytes");
    let mut r = post("big-1", r#"{"kind":"big"}"#).await.expect("POST");
    assert_eq!(r.status().as_u16(), 201);
    assert_eq!(r.headers()["content-disposition"].as_bytes(), DISPOSITION);
    assert!(r.headers().get("idempotent-replayed").is_none());
    // The store holds back its last MiB until the client has more than the proxy would hold
    // whole: an answer buffered before it is sent never gets that far.
    let mut body = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while body.len() <= 1 << 20 {
            let piece = r.chunk().await.expect("body").expect("more body");
            body.extend_from_slice(&piece);
        }
    })
    .await
    .expect("the answer's first MiB was relayed before the store finished it");
    release.notify_one();
    while let Some(piece) = r.chunk().await.expect("body") {
        body.extend_from_slice(&piece);
    }
    assert_eq!(body.len(), BIG);
    assert!(body == big_body(), "the body differs");

    phase("its retry is a replay: status, headers, and the body's length and digest");
    let r = post("big-1", r#"{"kind":"big"}"#).await.expect("POST");
    assert_eq!(r.status().as_u16(), 201);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(r.headers()["content-disposition"].as_bytes(), DISPOSITION);
    let omitted = r.headers()["idempotent-body-omitted"]
        .to_str()
        .expect("ascii")
        .to_string();
    let digest = fencegate_proxy::idempotency::contract::digest(&big_body());
    assert_eq!(omitted, format!("len={BIG}; blake2b={digest}"));
    assert!(r.bytes().await.expect("body").is_empty());

    phase("a 204 has no Content-Length, first and replayed");
    for replayed in [false, true] {
        let r = post("empty-1", r#"{"kind":"empty"}"#).await.expect("POST");
        assert_eq!(r.status().as_u16(), 204);
        assert_eq!(r.headers().contains_key("idempotent-replayed"), replayed);
        assert!(
            r.headers().get("content-length").is_none(),
            "{:?}",
            r.headers()
        );
    }
    assert_eq!(
        answered.load(Ordering::SeqCst),
        2,
        "a replay reached the store"
    );
    h.shutdown().await;
}

/// A connection to proxy 1 that has sent `POST /orders` with the key `key`, the `framing`
/// header lines and `body_start`.
async fn order_sent_raw(
    h: &FenceHarness,
    key: &str,
    framing: &str,
    body_start: &str,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let addr = h.client.proxy_addr(1).expect("proxy runs");
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Idempotency-Key: {key}\r\n{framing}\r\n\r\n{body_start}"
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    conn
}

/// A body over the limit sent after `100 Continue` (chunked, so its size was not known before)
/// gets the 413, not a connection closed under the client's feet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t84_an_oversized_body_after_100_continue_gets_its_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = FenceHarness::start().await;
    let framing = "Expect: 100-continue\r\nTransfer-Encoding: chunked";
    let mut conn = order_sent_raw(&h, "huge-1", framing, "").await;
    let interim = common::read_head(&mut conn).await.expect("100 Continue");
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    // 4 MiB: far more than the sockets' buffers hold, so the client is still sending when the
    // proxy has decided.
    let mut chunk = format!("{:x}\r\n", 16 << 10).into_bytes();
    chunk.extend_from_slice(&[b'x'; 16 << 10]);
    chunk.extend_from_slice(b"\r\n");
    let mut sent = true;
    for _ in 0..256 {
        if conn.write_all(&chunk).await.is_err() {
            sent = false;
            break;
        }
    }
    sent = sent && conn.write_all(b"0\r\n\r\n").await.is_ok();
    assert!(
        sent,
        "the proxy closed the connection while the body was being sent"
    );
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    h.shutdown().await;
}

/// A body that trickles in is bounded as a whole: it gets 408 after 10 s, and nothing reaches
/// the store. (Bounded only per read, a client sending one byte every few seconds held its
/// connection, and a few thousand such clients held all of a proxy's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t85_a_body_that_trickles_in_gets_its_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = FenceHarness::start().await;
    let conn = order_sent_raw(&h, "slow-1", "Content-Length: 40", "{").await;
    let (mut reader, mut writer) = conn.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), reader.read_to_end(&mut answer)).await;
    trickle.abort();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(
        h.client.store_log().await.is_empty(),
        "nothing reached the store"
    );
    h.shutdown().await;
}

/// A node restored from a backup has only the backup's records: a key first used after the
/// backup is new to it. On a route with a lookup it asks the store before forwarding such a key
/// (for as long as the key could still be retried), so the lost cluster's effect is replayed,
/// not made twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t86_a_restored_node_asks_the_store_about_keys_it_has_no_record_of() {
    let mut h = FenceHarness::start().await;
    let body = r#"{"item":"lamp"}"#;

    phase("the lost cluster's effect: an order with key lost-1 the restored records lack");
    let created = reqwest::Client::new()
        .post(format!("http://{}/orders", h.client.store_addr))
        .header("idempotency-key", "lost-1")
        .header("x-tenant", "acme")
        .body(body)
        .send()
        .await
        .expect("the lost attempt's effect");
    assert_eq!(created.status().as_u16(), 201);

    phase("without a restore, the key is new: it runs (the documented limit of a lookup)");
    let plain = post_order(&h, 1, Some("lost-0"), body, &[("x-tenant", "acme")]).await;
    assert_eq!((plain.status, plain.replayed), (201, false), "{plain:?}");

    phase("node 2 was made by a restore a moment ago");
    let dir = h.cluster.config(2).data_dir;
    h.crash(2).await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    std::fs::write(
        dir.join(lock_core::node::RESTORED_FILE),
        format!("{now_ms}\n"),
    )
    .unwrap();
    h.restart(2).await;
    h.leader().await;

    phase("its proxy finds the lost effect and replays it; a key the store lacks runs once");
    let found = post_until_settled_with(&h, 2, "lost-1", body, &[("x-tenant", "acme")]).await;
    assert_eq!(
        (found.status, found.replayed, found.reconciled),
        (200, true, true),
        "{found:?}"
    );
    assert_eq!(orders_with_key(&h, "lost-1").await.len(), 1);
    let fresh = post_order(&h, 2, Some("new-1"), body, &[("x-tenant", "acme")]).await;
    assert_eq!((fresh.status, fresh.replayed), (201, false), "{fresh:?}");
    assert_eq!(orders_with_key(&h, "new-1").await.len(), 1);
    let again = post_order(&h, 1, Some("new-1"), body, &[("x-tenant", "acme")]).await;
    assert_eq!((again.status, again.replayed), (201, true), "{again:?}");
    h.shutdown().await;
}
