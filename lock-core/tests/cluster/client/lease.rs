//! The lease guard: renewals keep it alive, and it turns invalid — refusing fenced writes —
//! before the server could grant the lock to anyone else, whether the holder is partitioned or
//! paused; a failover does not make it invalid.

use std::time::{Duration, Instant};

use lock_core::client::{AcquireOptions, Client, Error, LostReason};
use lock_core::testkit::{eventually, phase, TcpRelay, TestCluster};
use reqwest::Method;

use super::store::Store;
use super::{direct_client, lock_status, SEC};

/// Background renewals keep a lease alive, with the same token, for as long as the holder
/// wants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_renewals_keep_a_lease_alive_past_three_ttls() {
    let c = TestCluster::start(3).await;
    let client = direct_client(&c);

    phase("A acquires with the policy's minimum TTL of 1 s");
    let a = client
        .acquire("kv:renew", AcquireOptions::new(SEC).holder("a"))
        .await
        .expect("acquire");
    let token = a.token();
    let first_deadline = a.deadline();
    assert!(a.is_valid());
    assert!(
        first_deadline <= Instant::now() + SEC,
        "deadline is at most send time + ttl"
    );

    phase("3.5 TTLs pass; background renewals keep the lease");
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(a.is_valid(), "lost: {:?}", a.lost_reason());
    assert!(a.renewals() >= 5, "only {} renewals in 3.5 s", a.renewals());
    assert!(a.deadline() > first_deadline + 2 * SEC);
    assert_eq!(a.token(), token, "renewal never changes the token");
    let s = lock_status(&c, "kv:renew").await;
    assert_eq!(
        (s["held"].as_bool(), s["fencing_token"].as_u64()),
        (Some(true), Some(token)),
        "{s}"
    );

    phase("a competitor without a wait gets lock_held as an error, not a retry");
    match client.acquire("kv:renew", AcquireOptions::new(SEC)).await {
        Err(Error::LockHeld { retry_after, .. }) => assert!(retry_after <= SEC),
        other => panic!("expected LockHeld, got {other:?}"),
    }

    phase("a waiting competitor gets the lock once A releases, with a larger token");
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .acquire("kv:renew", AcquireOptions::new(SEC).wait_timeout(10 * SEC))
                .await
        }
    });
    eventually(5 * SEC, "the competitor is queued", async || {
        lock_status(&c, "kv:renew").await["waiters"] == 1
    })
    .await;
    assert!(a.release().await.expect("release"));
    let b = waiter.await.expect("join").expect("waited acquire");
    assert!(
        b.token() > token,
        "tokens only grow: {} > {token}",
        b.token()
    );
    assert!(b.is_valid());
    assert!(b.release().await.expect("release"));
    c.shutdown().await;
}

/// One lease at a time, as the client sees it: a partitioned holder's guard turns invalid
/// before the server grants the lock to anyone else, and its fenced writes stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_partitioned_client_turns_invalid_before_another_holder_is_granted() {
    let c = TestCluster::start(3).await;
    let mut relays = Vec::new();
    for id in c.running() {
        relays.push(TcpRelay::start(&c.addrs[&id]).await);
    }
    let a_client = Client::new(relays.iter().map(TcpRelay::url)).expect("client");
    let b_client = direct_client(&c);
    let (store, writes) = Store::start().await;
    let http = reqwest::Client::new();
    let url = format!("{store}/kv/stall");

    phase("A acquires kv:stall (ttl 1 s) through the relays and writes once");
    let a = a_client
        .acquire("kv:stall", AcquireOptions::new(SEC))
        .await
        .expect("acquire");
    let resp = a
        .fenced_request(&http, Method::PUT, &url)
        .body("a-1")
        .send()
        .await
        .expect("write");
    assert_eq!(resp.status(), 200);
    let mut watch = a.watch();
    let a_lost_at = tokio::spawn(async move {
        watch.wait_for(|valid| !*valid).await.ok();
        Instant::now()
    });

    phase("all of A's traffic stalls: renewals hang, nothing is refused");
    for r in &relays {
        r.stall(true);
    }

    phase("B queues and is granted once the server expires A's lease");
    let b = b_client
        .acquire(
            "kv:stall",
            AcquireOptions::new(5 * SEC).wait_timeout(10 * SEC),
        )
        .await
        .expect("B acquires after A's lease expires");
    let b_granted_at = Instant::now();

    phase("one lease at a time, on the client: A reported invalid before B's grant was seen");
    let a_lost_at = a_lost_at.await.expect("join");
    assert!(
        a_lost_at < b_granted_at,
        "A lost at {a_lost_at:?}, B granted at {b_granted_at:?}"
    );
    assert!(a.deadline() < b_granted_at);
    assert!(!a.is_valid());
    assert_eq!(a.lost_reason(), Some(LostReason::Unconfirmed));
    assert!(b.token() > a.token());

    phase("A's fenced write is refused locally; B's goes through with B's token");
    match a
        .fenced_request(&http, Method::PUT, &url)
        .body("a-2")
        .send()
        .await
    {
        Err(Error::LeaseInvalid(LostReason::Unconfirmed)) => {}
        other => panic!("expected LeaseInvalid, got {other:?}"),
    }
    let resp = b
        .fenced_request(&http, Method::PUT, &url)
        .body("b-1")
        .send()
        .await
        .expect("write");
    assert_eq!(resp.status(), 200);
    let got = writes.writes();
    let expect = vec![
        (
            "stall".to_string(),
            Some(a.token()),
            Some("kv:stall".to_string()),
            "a-1".to_string(),
        ),
        (
            "stall".to_string(),
            Some(b.token()),
            Some("kv:stall".to_string()),
            "b-1".to_string(),
        ),
    ];
    assert_eq!(got, expect);

    phase("A's network heals: its late (stale) release never touches B's lease");
    for r in &relays {
        r.stall(false);
    }
    assert!(!a.release().await.expect("release"));
    let s = lock_status(&c, "kv:stall").await;
    assert_eq!(s["fencing_token"].as_u64(), Some(b.token()), "{s}");
    assert!(b.is_valid());
    c.shutdown().await;
}

/// The zombie on the client side: a process paused past its lease is invalid on waking and
/// sends no fenced write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t21_paused_process_is_invalid_on_waking_and_sends_no_fenced_write() {
    let c = TestCluster::start(3).await;
    let nodes: Vec<String> = c.addrs.values().map(|a| format!("http://{a}")).collect();
    let (store, writes) = Store::start().await;
    let url = format!("{store}/kv/pause");

    phase("A runs on its own single-threaded runtime, acquires (ttl 1 s), then the whole runtime stops for 2.5 s");
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel();
    let a_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let client = Client::new(nodes).expect("client");
            let a = client
                .acquire("kv:pause", AcquireOptions::new(SEC))
                .await
                .expect("acquire");
            acquired_tx.send(a.token()).expect("send");
            // A GC pause / SIGSTOP: nothing on this runtime runs, the renewal task included.
            std::thread::sleep(Duration::from_millis(2_500));
            let woke = Instant::now();
            let valid_on_waking = a.is_valid();
            let http = reqwest::Client::new();
            let write = a
                .fenced_request(&http, Method::PUT, &url)
                .body("zombie")
                .send()
                .await;
            (woke, valid_on_waking, write.map(|r| r.status().as_u16()))
        })
    });
    let a_token = acquired_rx.await.expect("A acquired");

    phase("B queues and is granted while A is paused");
    let b = direct_client(&c)
        .acquire(
            "kv:pause",
            AcquireOptions::new(5 * SEC).wait_timeout(10 * SEC),
        )
        .await
        .expect("B acquires");
    let b_granted_at = Instant::now();
    assert!(b.token() > a_token);

    phase("A wakes: invalid before running anything, and its write never leaves");
    let (woke, valid_on_waking, write) = tokio::task::spawn_blocking(move || a_thread.join())
        .await
        .expect("join")
        .expect("A's thread");
    assert!(b_granted_at < woke, "B was granted during A's pause");
    assert!(
        !valid_on_waking,
        "is_valid() reads the clock, not only the renewal task"
    );
    assert!(
        matches!(write, Err(Error::LeaseInvalid(LostReason::Unconfirmed))),
        "{write:?}"
    );
    assert!(writes.writes().is_empty(), "{:?}", writes.writes());
    c.shutdown().await;
}

/// A leader change never shortens a lease: renewals carry on through a failover and the guard
/// stays valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_leader_failover_during_renewals_keeps_the_lease() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(10 * SEC).await;
    // The leader first: the client's current node is the one that dies.
    let mut order = vec![leader];
    order.extend(c.followers(leader));
    let client =
        Client::new(order.iter().map(|id| format!("http://{}", c.addrs[id]))).expect("client");

    phase("A acquires (ttl 5 s) on the leader and renews once");
    let a = client
        .acquire("kv:failover", AcquireOptions::new(5 * SEC))
        .await
        .expect("acquire");
    let token = a.token();
    eventually(10 * SEC, "a first renewal", async || a.renewals() >= 1).await;

    phase("the leader crashes; a new one is elected");
    let before = a.renewals();
    c.crash(leader).await;
    let new_leader = c.wait_leader(10 * SEC).await;
    assert_ne!(new_leader, leader);

    phase("a leader change never shortens a lease: renewals go on; the guard stays valid");
    eventually(15 * SEC, "two renewals after the failover", async || {
        a.renewals() >= before + 2 || !a.is_valid()
    })
    .await;
    assert!(a.is_valid(), "lost: {:?}", a.lost_reason());
    assert_eq!(a.token(), token);
    let s = lock_status(&c, "kv:failover").await;
    assert_eq!(
        (s["held"].as_bool(), s["fencing_token"].as_u64()),
        (Some(true), Some(token)),
        "{s}"
    );
    assert!(a.release().await.expect("release"));
    c.shutdown().await;
}
