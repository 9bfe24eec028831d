//! Membership changes that cannot lose quorum: an add promotes only a learner that caught up,
//! a removal that would leave fewer reachable voters than a quorum is refused, and removing
//! the leader hands leadership over.

use std::collections::BTreeSet;
use std::time::Duration;

use lock_core::testkit::{eventually, phase, TestCluster};
use lock_core::wire::{ClusterStatus, ErrorBody, ErrorCode, MembershipResponse};
use serde_json::json;

fn voter_set(s: &ClusterStatus) -> BTreeSet<u64> {
    s.members.iter().filter(|m| m.voter).map(|m| m.id).collect()
}

async fn status(c: &TestCluster, id: u64) -> ClusterStatus {
    c.cluster_status(id).await
}

fn error_of(got: &(u16, serde_json::Value)) -> ErrorBody {
    serde_json::from_value(got.1.clone()).expect("an error body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn add_of_an_unreachable_node_is_refused_and_changes_no_voter() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];

    phase("add node 4 at an address where nothing listens, through a follower");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr").to_string();
    drop(dead);
    let got = c
        .post(
            follower,
            "/v1/cluster/members/add",
            json!({ "node_id": 4, "addr": dead_addr, "catch_up_timeout_ms": 1500 }),
        )
        .await;
    assert_eq!(got.0, 409, "{}", got.1);
    assert_eq!(error_of(&got).error, ErrorCode::MemberNotCaughtUp);

    phase("the voter set is unchanged and node 4 is not a member at all");
    let s = status(&c, leader).await;
    assert_eq!(voter_set(&s), BTreeSet::from([1, 2, 3]));
    assert!(s.members.iter().all(|m| m.id != 4), "{s:?}");

    phase("the cluster still commits with its three voters");
    let (code, body) = c
        .acquire(leader, "member:after-refused-add", "r1", 30_000)
        .await;
    assert_eq!(code, 200, "{body}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn add_of_a_live_node_waits_for_catch_up_then_promotes() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;

    phase("some state before the new node exists");
    for i in 0..200 {
        let (code, body) = c
            .acquire(leader, &format!("member:pre-{i}"), &format!("r{i}"), 60_000)
            .await;
        assert_eq!(code, 200, "{body}");
    }

    phase("an empty node 4 joins: it becomes a voter only after it has the log");
    let addr4 = c.start_joining(4).await;
    let (code, body) = c
        .post(
            leader,
            "/v1/cluster/members/add",
            json!({ "node_id": 4, "addr": addr4 }),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let r: MembershipResponse = serde_json::from_value(body).expect("voters");
    assert_eq!(r.voters, BTreeSet::from([1, 2, 3, 4]));
    let applied_at_promotion = c.last_applied(4).await;
    let leader_applied = c.last_applied(leader).await;
    assert!(
        applied_at_promotion + 150 >= leader_applied,
        "node 4 was promoted while far behind: {applied_at_promotion} of {leader_applied}"
    );

    phase("node 4 serves a linearizable read of the earlier state");
    let (code, v) = c.get(4, "/v1/locks/member:pre-199").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["held"], true, "{v}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn removal_that_would_lose_a_reachable_quorum_is_refused() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let f = c.followers(leader);

    phase("one follower crashes: two of three voters are up");
    c.crash(f[0]).await;

    phase("removing the other live follower would leave {leader, crashed}: refused");
    let got = c
        .post(
            leader,
            "/v1/cluster/members/remove",
            json!({ "node_id": f[1] }),
        )
        .await;
    assert_eq!(got.0, 409, "{}", got.1);
    assert_eq!(error_of(&got).error, ErrorCode::QuorumAtRisk);
    assert_eq!(
        voter_set(&status(&c, leader).await),
        BTreeSet::from([1, 2, 3])
    );

    phase("removing the crashed follower keeps a reachable quorum: allowed");
    let (code, body) = c
        .post(
            leader,
            "/v1/cluster/members/remove",
            json!({ "node_id": f[0] }),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = c.acquire(leader, "member:two-voters", "r1", 30_000).await;
    assert_eq!(code, 200, "{body}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn removing_the_leader_hands_leadership_over() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let (code, body) = c.acquire(leader, "member:before", "r1", 30_000).await;
    assert_eq!(code, 200, "{body}");

    phase("the leader removes itself");
    let (code, body) = c
        .post(
            leader,
            "/v1/cluster/members/remove",
            json!({ "node_id": leader }),
        )
        .await;
    assert_eq!(code, 200, "{body}");

    phase("the two remaining voters elect a new leader among themselves");
    let rest = c.followers(leader);
    eventually(
        Duration::from_secs(10),
        "a new leader among the rest",
        async || {
            let s = status(&c, rest[0]).await;
            s.leader_id.is_some_and(|l| rest.contains(&l))
        },
    )
    .await;
    c.stop_and_forget(leader).await;

    phase("the new configuration commits and keeps the earlier lock");
    let new_leader = c.wait_leader(Duration::from_secs(10)).await;
    assert_ne!(new_leader, leader);
    let (code, body) = c.acquire(new_leader, "member:after", "r2", 30_000).await;
    assert_eq!(code, 200, "{body}");
    let (code, v) = c.get(new_leader, "/v1/locks/member:before").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["held"], true, "{v}");
    c.shutdown().await;
}
