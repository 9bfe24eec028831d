//! A follower that was down while the leader snapshotted and purged the log past it rejoins:
//! the leader streams it the snapshot in chunks, it installs it and catches up, and a
//! linearizable read it serves sees the state it missed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::node::Policy;
use lock_core::testkit::{eventually, phase, TestCluster};
use lock_core::wire::AcquireRequest;

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
    let api = Arc::new(c.api_client());
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let api = api.clone();
        writers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in (w..RESOURCES).step_by(WRITERS as usize) {
                let body = AcquireRequest {
                    request_id: format!("catch-up-{i}"),
                    ttl_ms: Some(3_600_000),
                    ..AcquireRequest::default()
                };
                let path = format!("/v1/locks/catch-up:{i}/acquire");
                // A commit that misses the write timeout while the leader also builds a
                // snapshot answers 503; retrying with the same request id is the documented
                // (deduplicated) remedy.
                let (status, grant) = loop {
                    let got = api
                        .post(leader, &path, body.clone())
                        .await
                        .expect("acquire");
                    if got.0 != 503 {
                        break got;
                    }
                };
                assert_eq!(status, 200, "acquire {i}: {grant}");
                got.push(grant);
            }
            got
        }));
    }
    let mut grants = Vec::new();
    for w in writers {
        grants.extend(w.await.expect("writer"));
    }

    phase("the leader snapshots and purges the log past the stopped follower");
    // Commands are batched, so 50,000 acquires may fill fewer log entries than the automatic
    // snapshot interval: ask for the snapshot and the purge explicitly.
    let raft = c.node(leader).node.raft.clone();
    let applied = c.last_applied(leader).await;
    raft.trigger().snapshot().await.expect("trigger snapshot");
    eventually(Duration::from_secs(60), "leader snapshot", async || {
        let m = raft.metrics().borrow().clone();
        m.snapshot.is_some_and(|s| s.index >= applied)
    })
    .await;
    raft.trigger()
        .purge_log(applied)
        .await
        .expect("trigger purge");
    eventually(Duration::from_secs(60), "leader purge", async || {
        let m = raft.metrics().borrow().clone();
        m.purged.is_some_and(|p| p.index > away_index)
    })
    .await;

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
