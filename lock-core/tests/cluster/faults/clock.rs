//! Lease time is judged by a monotonic source anchored to the log, not by the leader's wall
//! clock: a wall-clock step on the leader (an NTP correction) neither shortens a lease (a
//! forward step) nor stretches it (a backward step freezing log time).

use std::time::Duration;

use lock_core::testkit::{eventually, phase, TestCluster, TEST_ADMIN_TOKEN};
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

/// A member whose wall clock is far off shows it before its next peer connection is refused:
/// the other members see the offset in their overview and metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t72_a_members_clock_offset_shows_on_the_others() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let skewed = c.followers(leader)[0];

    phase("a follower's wall clock steps 40 s ahead");
    c.node(skewed).node.faults().set_clock_offset_ms(40_000);
    let http = reqwest::Client::new();
    let overview = async || -> serde_json::Value {
        http.get(c.url(leader, "/v1/admin/overview"))
            .bearer_auth(TEST_ADMIN_TOKEN)
            .send()
            .await
            .expect("GET overview")
            .json()
            .await
            .expect("overview JSON")
    };
    eventually(EVENT, "the leader sees the offset", async || {
        let o = overview().await;
        let peers = o["peers"].as_array().expect("peers").clone();
        let of = |id: u64| {
            peers
                .iter()
                .find(|p| p["id"] == json!(id))
                .map(|p| p["clock_offset_ms"].clone())
        };
        // Every member tells its build too (this node's own from itself).
        let builds = peers.iter().all(|p| {
            p["version"]
                .as_str()
                .is_some_and(|v| v.starts_with(env!("CARGO_PKG_VERSION")))
        });
        builds
            && of(leader) == Some(json!(null))
            && of(skewed)
                .and_then(|o| o.as_i64())
                .is_some_and(|ms| (39_000..=41_000).contains(&ms))
    })
    .await;
    let scraped = http
        .get(c.url(leader, "/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("text");
    let line = scraped
        .lines()
        .find(|l| {
            l.starts_with("fencegate_peer_clock_offset_seconds{")
                && l.contains(&format!("peer=\"{skewed}\""))
        })
        .unwrap_or_else(|| panic!("no offset series for node {skewed}:\n{scraped}"));
    let seconds: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect(line);
    assert!((39.0..=41.0).contains(&seconds), "{line}");
    assert!(
        scraped.contains("fencegate_build_info{commit="),
        "no build series:\n{scraped}"
    );
    c.shutdown().await;
}
