//! A member that lost its data directory and starts again under its id must not help elect a
//! node that lacks entries it had acknowledged: it holds back its vote until it caught up.

use std::time::Duration;

use lock_core::testkit::{eventually, phase, TestCluster};

use super::EVENT;

/// Elections a node missing entries would need to win without the vote hold: the window in
/// which the old behaviour lost acknowledged grants.
const ELECTIONS: Duration = Duration::from_secs(3);

/// Neither running node leads or follows one of them (a restarted node may still name the
/// crashed leader its vote went to).
async fn no_leader_among(c: &TestCluster, running: [u64; 2]) {
    for id in running {
        let status = c.cluster_status(id).await;
        assert!(
            status.leader_id.is_none_or(|l| !running.contains(&l)),
            "node {id} sees a leader elected while a member lacks what it acknowledged: {status:?}"
        );
    }
}

/// Acknowledged grants survive a member losing its data: grants committed by the leader and
/// one follower (the third node cut off) stay when that follower's data directory is lost,
/// the leader crashes, and the cut-off node and the emptied follower are the only ones up.
/// The emptied follower refuses to vote for the cut-off node, so no leader is elected without
/// the grants; once the old leader returns, every grant is there with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lost_its_data_elects_no_leader_missing_its_entries() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let followers = c.followers(leader);
    let (emptied, cut_off) = (followers[0], followers[1]);

    phase("cut one follower off; grants commit on the leader and the other follower");
    let (s, v) = c.acquire(leader, "shared", "shared", 300_000).await;
    assert_eq!(s, 200, "{v}");
    c.wait_caught_up(cut_off, EVENT).await;
    c.isolate(cut_off);
    let mut grants = Vec::new();
    for i in 0..20 {
        let (s, v) = c
            .acquire(leader, &format!("kept:{i}"), &format!("kept-{i}"), 300_000)
            .await;
        assert_eq!(s, 200, "{v}");
        grants.push(v);
    }

    phase("the follower loses its data directory, the leader crashes");
    c.crash(emptied).await;
    std::fs::remove_dir_all(c.data_root().join(format!("node{emptied}")))
        .expect("remove the follower's data directory");
    c.crash(leader).await;

    phase("the cut-off node and the emptied follower run alone: no leader");
    c.restart(emptied).await;
    c.heal();
    assert_eq!(c.cluster_status(emptied).await.locks.resources, 0);
    tokio::time::sleep(ELECTIONS).await;
    no_leader_among(&c, [cut_off, emptied]).await;

    phase("the old leader returns: every grant is there");
    c.restart(leader).await;
    let now_leader = c.wait_leader(EVENT).await;
    for id in [leader, cut_off, emptied] {
        c.wait_caught_up(id, EVENT).await;
    }
    for grant in &grants {
        let resource = grant["resource"].as_str().expect("resource");
        let (status, lock) = c.get(now_leader, &format!("/v1/locks/{resource}")).await;
        assert_eq!(status, 200, "{lock}");
        assert_eq!(lock["held"], true, "{resource} lost: {lock}");
        assert_eq!(lock["fencing_token"], grant["fencing_token"], "{lock}");
    }
    let held = c.node(emptied).node.metrics.vote_held.get();
    assert_eq!(held, 0, "the emptied follower votes again once caught up");

    c.shutdown().await;
}

/// A member restarted halfway through catching up (its `catching-up` marker still there) has
/// the membership, and perhaps a log as long as the third node's, but not everything it once
/// acknowledged: it neither stands for election nor votes until a leader has reached it. With
/// the leader down and the third node not campaigning, nobody is elected (the third node
/// would have voted for it); once the leader returns, all is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_still_catching_up_does_not_stand_for_election() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let followers = c.followers(leader);
    let (catching_up, other) = (followers[0], followers[1]);
    let (s, v) = c.acquire(leader, "kept", "kept", 300_000).await;
    assert_eq!(s, 200, "{v}");
    c.wait_caught_up(catching_up, EVENT).await;
    c.wait_caught_up(other, EVENT).await;

    phase("the member stops halfway through catching up; the leader crashes");
    c.crash(catching_up).await;
    std::fs::write(
        c.data_root()
            .join(format!("node{catching_up}"))
            .join("catching-up"),
        b"",
    )
    .expect("write the marker");
    c.crash(leader).await;

    phase("it restarts beside the third node, which is kept from campaigning: no leader");
    // Campaigning, the third node would move to terms the held member never learns of (it
    // refuses those vote requests unseen), and that alone would defeat the member's own
    // campaigns; kept quiet, it leaves the member the chance it must not take.
    c.node(other).node.raft.runtime_config().elect(false);
    c.restart(catching_up).await;
    assert_eq!(c.node(catching_up).node.metrics.vote_held.get(), 1);
    tokio::time::sleep(ELECTIONS).await;
    no_leader_among(&c, [catching_up, other]).await;

    phase("the leader returns; the member catches up and takes part again");
    c.node(other).node.raft.runtime_config().elect(true);
    c.restart(leader).await;
    c.wait_leader(EVENT).await;
    c.wait_caught_up(catching_up, EVENT).await;
    eventually(EVENT, "the member votes again", async || {
        c.node(catching_up).node.metrics.vote_held.get() == 0
    })
    .await;
    let (status, lock) = c.get(catching_up, "/v1/locks/kept").await;
    assert_eq!((status, lock["held"].clone()), (200, true.into()), "{lock}");

    c.shutdown().await;
}

/// Only an empty data directory holds a vote back: members restarted with their data vote and
/// campaign at once, every one of them (the leader included), so losing the leader right after
/// a restart of the others still leaves a quorum that elects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_restarted_with_their_data_vote_at_once() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let (s, v) = c.acquire(leader, "kept", "kept", 300_000).await;
    assert_eq!(s, 200, "{v}");
    for id in c.followers(leader) {
        c.wait_caught_up(id, EVENT).await;
        c.crash(id).await;
        c.restart(id).await;
        assert_eq!(c.node(id).node.metrics.vote_held.get(), 0, "node {id}");
    }
    c.crash(leader).await;
    let elected = c.wait_leader(EVENT).await;
    assert_ne!(elected, leader);
    c.shutdown().await;
}

/// A second node started on a data directory a running node holds is refused with the
/// directory named, and the running node is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_in_use_is_refused_with_its_path() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
    let (l, p) = (bind().await.expect("bind"), bind().await.expect("bind"));
    let config = c.config(1);
    let dir = config.data_dir.display().to_string();
    let started = lock_core::server::start(config, l, p, std::future::pending()).await;
    let err = started.err().expect("refused").to_string();
    assert!(
        err.contains(&dir) && err.contains("in use by another process"),
        "{err}"
    );
    assert_eq!(c.wait_leader(EVENT).await, leader);
    c.shutdown().await;
}
