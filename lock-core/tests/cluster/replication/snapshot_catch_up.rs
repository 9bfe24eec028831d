//! A follower that was down while the leader snapshotted and purged the log past it rejoins:
//! the leader streams it the snapshot in chunks, it installs it and catches up, and a
//! linearizable read it serves sees the state it missed.

use std::time::{Duration, Instant};

use lock_core::node::Policy;
use lock_core::testkit::{phase, TestCluster};

/// Enough distinct resources that the snapshot is many times one chunk.
const RESOURCES: u64 = 50_000;
const WRITERS: u64 = 64;

/// A 3-node cluster whose leases may outlive the test (so the state a follower must receive
/// stays put), its leader and one of its followers.
async fn cluster_and_a_follower() -> (TestCluster, u64, u64) {
    let policy = Policy {
        max_ttl_ms: 3_600_000,
        ..Policy::default()
    };
    let c = TestCluster::start_with(3, policy).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];
    (c, leader, follower)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_behind_the_purged_log_installs_a_snapshot_and_catches_up() {
    let (mut c, leader, away) = cluster_and_a_follower().await;

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

/// A follower whose data directory is lost (a replaced disk) comes back under its id, empty,
/// while the leader that replicated to it still leads, with its log purged below where the
/// follower was: the leader starts over with it and sends it the snapshot. (openraft, left to
/// its defaults, kept the follower's old position, sent it entries it could not place after
/// an empty log, and the follower's raft stopped: the cluster ran on two nodes for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_that_lost_its_data_rejoins_through_a_snapshot() {
    let (mut c, leader, lost) = cluster_and_a_follower().await;

    phase("the leader snapshots and purges; the follower then has every entry after that");
    let mut grants = c
        .acquire_many(leader, "before", 2_000, WRITERS, 3_600_000)
        .await;
    let purged = c.snapshot_and_purge(leader).await;
    grants.extend(
        c.acquire_many(leader, "after", 1_000, WRITERS, 3_600_000)
            .await,
    );
    let had = c.wait_caught_up(lost, Duration::from_secs(60)).await;
    assert!(had > purged, "the follower was past the purged log");

    phase("the follower's data directory is lost; it starts again empty and catches up");
    c.crash(lost).await;
    std::fs::remove_dir_all(c.data_root().join(format!("node{lost}")))
        .expect("remove the follower's data directory");
    c.restart(lost).await;
    c.wait_caught_up(lost, Duration::from_secs(60)).await;
    assert_eq!(
        c.wait_leader(Duration::from_secs(10)).await,
        leader,
        "the leader that had replicated to the follower brought it back"
    );
    let installed = c.node(lost).node.raft.metrics().borrow().snapshot;
    assert!(
        installed.is_some_and(|s| s.index >= purged),
        "the follower caught up through the snapshot, got {installed:?}"
    );

    phase("a linearizable read served by the follower sees every grant");
    for grant in grants.iter().step_by(53) {
        let resource = grant["resource"].as_str().expect("resource");
        let (status, lock) = c.get(lost, &format!("/v1/locks/{resource}")).await;
        assert_eq!(status, 200, "{lock}");
        assert_eq!(lock["fencing_token"], grant["fencing_token"], "{lock}");
    }

    c.shutdown().await;
}
