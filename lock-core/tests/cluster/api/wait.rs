//! Waiting acquires: the FIFO queue and its bound, hand-off to exactly one waiter, and waiters
//! that time out, disconnect or hang up mid-commit.

use std::time::{Duration, Instant};

use lock_core::node::Policy;
use lock_core::testkit::{phase, TestCluster};
use serde_json::json;

use super::support::{
    answer, assert_error, assert_free, assert_grant, lock_path, metrics, release, sample,
    spawn_post, spawn_waiter, wait_for_lock, wait_waiters,
};

/// Queues are bounded per resource: beyond the bound a waiting acquire is refused, not queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_queue_is_bounded_with_too_many_waiters() {
    let policy = Policy {
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

    phase("queues are bounded: a third waiter gets 429 too_many_waiters and is not queued");
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
    let (s, r) = release(&c, leader, "busy:q", &lease).await;
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
        assert_error(&answer(h).await, 409, "wait_cancelled", &[]);
    }
    let (s, _) = release(&c, leader, "busy:q", &lease_w1).await;
    assert_eq!(s, 200);
    let (s, _) = release(&c, leader, "busy:other", &lease2).await;
    assert_eq!(s, 200);
    c.shutdown().await;
}

/// Waits are bounded per node too: each holds a connection, and a quarter of the API's
/// connections are kept for everything else, so a crowd of waiters cannot starve the renewals,
/// releases and health checks of the node they wait on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_leave_a_quarter_of_the_connections_for_other_calls() {
    let c = TestCluster::start_adjusted(3, |cfg| cfg.limits.max_connections = 8).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader)[0];
    let got = c.acquire(leader, "crowd:a", "holder", 30_000).await;
    let (lease, _) = assert_grant(&got, "crowd:a", 30_000);

    phase("six waits on one node: three quarters of its 8 connections");
    let mut waiters = Vec::new();
    for i in 0..6 {
        waiters.push(spawn_waiter(&c, f, "crowd:a", &format!("w-{i}"), 20_000));
        wait_waiters(&c, leader, "crowd:a", i + 1).await;
    }

    phase("a seventh wait there is refused; other calls on that node are still served");
    let got = c
        .post(
            f,
            &lock_path("crowd:a", "acquire"),
            json!({ "request_id": "w-7", "wait_timeout_ms": 5_000 }),
        )
        .await;
    assert_error(&got, 429, "too_many_waiters", &[]);
    let got = c.acquire(f, "crowd:a", "try-once", 5_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    assert_eq!(c.get(f, "/readyz").await.0, 200);
    let elsewhere = spawn_waiter(&c, leader, "crowd:a", "w-7", 20_000);
    wait_waiters(&c, leader, "crowd:a", 7).await;

    phase("the waits end in order: the first is handed the lock");
    let (s, _) = release(&c, f, "crowd:a", &lease).await;
    assert_eq!(s, 200);
    let mut waiters = waiters.into_iter();
    let first = waiters.next().expect("a waiter");
    let (lease, _) = assert_grant(&answer(first).await, "crowd:a", 30_000);
    for (i, _) in waiters.enumerate() {
        let (s, r) = c
            .post(
                leader,
                &lock_path("crowd:a", "cancel"),
                json!({ "request_id": format!("w-{}", i + 1) }),
            )
            .await;
        assert_eq!(s, 200, "{r}");
    }
    let (s, r) = c
        .post(
            leader,
            &lock_path("crowd:a", "cancel"),
            json!({ "request_id": "w-7" }),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_error(&answer(elsewhere).await, 409, "wait_cancelled", &[]);
    let (s, _) = release(&c, leader, "crowd:a", &lease).await;
    assert_eq!(s, 200);
    c.shutdown().await;
}

/// FIFO hand-off without a thundering herd: each release wakes only the head waiter, which gets
/// a strictly larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_hands_off_to_waiters_in_fifo_order() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("hold the lock");
    let got = c.acquire(leader, "fifo:a", "fifo-0", 30_000).await;
    let (mut lease, mut token) = assert_grant(&got, "fifo:a", 30_000);

    phase("FIFO: three waiters queue in order, each on a different node");
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
            "release hands off to waiter {} only (no thundering herd)",
            i + 1
        ));
        let releaser = [f[1], f[0], leader][i];
        let (s, r) = release(&c, releaser, "fifo:a", &lease).await;
        assert_eq!((s, r), (200, json!({ "released": true })));
        let head = waiters.remove(0);
        let (next_lease, next_token) = assert_grant(&answer(head).await, "fifo:a", 30_000);
        // Tokens only grow: every grant, including a hand-off, takes a strictly larger token.
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
    let (s, r) = release(&c, leader, "fifo:a", &lease).await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    assert_free(&c, f[1], "fifo:a").await;
    c.shutdown().await;
}

/// A waiter that times out, or whose client goes away, is removed from the queue and never
/// handed the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_time_out_or_disconnect_leave_the_queue() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("hold the lock");
    let got = c.acquire(leader, "gone:a", "gone-holder", 30_000).await;
    let (lease, _) = assert_grant(&got, "gone:a", 30_000);

    phase("a wait that times out answers 409 lock_held and is removed");
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
    // And says when the lease it waited behind ends, as a try-once acquire would.
    let retry_after = got.1["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(
        (20_000..=30_000).contains(&retry_after),
        "the holder's lease has ~29.5 s left: {}",
        got.1
    );
    wait_waiters(&c, leader, "gone:a", 0).await;
    // Counted as a wait that timed out, not as a refusal at once.
    let text = metrics(&c, f[0]).await;
    let outcome = |text: &str, outcome: &str| {
        sample(
            text,
            "fencegate_op_outcomes_total",
            &[("op", "acquire"), ("outcome", outcome)],
        )
    };
    assert_eq!(outcome(&text, "wait_timeout"), 1.0);
    assert_eq!(outcome(&text, "lock_held"), 0.0);

    phase("a waiter whose client goes away (task aborted) is removed");
    let aborted = spawn_waiter(&c, f[1], "gone:a", "gone-abort", 20_000);
    wait_waiters(&c, leader, "gone:a", 1).await;
    aborted.abort();
    wait_waiters(&c, leader, "gone:a", 0).await;

    phase("a waiter whose client times out (reqwest timeout) is removed");
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

    phase("the calls their callers gave up on are counted and audited as abandoned");
    let cluster = &c;
    let abandoned = |node| async move {
        let text = metrics(cluster, node).await;
        let (s, tail) = cluster
            .get(node, "/v1/admin/audit?outcome=abandoned&resource=gone:a")
            .await;
        assert_eq!(s, 200, "{tail}");
        (
            outcome(&text, "abandoned"),
            tail["entries"].as_array().map_or(0, Vec::len),
        )
    };
    assert_eq!(abandoned(f[0]).await, (1.0, 1), "the client that timed out");
    assert_eq!(abandoned(f[1]).await, (1.0, 1), "the aborted client");

    phase("nobody is left to hand off to: release leaves the lock free");
    let (s, r) = release(&c, f[1], "gone:a", &lease).await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    assert_free(&c, leader, "gone:a").await;
    c.shutdown().await;
}

/// A waiting acquire whose caller hangs up while it is being committed must not have its lease
/// released behind the retry's back (found by the chaos harness). A retry with the same
/// request_id gets the original lease back, and it is live: the holder can renew it.
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

/// A node that shuts down answers the waits queued through it at once (503 `node_stopped`)
/// rather than cutting them off, and leaves them queued: the caller's retry with the same
/// request_id on another node is still in its place and is handed the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_shutting_down_answers_its_waiters_who_keep_their_place() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("a held lock, a waiter through a follower");
    let got = c.acquire(leader, "stop:a", "stop-holder", 30_000).await;
    let (lease, _) = assert_grant(&got, "stop:a", 30_000);
    let waiting = spawn_waiter(&c, f[0], "stop:a", "stop-w", 20_000);
    wait_waiters(&c, leader, "stop:a", 1).await;

    phase("the follower shuts down: the waiter hears 503 node_stopped, not a cut connection");
    c.stop(f[0]).await;
    let got = answer(waiting).await;
    assert_error(&got, 503, "node_stopped", &[]);

    phase("its wait is still queued; the retry elsewhere takes its place and gets the lock");
    wait_waiters(&c, leader, "stop:a", 1).await;
    let retry = spawn_waiter(&c, f[1], "stop:a", "stop-w", 20_000);
    tokio::time::sleep(Duration::from_millis(200)).await;
    wait_waiters(&c, leader, "stop:a", 1).await;
    let (s, v) = c
        .post(
            leader,
            &lock_path("stop:a", "release"),
            json!({ "lease_id": lease }),
        )
        .await;
    assert_eq!((s, &v["released"]), (200, &json!(true)), "{v}");
    let got = answer(retry).await;
    assert_grant(&got, "stop:a", 30_000);
    c.shutdown().await;
}
