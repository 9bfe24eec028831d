//! Retries and cancels: a lost answer is retried with the same request id, a replayed grant of
//! an ended lease is refused, and a dropped waiting acquire cancels its wait.

use std::time::Duration;

use lock_core::client::{AcquireOptions, Client, ClientOptions, Error};
use lock_core::testkit::{eventually, phase, TcpRelay, TestCluster};

use super::{direct_client, lock_status, SEC};

/// A retried acquire returns the original result: the client retries a lost answer with the
/// same request id and gets the one lease that was committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_lost_acquire_answer_then_retry_returns_the_same_lease() {
    let c = TestCluster::start(3).await;
    let id = c.running()[0];
    let relay = TcpRelay::start(&c.addrs[&id]).await;
    let mut opts = ClientOptions::default();
    opts.request_timeout = Duration::from_millis(500);
    let client = Client::with_options([relay.url()], opts).expect("client");

    phase("the node commits the first acquire, but its answer is lost on the way back");
    relay.drop_answers_on_next(1);
    let a = client
        .acquire(
            "kv:retry",
            AcquireOptions::new(5 * SEC).request_id("retry-req-1"),
        )
        .await
        .expect("acquire succeeds on retry");
    assert!(
        relay.connections() >= 2,
        "the client retried on a new connection"
    );

    phase("a retry returns the original result: same request id, same lease and token");
    let (s, v) = c.acquire(id, "kv:retry", "retry-req-1", 5_000).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["lease_id"].as_str(),
        Some(a.lease_id().to_string().as_str())
    );
    assert_eq!(v["fencing_token"].as_u64(), Some(a.token()));
    let (s, v) = c.acquire(id, "kv:retry", "someone-else", 5_000).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (409, Some("lock_held")),
        "only one lease exists"
    );
    assert!(a.is_valid());
    assert!(a.release().await.expect("release"));
    c.shutdown().await;
}

/// One lease at a time, on the client: a retry that replays a grant whose lease already ended
/// is an error, never a lease the caller could trust.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t31_a_replayed_grant_of_an_ended_lease_is_not_handed_out() {
    let c = TestCluster::start(3).await;
    let id = c.running()[0];
    let relay = TcpRelay::start(&c.addrs[&id]).await;
    let mut opts = ClientOptions::default();
    // The retry comes at least 1.5 s after the first attempt was sent, when the 1 s lease
    // granted by that attempt has certainly run out.
    opts.request_timeout = Duration::from_millis(1_500);
    let client = Client::with_options([relay.url()], opts).expect("client");

    phase("the first acquire commits but its answer is lost; the client will retry");
    relay.drop_answers_on_next(1);
    let acquiring = tokio::spawn(async move {
        client
            .acquire("kv:replay", AcquireOptions::new(SEC).request_id("replay-1"))
            .await
    });
    eventually(5 * SEC, "the first acquire is committed", async || {
        lock_status(&c, "kv:replay").await["held"] == true
    })
    .await;

    phase("before the retry, the granted lease expires");
    eventually(5 * SEC, "the lease expired", async || {
        lock_status(&c, "kv:replay").await["held"] == false
    })
    .await;

    phase("the retry replays the original, now dead, grant; the client must not trust it");
    match acquiring.await.expect("join") {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(relay.connections() >= 2, "the client retried");
    c.shutdown().await;
}

/// A process that continues another's acquire with the same (caller-chosen) request id — say
/// after a restart — gets the deduplicated original grant. The client verifies it with a renew
/// instead of trusting it from its own send time: a lease that has already ended is an error,
/// a live one gets a deadline measured from the renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t32_a_reused_request_id_is_verified_before_it_is_trusted() {
    let c = TestCluster::start(3).await;
    let first = direct_client(&c);

    phase("a first process acquires with request id job-7 (1 s lease) and goes away");
    let guard = first
        .acquire("kv:restart", AcquireOptions::new(SEC).request_id("job-7"))
        .await
        .expect("first acquire");
    let _lease = guard.detach();
    eventually(5 * SEC, "the lease expired", async || {
        lock_status(&c, "kv:restart").await["held"] == false
    })
    .await;

    phase("a restarted process continues with the same request id: refused, not trusted");
    let second = direct_client(&c);
    match second
        .acquire("kv:restart", AcquireOptions::new(SEC).request_id("job-7"))
        .await
    {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("expected LeaseLost for a replayed ended grant, got {other:?}"),
    }
    c.shutdown().await;
}

/// Dropping a waiting acquire cancels its wait on the server, so the lock is never handed to a
/// caller that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_dropping_a_waiting_acquire_cancels_the_waiter() {
    let c = TestCluster::start(3).await;
    let holder = direct_client(&c);
    let id = c.running()[0];
    // The relay hides B's hang-up from the node: only the client's own cancel can remove B.
    let relay = TcpRelay::start(&c.addrs[&id]).await;
    let b_client = Client::new([relay.url()]).expect("client");

    phase("A holds kv:queue; B queues with a 30 s wait");
    let a = holder
        .acquire("kv:queue", AcquireOptions::new(5 * SEC))
        .await
        .expect("acquire");
    let b = tokio::spawn(async move {
        b_client
            .acquire(
                "kv:queue",
                AcquireOptions::new(5 * SEC).wait_timeout(30 * SEC),
            )
            .await
    });
    eventually(5 * SEC, "B is queued", async || {
        lock_status(&c, "kv:queue").await["waiters"] == 1
    })
    .await;

    phase("B's acquire future is dropped: the client cancels the wait on the server");
    b.abort();
    assert!(b.await.expect_err("aborted").is_cancelled());
    eventually(5 * SEC, "B's wait is removed", async || {
        lock_status(&c, "kv:queue").await["waiters"] == 0
    })
    .await;

    phase("A releases: the lock is free, not handed to the departed waiter");
    assert!(a.release().await.expect("release"));
    let s = lock_status(&c, "kv:queue").await;
    assert_eq!(s["held"].as_bool(), Some(false), "{s}");
    c.shutdown().await;
}

/// A grant nobody saw does not hold the lock for a whole TTL: the lock is handed to a waiter
/// whose answer is lost on the way back, and the waiter's acquire future is then dropped. The
/// node's cancel cannot end a granted lease (only its lease id can), so the client replays the
/// acquire with the same request id, which returns that grant, and releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_a_handed_off_grant_whose_answer_was_lost_is_released_on_drop() {
    let c = TestCluster::start(3).await;
    let holder = direct_client(&c);
    let id = c.running()[0];
    // The relay loses B's answer and hides B's hang-up from the node.
    let relay = TcpRelay::start(&c.addrs[&id]).await;
    let b_client = Client::new([relay.url()]).expect("client");

    phase("A holds kv:unseen; B queues through a relay that will lose the node's answer");
    let a = holder
        .acquire("kv:unseen", AcquireOptions::new(30 * SEC))
        .await
        .expect("acquire");
    relay.drop_answers_on_next(1);
    let b = tokio::spawn(async move {
        b_client
            .acquire(
                "kv:unseen",
                AcquireOptions::new(60 * SEC)
                    .wait_timeout(30 * SEC)
                    .holder("b"),
            )
            .await
    });
    eventually(10 * SEC, "B is queued", async || {
        lock_status(&c, "kv:unseen").await["waiters"] == 1
    })
    .await;

    phase("A releases: the lock is handed to B, whose answer never arrives");
    assert!(a.release().await.expect("release"));
    eventually(10 * SEC, "B holds the lock", async || {
        let s = lock_status(&c, "kv:unseen").await;
        s["held"] == true && s["holder"] == "b"
    })
    .await;

    phase("B's acquire future is dropped: its unseen grant is released, not kept for 60 s");
    b.abort();
    assert!(b.await.expect_err("aborted").is_cancelled());
    eventually(20 * SEC, "the lock is free again", async || {
        lock_status(&c, "kv:unseen").await["held"] == false
    })
    .await;
    c.shutdown().await;
}

/// A wait cancelled by someone else (`cancel` with the request id, as `fencegate lock cancel`
/// sends it) ends the acquire with `wait_cancelled`: the client does not queue again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t52_a_wait_cancelled_by_another_caller_ends_the_acquire() {
    let c = TestCluster::start(3).await;
    let holder = direct_client(&c);
    let waiter = direct_client(&c);

    phase("A holds kv:cancelled; B queues with a 30 s wait and its own request id");
    let a = holder
        .acquire("kv:cancelled", AcquireOptions::new(5 * SEC))
        .await
        .expect("acquire");
    let b = tokio::spawn(async move {
        waiter
            .acquire(
                "kv:cancelled",
                AcquireOptions::new(5 * SEC)
                    .wait_timeout(30 * SEC)
                    .request_id("b-wait"),
            )
            .await
    });
    eventually(5 * SEC, "B is queued", async || {
        lock_status(&c, "kv:cancelled").await["waiters"] == 1
    })
    .await;

    phase("another caller cancels B's request id: B's acquire ends, nobody waits");
    let leader = c.wait_leader(5 * SEC).await;
    let (status, body) = c
        .post(
            leader,
            "/v1/locks/kv:cancelled/cancel",
            serde_json::json!({"request_id": "b-wait"}),
        )
        .await;
    assert_eq!(
        (status, &body["cancelled"]),
        (200, &serde_json::json!(true)),
        "{body}"
    );
    let ended = tokio::time::timeout(10 * SEC, b)
        .await
        .expect("B's acquire ends")
        .expect("task");
    match ended {
        Err(Error::Api { code, .. }) => assert_eq!(code, "wait_cancelled"),
        other => panic!("B's acquire did not end with wait_cancelled: {other:?}"),
    }
    let s = lock_status(&c, "kv:cancelled").await;
    assert_eq!(s["waiters"], 0, "{s}");

    phase("A releases: the lock is free, not handed to the cancelled waiter");
    assert!(a.release().await.expect("release"));
    let s = lock_status(&c, "kv:cancelled").await;
    assert_eq!(s["held"].as_bool(), Some(false), "{s}");
    c.shutdown().await;
}
