//! Acquire: a round trip through every node, the exact answer, refusal of a held lock, and
//! resource names with slashes.

use std::time::Duration;

use lock_core::testkit::{phase, raw_http, TestCluster};
use serde_json::json;

use super::support::{assert_error, assert_grant, lock_path, release, renew, wait_for_lock};

/// Any node accepts any call: acquire, renew, read and release go through followers and the
/// leader alike, and the next grant after a release takes a larger token.
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

/// One lease at a time: a grant has exactly the documented fields, and a held lock refuses a
/// second acquire without disturbing its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_grants_exact_fields_and_refuses_a_held_lock() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("acquire: 200 carries exactly resource, lease_id, fencing_token, ttl_ms, expires_at_ms");
    let got = c
        .post(
            f[0],
            &lock_path("acq:a", "acquire"),
            json!({ "request_id": "acq-1", "holder": "worker-7", "ttl_ms": 20_000 }),
        )
        .await;
    let (lease, token) = assert_grant(&got, "acq:a", 20_000);

    phase("acquire: ttl_ms defaults to 30000 and wait_timeout_ms to 0 (try once)");
    let got = c
        .post(
            leader,
            &lock_path("acq:b", "acquire"),
            json!({ "request_id": "acq-2" }),
        )
        .await;
    let (_, token_b) = assert_grant(&got, "acq:b", 30_000);
    // Tokens only grow, from one global counter across resources.
    assert!(token_b > token);

    phase("acquire: a held lock answers 409 lock_held with retry_after_ms within the TTL");
    let got = c.acquire(f[1], "acq:a", "acq-3", 5_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    // A positive retry_after_ms is the holder's remaining time: the refusal came from the
    // try-once path (wait_timeout_ms 0), not from a wait that timed out (which says 0).
    let retry = got.1["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(retry > 0 && retry <= 20_000, "retry_after_ms {retry}");

    phase("one lease at a time: the refused acquire left the original holder in place");
    let v = wait_for_lock(&c, leader, "acq:a", "held", |v| v["held"] == true).await;
    assert_eq!(v["holder"], "worker-7");
    assert_eq!(v["fencing_token"].as_u64(), Some(token));
    assert!(!v.to_string().contains(&lease));

    phase("the TTL policy bounds are inclusive: ttl 1000 and 300000 are accepted");
    let got = c.acquire(f[0], "acq:min", "acq-min", 1_000).await;
    assert_grant(&got, "acq:min", 1_000);
    let got = c.acquire(f[1], "acq:max", "acq-max", 300_000).await;
    assert_grant(&got, "acq:max", 300_000);

    phase("request_id and holder of exactly 128 chars are accepted");
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

/// A resource name may contain '/': raw and %2F-encoded spellings name the same resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_with_slashes_work_raw_and_percent_encoded() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("a resource may contain '/': a raw path acquires 'app/db/primary'");
    let got = c.acquire(f[0], "app/db/primary", "slash-1", 10_000).await;
    let (lease, token) = assert_grant(&got, "app/db/primary", 10_000);

    phase("the %2F-encoded name is the same resource: it is held");
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
    let (s, r) = renew(&c, f[1], "app%2Fdb%2Fprimary", &lease).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["fencing_token"].as_u64(), Some(token));
    let (s, r) = release(&c, leader, "app%2Fdb%2Fprimary", &lease).await;
    assert_eq!((s, r), (200, json!({ "released": true })));

    phase("a name ending in an action word: the last segment as sent is the action");
    let got = c.acquire(f[0], "jobs/acquire", "slash-3", 5_000).await;
    assert_grant(&got, "jobs/acquire", 5_000);
    let (s, v) = c.get(leader, "/v1/locks/jobs%2Facquire").await;
    assert_eq!(
        (s, &v["resource"], &v["held"]),
        (200, &json!("jobs/acquire"), &json!(true))
    );
    let got = c.get(leader, "/v1/locks/jobs/acquire").await;
    assert_error(&got, 405, "method_not_allowed", &[]);
    let got = c.acquire(f[1], "jobs%2Facquire", "slash-3b", 5_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    let got = c.get(leader, "/v1/locks/kv:demo/release").await;
    assert_error(&got, 405, "method_not_allowed", &[]);
    phase("an action word elsewhere in the name is fine");
    let got = c.acquire(f[0], "acquire/jobs", "slash-4", 5_000).await;
    assert_grant(&got, "acquire/jobs", 5_000);

    phase("'.' and '..' segments are part of the name, sent with '/' as %2F: their own locks");
    let got = c.acquire(f[0], "kv:a/b", "dot-0", 10_000).await;
    assert_grant(&got, "kv:a/b", 10_000);
    for (name, spelled) in [
        ("kv:a/./b", "kv:a%2F.%2Fb"),
        ("x/../kv:a/b", "x%2F..%2Fkv:a%2Fb"),
    ] {
        let got = c
            .acquire(f[1], spelled, &format!("dot-{name}"), 10_000)
            .await;
        assert_grant(&got, name, 10_000);
        let (s, v) = c.get(leader, &format!("/v1/locks/{spelled}")).await;
        assert_eq!((s, &v["resource"]), (200, &json!(name)), "{v}");
    }
    phase("'..' alone: URL parsers resolve it (and %2E%2E), a client sending it as is gets it");
    let body = r#"{"request_id":"dot-up","ttl_ms":10000}"#;
    let head = format!(
        "POST /v1/locks/../acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let got = raw_http::send(
        c.node(leader).addr,
        head.into_bytes(),
        vec![],
        Duration::ZERO,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(got.status, Some(200), "{got:?}");
    assert!(got.body.contains(r#""resource":"..""#), "{got:?}");
    c.shutdown().await;
}
