//! Failover: a new leader, also one whose clock is skewed, honours every lease's remaining time
//! plus the failover grace.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::node::Policy;
use lock_core::testkit::{phase, TestCluster};
use serde_json::json;

use super::{acquire_answered, Granted, EVENT};

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Sleeps until the wall clock reads `at_ms`. Used only where the passage of time is what is
/// being tested (a lease must still be held just before its original expiry).
async fn sleep_until_wall(at_ms: u64) {
    let now = wall_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

/// A rival acquire (fresh request id) that must be refused because `resource` is held.
async fn assert_refused(c: &TestCluster, id: u64, resource: &str, rival: &str) -> u64 {
    let (s, v) = acquire_answered(c, id, resource, rival, 5_000).await;
    assert_eq!(s, 409, "rival acquire of {resource} on node {id}: {v}");
    assert_eq!(v["error"], "lock_held", "{v}");
    v["retry_after_ms"].as_u64().expect("retry_after_ms")
}

/// A leader change never shortens a lease. The new leader honours the remaining
/// time plus the failover grace, also when its clock runs 5 s ahead of the old leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_leader_change_does_not_shorten_lease() {
    // A grace well above election time, so the check below tells the grace apart from the
    // election time a failover also credits.
    let policy = Policy {
        failover_grace_ms: 3_000,
        ..Policy::default()
    };
    let mut c = TestCluster::start_with(3, policy).await;
    let grace = c.policy.failover_grace_ms;
    let l1 = c.wait_leader(EVENT).await;

    phase("acquire failover:a with ttl 10 s");
    let (s, v) = c.acquire(l1, "failover:a", "req-a", 10_000).await;
    assert_eq!(s, 200, "{v}");
    let a = Granted::parse(&v);

    phase("crash the leader; the new leader shows the same lease, expiring no earlier");
    c.crash(l1).await;
    let l2 = c.wait_leader(EVENT).await;
    let (s, g) = c.get(l2, "/v1/locks/failover:a").await;
    assert_eq!((s, &g["held"]), (200, &json!(true)), "{g}");
    assert_eq!(g["fencing_token"].as_u64(), Some(a.token));
    assert!(
        g["expires_at_ms"].as_u64().unwrap() >= a.expires_at_ms,
        "{g}"
    );

    phase("after a command of the new term, the expiry carries the failover grace");
    let (s, v) = acquire_answered(&c, l2, "failover:other-a", "req-other-a", 10_000).await;
    assert_eq!(s, 200, "{v}");
    let (s, g) = c.get(l2, "/v1/locks/failover:a").await;
    assert_eq!(s, 200, "{g}");
    let shifted = g["expires_at_ms"].as_u64().unwrap();
    assert!(
        shifted >= a.expires_at_ms + grace,
        "{shifted} < {} + {grace}",
        a.expires_at_ms
    );

    phase("a rival is refused and told to wait at least the original remaining time");
    let retry_after = assert_refused(&c, l2, "failover:a", "rival-a-1").await;
    assert!(
        retry_after + wall_ms() >= a.expires_at_ms,
        "retry_after {retry_after}"
    );

    phase("restart the old leader; every node but the current leader gets a +5 s clock");
    c.restart(l1).await;
    c.wait_caught_up(l1, EVENT).await;
    let l2 = c.wait_leader(EVENT).await;
    for id in c.followers(l2) {
        c.node(id).node.faults().set_clock_offset_ms(5_000);
    }

    phase("acquire failover:b with ttl 10 s, then crash the leader");
    let (s, v) = c.acquire(l2, "failover:b", "req-b", 10_000).await;
    assert_eq!(s, 200, "{v}");
    let b = Granted::parse(&v);
    c.crash(l2).await;
    let l3 = c.wait_leader(EVENT).await;
    assert_eq!(c.node(l3).node.faults().snapshot().clock_offset_ms, 5_000);

    phase("the skewed new leader honours both leases' remaining time plus grace");
    let (s, v) = acquire_answered(&c, l3, "failover:other-b", "req-other-b", 10_000).await;
    assert_eq!(s, 200, "{v}");
    for lease in [&a, &b] {
        let (s, g) = c.get(l3, &format!("/v1/locks/{}", lease.resource)).await;
        assert_eq!((s, &g["held"]), (200, &json!(true)), "{g}");
        assert_eq!(g["fencing_token"].as_u64(), Some(lease.token), "{g}");
        let exp = g["expires_at_ms"].as_u64().unwrap();
        assert!(
            exp >= lease.expires_at_ms + grace,
            "{}: {g}",
            lease.resource
        );
    }
    let retry_after = assert_refused(&c, l3, "failover:b", "rival-b-1").await;
    assert!(
        retry_after + wall_ms() >= b.expires_at_ms,
        "retry_after {retry_after}"
    );

    phase("just before each original expiry, the lease is still held (409)");
    let other = c.followers(l3)[0];
    sleep_until_wall(a.expires_at_ms - 500).await;
    assert_refused(&c, other, "failover:a", "rival-a-2").await;
    sleep_until_wall(b.expires_at_ms - 500).await;
    assert_refused(&c, other, "failover:b", "rival-b-2").await;

    phase("the lease does end: a waiting rival gets it, not before the original expiry");
    let (s, v) = c
        .post(
            other,
            "/v1/locks/failover:b/acquire",
            json!({ "request_id": "rival-b-wait", "ttl_ms": 5_000, "wait_timeout_ms": 10_000 }),
        )
        .await;
    let granted_wall = wall_ms();
    assert_eq!(
        s, 200,
        "the extension is bounded, so the waiter is served: {v}"
    );
    let next = Granted::parse(&v);
    assert!(next.token > b.token);
    assert!(
        granted_wall >= b.expires_at_ms,
        "lease b ended early, at {granted_wall}"
    );
    c.shutdown().await;
}
