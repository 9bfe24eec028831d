//! Appends stay under the peer port's body limit: a follower that missed more log than one
//! body may carry gets it in smaller appends, instead of an append it refuses on every retry.

use std::time::Duration;

use lock_core::testkit::{phase, TestCluster};

/// Small enough that the log the follower misses below is several bodies' worth.
const PEER_BODY_LIMIT: usize = 32 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_by_more_than_one_append_body_catches_up() {
    let mut c = TestCluster::start_with_peer_body_limit(3, PEER_BODY_LIMIT).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];

    phase("a follower is down while 600 acquires of long names are committed");
    c.crash(follower).await;
    // Names near the request id's 128-byte bound: each command is a few hundred bytes, so the
    // entries the follower misses are several times the peer body limit.
    let prefix = format!("kv:{}", "n".repeat(110));
    let grants = c.acquire_many(leader, &prefix, 600, 4, 120_000).await;
    assert_eq!(grants.len(), 600);

    phase("restarted, it catches up from the log in appends under the limit");
    c.restart(follower).await;
    let target = c.wait_caught_up(follower, Duration::from_secs(60)).await;
    let st = c.cluster_status(follower).await;
    assert!(st.last_applied >= target);
    assert_eq!(
        st.locks.active_locks, 600,
        "the follower holds every lease the leader granted: {st:?}"
    );
    c.shutdown().await;
}
