//! A follower that was down while the leader snapshotted and purged the log past it rejoins:
//! the leader streams it the snapshot in chunks, it installs it and catches up, and a
//! linearizable read it serves sees the state it missed.

use std::time::{Duration, Instant};

use lock_core::node::Policy;
use lock_core::testkit::{phase, TestCluster};

/// Enough distinct resources that the snapshot is many times one chunk.
const RESOURCES: u64 = 50_000;
const WRITERS: u64 = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_behind_the_purged_log_installs_a_snapshot_and_catches_up() {
    // Leases outlive the test so the state the follower must receive stays put.
    let policy = Policy {
        max_ttl_ms: 3_600_000,
        ..Policy::default()
    };
    let mut c = TestCluster::start_with(3, policy).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let away = c.followers(leader)[0];

    phase("stop a follower");
    let away_index = c.last_applied(away).await;
    c.crash(away).await;

    phase("acquire 50,000 distinct resources on the leader");
    let grants = c
        .acquire_many(leader, "catch-up", RESOURCES, WRITERS, 3_600_000)
        .await;

    phase("the leader snapshots and purges the log past the stopped follower");
    let purged = c.snapshot_and_purge(leader).await;
    assert!(purged > away_index);

    phase("restart the follower: it installs the snapshot and catches up");
    let started = Instant::now();
    c.restart(away).await;
    let target = c.wait_caught_up(away, Duration::from_secs(120)).await;
    eprintln!(
        "follower caught up to index {target} in {:?} (provisional: debug build, busy machine)",
        started.elapsed()
    );
    let installed = c.node(away).node.raft.metrics().borrow().snapshot;
    assert!(
        installed.is_some_and(|s| s.index > away_index),
        "the follower caught up through a snapshot, got {installed:?}"
    );

    phase("a linearizable read served by the follower sees what it missed");
    assert_eq!(grants.len(), RESOURCES as usize);
    for grant in grants.iter().step_by(97) {
        let resource = grant["resource"].as_str().expect("resource");
        let (status, lock) = c.get(away, &format!("/v1/locks/{resource}")).await;
        assert_eq!(status, 200, "{lock}");
        assert_eq!(lock["held"], true, "{lock}");
        assert_eq!(lock["fencing_token"], grant["fencing_token"], "{lock}");
    }

    c.shutdown().await;
}
