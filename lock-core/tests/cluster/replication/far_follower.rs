//! A follower further from the leader than the default heartbeat interval still gets every
//! entry once the cluster's raft timing says so: the leader waits one heartbeat interval for
//! an append's answer, so `[node.raft]` is what a cluster of distant members sets.

use std::time::Duration;

use lock_core::testkit::{phase, TestCluster};
use lock_core::timing::{RaftTiming, HEARTBEAT_MS};
use lock_core::wire::FaultRule;

/// Each append to the far follower leaves the leader this late: more than the default
/// heartbeat interval, well under the one configured here.
const DELAY_MS: u64 = 150;

const TIMING: RaftTiming = RaftTiming {
    heartbeat_ms: 400,
    election_timeout_ms: 2_000,
};

const _: () = assert!(DELAY_MS > HEARTBEAT_MS && DELAY_MS < TIMING.heartbeat_ms);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_further_than_the_default_heartbeat_keeps_up_with_a_longer_one() {
    let c = TestCluster::start_adjusted(3, |n| n.raft = TIMING).await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let far = c.followers(leader)[0];
    let term = c.cluster_status(leader).await.term;

    phase("the leader's messages to one follower arrive 150 ms late");
    c.node(leader).node.faults().set_rule(
        far,
        FaultRule {
            delay_ms: DELAY_MS,
            ..FaultRule::default()
        },
    );

    phase("60 acquires commit through the near follower; the far one applies them all");
    let grants = c.acquire_many(leader, "kv:far", 60, 4, 120_000).await;
    assert_eq!(grants.len(), 60);
    let target = c.wait_caught_up(far, Duration::from_secs(30)).await;
    let st = c.cluster_status(far).await;
    assert!(st.last_applied >= target, "{st:?}");
    assert_eq!(st.locks.active_locks, 60, "{st:?}");

    phase("nobody started an election: the late heartbeats still come in time");
    assert_eq!(c.wait_leader(Duration::from_secs(10)).await, leader);
    for id in [1, 2, 3] {
        assert_eq!(c.cluster_status(id).await.term, term, "node {id}");
    }
    c.node(leader).node.faults().heal();
    c.shutdown().await;
}
