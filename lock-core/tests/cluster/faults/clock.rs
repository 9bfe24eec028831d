//! Lease time is judged by a monotonic source anchored to the log, not by the leader's wall
//! clock: a wall-clock step on the leader (an NTP correction) neither shortens a lease (a
//! forward step) nor stretches it (a backward step freezing log time).

use std::time::Duration;

use lock_core::testkit::{eventually, phase, TestCluster};
use serde_json::json;

use super::{Granted, EVENT};

/// How far the leader's wall clock jumps.
const STEP_MS: i64 = 120_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_forward_wall_clock_step_on_the_leader_does_not_expire_leases() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;

    phase("a lease with 20 s left");
    let (s, v) = c.acquire(leader, "clock:fwd", "r1", 20_000).await;
    assert_eq!(s, 200, "{v}");
    let a = Granted::parse(&v);

    phase("the leader's wall clock jumps 2 minutes ahead; it keeps committing");
    c.node(leader).node.faults().set_clock_offset_ms(STEP_MS);
    for i in 0..20 {
        let (s, v) = c
            .acquire(leader, &format!("clock:other-{i}"), &format!("o{i}"), 5_000)
            .await;
        assert_eq!(s, 200, "{v}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    phase("the lease is still held, with the expiry its holder was told");
    let (s, g) = c.get(leader, "/v1/locks/clock:fwd").await;
    assert_eq!(
        (s, &g["held"]),
        (200, &json!(true)),
        "lease expired by a clock step: {g}"
    );
    assert_eq!(g["expires_at_ms"].as_u64(), Some(a.expires_at_ms), "{g}");
    let (s, v) = c.acquire(leader, "clock:fwd", "rival", 5_000).await;
    assert_eq!(s, 409, "a rival got the lock: {v}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t71_backward_wall_clock_step_on_the_leader_does_not_stretch_leases() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;

    phase("a 2 s lease");
    let (s, v) = c.acquire(leader, "clock:back", "r1", 2_000).await;
    assert_eq!(s, 200, "{v}");

    phase("the leader's wall clock jumps 2 minutes back");
    c.node(leader).node.faults().set_clock_offset_ms(-STEP_MS);

    phase("the lease still ends after about its TTL, not two minutes later");
    eventually(EVENT, "the lease expired", async || {
        let (_, g) = c.get(leader, "/v1/locks/clock:back").await;
        g["held"] == json!(false)
    })
    .await;
    let (s, v) = c.acquire(leader, "clock:back", "r2", 2_000).await;
    assert_eq!(s, 200, "the next holder is granted: {v}");
    c.shutdown().await;
}
