//! Options at their extremes: "forever" (`Duration::MAX`) is a very long bound, never a panic,
//! and values that make no sense are refused before anything is sent.

use std::time::Duration;

use lock_core::client::{AcquireOptions, Client, ClientOptions, Error};
use lock_core::testkit::{eventually, phase, TestCluster};

use super::{lock_status, SEC};

fn client_with(c: &TestCluster, opts: ClientOptions) -> Client {
    Client::with_options(c.addrs.values().map(|a| format!("http://{a}")), opts).expect("client")
}

/// Every duration option at `Duration::MAX`: the acquire works, and the guard's background
/// release on drop still runs, so the lease does not outlive the guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t80_forever_timeouts_work_and_a_dropped_guard_still_releases() {
    let c = TestCluster::start(3).await;
    let mut opts = ClientOptions::default();
    opts.request_timeout = Duration::MAX;
    opts.call_timeout = Duration::MAX;
    opts.backoff_max = Duration::MAX;
    let client = client_with(&c, opts);

    phase("an acquire with no deadline and no call bound is granted");
    let guard = client
        .acquire(
            "kv:forever",
            AcquireOptions::new(60 * SEC).deadline(Duration::MAX),
        )
        .await
        .expect("acquire");
    assert!(guard.is_valid());

    phase("a wait without bound is passed to the server, which refuses it with its sentence");
    match client
        .acquire(
            "kv:forever-wait",
            AcquireOptions::new(60 * SEC).wait_timeout(Duration::MAX),
        )
        .await
    {
        Err(Error::Api { status: 400, .. }) => {}
        other => panic!("expected the server's 400, got {other:?}"),
    }

    phase("the guard is dropped: its background release gets through");
    drop(guard);
    eventually(10 * SEC, "the lease was released", async || {
        lock_status(&c, "kv:forever").await["held"] == false
    })
    .await;
    c.shutdown().await;
}

/// A margin that no TTL can carry is refused. When the TTL is the server's default, that is
/// only known from the grant: the grant is released, not left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t81_a_margin_too_large_for_the_ttl_is_refused_and_its_grant_released() {
    let c = TestCluster::start(3).await;
    let mut opts = ClientOptions::default();
    opts.safety_margin = Duration::MAX;
    let client = client_with(&c, opts);

    phase("with a TTL given, nothing is sent");
    match client
        .acquire("kv:margin", AcquireOptions::new(30 * SEC))
        .await
    {
        Err(Error::Invalid(m)) => assert!(m.contains("safety margin"), "{m}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(lock_status(&c, "kv:margin").await["held"], false);

    phase("with the server's default TTL, the grant is refused and released");
    match client.acquire("kv:margin", AcquireOptions::default()).await {
        Err(Error::Invalid(m)) => assert!(m.contains("safety margin"), "{m}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    eventually(10 * SEC, "the refused grant was released", async || {
        lock_status(&c, "kv:margin").await["held"] == false
    })
    .await;
    c.shutdown().await;
}

/// Values that make no sense fail with a sentence, before any request.
#[tokio::test]
async fn t82_nonsense_options_and_node_urls_are_refused_up_front() {
    let mut opts = ClientOptions::default();
    opts.safety_margin_ratio = f64::NAN;
    match Client::with_options(["http://127.0.0.1:7001"], opts) {
        Err(Error::Invalid(m)) => assert!(m.contains("safety_margin_ratio"), "{m}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    for bad in [
        "http://127.0.0.1:99999",
        "http://not a host:1",
        "http://127.0.0.1:22001?x=1",
        "https://127.0.0.1:22001",
    ] {
        match Client::new([bad]) {
            Err(Error::Invalid(m)) => assert!(m.contains(bad), "{m}"),
            other => panic!("{bad}: expected Invalid, got {other:?}"),
        }
    }
    // Nothing listens on this port: a zero deadline must be refused before any attempt.
    let client = Client::new(["http://127.0.0.1:9"]).expect("client");
    match client
        .acquire(
            "kv:zero",
            AcquireOptions::new(30 * SEC).deadline(Duration::ZERO),
        )
        .await
    {
        Err(Error::Invalid(m)) => assert!(m.contains("deadline"), "{m}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// A name with `.` or `..` segments is its own lock: the client sends it as one path segment,
/// so no URL parser resolves it into another name. `.` and `..` alone cannot be sent in a URL
/// and are refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t83_dot_segments_in_a_name_reach_the_server_as_written() {
    let c = TestCluster::start(3).await;
    let client = client_with(&c, ClientOptions::default());
    phase("a/./b and x/../a/b are granted as themselves, a/b stays free");
    let mut guards = Vec::new();
    for name in ["a/./b", "x/../a/b"] {
        let guard = client
            .acquire(name, AcquireOptions::new(30 * SEC))
            .await
            .expect("acquire");
        guards.push(guard);
        let view = lock_status(&c, &name.replace('/', "%2F")).await;
        assert_eq!(
            (&view["resource"], &view["held"]),
            (&name.into(), &true.into())
        );
    }
    assert_eq!(lock_status(&c, "a/b").await["held"], false);

    phase("'.' and '..' are refused by the client");
    for name in [".", ".."] {
        match client.acquire(name, AcquireOptions::new(30 * SEC)).await {
            Err(Error::Invalid(m)) => assert!(m.contains("cannot be sent in a URL"), "{m}"),
            other => panic!("{name}: expected Invalid, got {other:?}"),
        }
    }
    drop(guards);
    c.shutdown().await;
}
