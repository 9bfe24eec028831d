//! The client library on real 3-node clusters (issue 3; SPEC §3, §4). Each test reads as
//! phases; faults between client and cluster come from `TcpRelay` (tests/support).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use lock_core::client::{
    backoff_delay, renew_delay, AcquireOptions, Client, ClientOptions, Error, LostReason,
};
use lock_core::testkit::{eventually, phase, TcpRelay, TestCluster};
use rand::SeedableRng;
use reqwest::Method;

const SEC: Duration = Duration::from_secs(1);

fn direct_client(c: &TestCluster) -> Client {
    Client::new(c.addrs.values().map(|a| format!("http://{a}"))).expect("client")
}

async fn lock_status(c: &TestCluster, resource: &str) -> serde_json::Value {
    let id = c.running()[0];
    let (s, v) = c.get(id, &format!("/v1/locks/{resource}")).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// One write the stand-in store accepted: key, Fence-Token, Fence-Resource, body.
type Write = (String, Option<u64>, Option<String>, String);

/// A tiny store that accepts `PUT /kv/{key}` and records what arrived with which headers. It
/// checks nothing: it shows what a fenced writer actually sends.
#[derive(Clone, Default)]
struct Store {
    writes: Arc<Mutex<Vec<Write>>>,
}

impl Store {
    async fn start() -> (String, Store) {
        let store = Store::default();
        let app = axum::Router::new()
            .route("/kv/{key}", axum::routing::put(store_put))
            .with_state(store.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(l, app).await.ok() });
        (url, store)
    }

    fn writes(&self) -> Vec<Write> {
        self.writes.lock().expect("lock").clone()
    }
}

async fn store_put(
    State(store): State<Store>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let token = header("fence-token").and_then(|t| t.parse().ok());
    store
        .writes
        .lock()
        .expect("lock")
        .push((key, token, header("fence-resource"), body));
    StatusCode::OK
}

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

    phase("3.5 TTLs pass; background renewals keep the lease (SPEC §4 renew)");
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
    assert!(b.token() > token, "SPEC §3.2: {} > {token}", b.token());
    assert!(b.is_valid());
    assert!(b.release().await.expect("release"));
    c.shutdown().await;
}

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

    phase("A had reported invalid before B's grant was observed (SPEC §3.1 on the client)");
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

    phase("A's network heals: its late release never touches B's lease (SPEC §3.4)");
    for r in &relays {
        r.stall(false);
    }
    assert!(!a.release().await.expect("release"));
    let s = lock_status(&c, "kv:stall").await;
    assert_eq!(s["fencing_token"].as_u64(), Some(b.token()), "{s}");
    assert!(b.is_valid());
    c.shutdown().await;
}

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

    phase("the retry got the original lease (SPEC §3.6): same request id, same lease and token");
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

    phase(
        "the retry replays the original, now dead, grant (SPEC §3.6); the client must not trust it",
    );
    match acquiring.await.expect("join") {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(relay.connections() >= 2, "the client retried");
    c.shutdown().await;
}

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

    phase("renewals continue on the surviving nodes; the guard never turned invalid (SPEC §3.7)");
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

#[test]
fn t60_renew_delay_spreads_renewals_over_the_interval() {
    let ttl = Duration::from_secs(30);
    let nominal = ttl / 3;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let delays: Vec<Duration> = (0..1_000).map(|_| renew_delay(ttl, &mut rng)).collect();

    // Every renewal stays within ±20 % of ttl/3, so it comes well before the lease runs out.
    let lo = nominal.mul_f64(0.8);
    let hi = nominal.mul_f64(1.2);
    assert!(delays.iter().all(|d| (lo..=hi).contains(d)));

    // Spread: the picks cover most of the jitter window...
    let min = delays.iter().min().copied().unwrap_or_default();
    let max = delays.iter().max().copied().unwrap_or_default();
    assert!(max - min > nominal.mul_f64(0.35), "span {:?}", max - min);
    // ...and no tenth of it holds more than a quarter of the leases (uniform is ~10 %).
    let mut buckets = [0usize; 10];
    for d in &delays {
        let pos = (d.as_secs_f64() - lo.as_secs_f64()) / (hi - lo).as_secs_f64();
        buckets[((pos * 10.0) as usize).min(9)] += 1;
    }
    assert!(buckets.iter().all(|b| *b <= 250), "{buckets:?}");
    assert!(buckets.iter().all(|b| *b >= 50), "{buckets:?}");
}

#[test]
fn t61_retry_backoff_grows_with_jitter_and_stays_bounded() {
    let (base, max) = (Duration::from_millis(50), SEC);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for attempt in 1..=40u32 {
        let full = base.saturating_mul(1 << (attempt - 1).min(16)).min(max);
        let picks: Vec<Duration> = (0..200)
            .map(|_| backoff_delay(attempt, base, max, &mut rng))
            .collect();
        // Upper half of the (capped) exponential step: never a tight loop, never above the cap.
        assert!(
            picks.iter().all(|d| *d >= full / 2 && *d <= full),
            "attempt {attempt}"
        );
        // Jittered: clients that failed together do not retry together.
        let distinct: std::collections::BTreeSet<_> = picks.iter().collect();
        assert!(
            distinct.len() > 150,
            "attempt {attempt}: {} distinct",
            distinct.len()
        );
    }
}
