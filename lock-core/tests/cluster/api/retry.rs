//! Idempotent retries: the same request id returns the original result, on any node, and never
//! a second lease or waiter.

use std::time::{Duration, Instant};

use lock_core::testkit::{phase, TestCluster};
use serde_json::json;

use super::support::{
    answer, assert_error, assert_grant, release, renew, spawn_waiter, wait_waiters,
};

/// A retried acquire returns the original result — on any node, after release, while
/// waiting — and never creates a second lease or waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_acquire_returns_the_original_result() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("first acquire");
    let got = c.acquire(f[0], "retry:a", "retry-1", 10_000).await;
    let (lease, token) = assert_grant(&got, "retry:a", 10_000);

    phase("a retry returns the original result: on every node the same lease and token");
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

    phase("after release, a retry still returns the original result and grants nothing");
    let (s, r) = release(&c, f[1], "retry:a", &lease).await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let got = c.acquire(leader, "retry:a", "retry-1", 10_000).await;
    assert_eq!(
        assert_grant(&got, "retry:a", 10_000),
        (lease.clone(), token)
    );
    let (s, v) = c.get(f[0], "/v1/locks/retry:a").await;
    assert_eq!(s, 200);
    assert_eq!(v["held"], false, "the retry must not re-acquire: {v}");
    let got = renew(&c, f[0], "retry:a", &lease).await;
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

    phase("a retried waiting acquire joins the same wait, never a second waiter");
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

    phase("a try-once retry of the waiting request reports lock_held and changes nothing");
    let got = c.acquire(f[1], "retry:a", "retry-w", 30_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    let v = wait_waiters(&c, leader, "retry:a", 1).await;
    assert_eq!(v["fencing_token"].as_u64(), Some(token2), "{v}");
    assert!(
        !w.is_finished() && !w_again.is_finished(),
        "the original wait goes on"
    );
    let (s, r) = release(&c, leader, "retry:a", &lease2).await;
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
