//! Cancel: a waiting acquire withdrawn by its request id.

use std::time::Duration;

use lock_core::testkit::{phase, TestCluster};
use serde_json::json;

use super::support::{
    answer, assert_error, assert_free, assert_grant, lock_path, release, spawn_waiter, wait_waiters,
};

/// Cancel removes a waiting acquire, which then never gets the lock.
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

    phase("cancel: through the other follower, by request_id -> {cancelled:true}");
    let (s, r) = c
        .post(
            f[1],
            &lock_path("can:a", "cancel"),
            json!({ "request_id": "can-w" }),
        )
        .await;
    assert_eq!((s, r), (200, json!({ "cancelled": true })));

    phase("the waiting request ends with 409 wait_cancelled and the queue is empty");
    assert_error(&answer(waiter).await, 409, "wait_cancelled", &[]);
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

    phase("a cancel without a valid request_id is 400");
    for body in [
        json!({}),
        json!({ "request_id": "" }),
        json!({ "request_id": "r".repeat(129) }),
    ] {
        let got = c.post(f[0], &lock_path("can:a", "cancel"), body).await;
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("the cancelled waiter got nothing: releasing the holder leaves the lock free");
    let (s, r) = release(&c, f[1], "can:a", &lease).await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    assert_free(&c, f[0], "can:a").await;
    c.shutdown().await;
}
