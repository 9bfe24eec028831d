//! Membership: a node joins, serves reads and writes, and is removed again; and no change may
//! lose quorum: an add promotes only a learner that caught up, a removal that would leave fewer
//! reachable voters than a quorum is refused, and removing the leader hands leadership over.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_core::testkit::{eventually, phase, TestCluster};
use lock_core::wire::{ClusterStatus, ErrorBody, ErrorCode, MembershipResponse};
use serde_json::{json, Value};

use super::support::{assert_error, assert_grant, cluster_status, lock_path, voters};

/// Polls `GET /v1/cluster` on `node` until its voters are `want` (openraft publishes a
/// membership change to its metrics asynchronously).
async fn wait_voters(c: &TestCluster, node: u64, want: &[u64]) -> Value {
    let want: BTreeSet<u64> = want.iter().copied().collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = cluster_status(c, node).await;
        if voters(&v) == want {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} never showed voters {want:?}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn voter_set(s: &ClusterStatus) -> BTreeSet<u64> {
    s.members.iter().filter(|m| m.voter).map(|m| m.id).collect()
}

fn error_of(got: &(u16, Value)) -> ErrorBody {
    serde_json::from_value(got.1.clone()).expect("an error body")
}

/// Membership changes keep the state: a node that joins later serves the earlier locks, and
/// the cluster keeps serving after it is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_serves_reads_and_is_removed() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("a lock acquired before the new node exists");
    let got = c
        .post(
            f[0],
            &lock_path("member:pre", "acquire"),
            json!({ "request_id": "m-1", "holder": "before-join", "ttl_ms": 60_000 }),
        )
        .await;
    let (_, token) = assert_grant(&got, "member:pre", 60_000);

    phase("start node 4 (not a founding member: it does not bootstrap)");
    let addr4 = c.start_joining(4).await;
    let v = cluster_status(&c, 4).await;
    assert_eq!(v["node_id"], 4);
    assert_eq!(
        voters(&v),
        BTreeSet::new(),
        "node 4 has no membership yet: {v}"
    );

    phase("members/add on a follower is relayed to the leader; node 4 becomes a voter");
    let (s, r) = c
        .post(
            f[1],
            "/v1/cluster/members/add",
            json!({ "node_id": 4, "addr": addr4, "peer_addr": c.peer_addrs[&4] }),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["voters"], json!([1, 2, 3, 4]), "{r}");
    let v = wait_voters(&c, leader, &[1, 2, 3, 4]).await;
    let node4 = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == 4)
        .cloned()
        .expect("node 4 listed");
    assert_eq!(node4["addr"], addr4.as_str());

    phase("node 4 serves a linearizable GET showing the earlier lock");
    let (s, v) = c.get(4, "/v1/locks/member:pre").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["holder"], "before-join");
    assert_eq!(v["fencing_token"].as_u64(), Some(token));
    let v = wait_voters(&c, 4, &[1, 2, 3, 4]).await;
    assert_eq!(v["leader_id"].as_u64(), Some(leader), "{v}");

    phase("node 4 also takes writes (forwarded to the leader)");
    let got = c.acquire(4, "member:via4", "m-2", 10_000).await;
    let (_, token4) = assert_grant(&got, "member:via4", 10_000);
    assert!(token4 > token);

    phase("bad membership calls are 400 — on the leader and relayed from a follower");
    for node in [leader, f[0]] {
        let got = c
            .post(node, "/v1/cluster/members/remove", json!({ "node_id": 99 }))
            .await;
        assert_error(&got, 400, "invalid_request", &[]);
        let got = c
            .post(node, "/v1/cluster/members/add", json!({ "node_id": 5 }))
            .await;
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("members/remove on a follower: back to 3 voters");
    let (s, r) = c
        .post(f[0], "/v1/cluster/members/remove", json!({ "node_id": 4 }))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["voters"], json!([1, 2, 3]), "{r}");
    let v = wait_voters(&c, leader, &[1, 2, 3]).await;
    assert_eq!(
        v["members"].as_array().unwrap().len(),
        3,
        "node 4 forgotten: {v}"
    );
    c.stop_and_forget(4).await;

    phase("the 3-node cluster keeps serving after the removal");
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];
    let got = c.acquire(follower, "member:after", "m-3", 10_000).await;
    let (_, token5) = assert_grant(&got, "member:after", 10_000);
    assert!(token5 > token4);
    let (s, v) = c.get(follower, "/v1/locks/member:pre").await;
    assert_eq!((s, v["fencing_token"].as_u64()), (200, Some(token)), "{v}");
    c.shutdown().await;
}

/// An add promotes only a node that caught up: one nobody can reach is refused and changes no
/// voter.
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
            json!({
                "node_id": 4,
                "addr": dead_addr,
                "peer_addr": dead_addr,
                "catch_up_timeout_ms": 3000
            }),
        )
        .await;
    assert_eq!(got.0, 409, "{}", got.1);
    assert_eq!(error_of(&got).error, ErrorCode::MemberNotCaughtUp);
    let message = error_of(&got).message;
    assert!(
        message.contains("last call to it failed"),
        "says what the leader saw: {message}"
    );

    phase("the voter set is unchanged and node 4 is not a member at all");
    let s = c.cluster_status(leader).await;
    assert_eq!(voter_set(&s), BTreeSet::from([1, 2, 3]));
    assert!(s.members.iter().all(|m| m.id != 4), "{s:?}");

    phase("the cluster still commits with its three voters");
    let (code, body) = c
        .acquire(leader, "member:after-refused-add", "r1", 30_000)
        .await;
    assert_eq!(code, 200, "{body}");
    c.shutdown().await;
}

/// An add promotes a live node only once it has (nearly) the whole log.
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
            json!({ "node_id": 4, "addr": addr4, "peer_addr": c.peer_addrs[&4] }),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let r: MembershipResponse = serde_json::from_value(body).expect("voters");
    assert_eq!(r.voters, BTreeSet::from([1, 2, 3, 4]));
    // What the leader had replicated to node 4 when it answered (node 4 may apply a moment
    // later: it learns the commit index with the next append).
    let m = c.node(leader).node.raft.metrics().borrow().clone();
    let matched = m
        .replication
        .as_ref()
        .and_then(|r| r.get(&4).cloned().flatten())
        .map_or(0, |l| l.index);
    let last = m.last_log_index.unwrap_or(0);
    assert!(
        matched + 150 >= last,
        "node 4 was promoted while far behind: it had {matched} of {last} entries"
    );

    phase("node 4 serves a linearizable read of the earlier state");
    let (code, v) = c.get(4, "/v1/locks/member:pre-199").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["held"], true, "{v}");
    c.shutdown().await;
}

/// A removal that would leave fewer reachable voters than a quorum is refused.
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
        voter_set(&c.cluster_status(leader).await),
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

/// Removing the leader hands leadership over to the remaining voters, with the state intact.
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
            let s = c.cluster_status(rest[0]).await;
            s.leader_id.is_some_and(|l| rest.contains(&l))
        },
    )
    .await;

    phase("the removed leader does not go on naming itself leader");
    eventually(
        Duration::from_secs(10),
        "the removed leader no longer claims to lead",
        async || {
            let (code, ready) = c.get(leader, "/readyz").await;
            code == 503 || ready["leader_id"].as_u64().is_some_and(|l| l != leader)
        },
    )
    .await;
    assert_ne!(c.node(leader).node.current_leader(), Some(leader));
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

/// An empty node joins a cluster holding the seeds' 20,000 active leases whose leader has
/// purged its log behind a snapshot: it can only catch up by installing that snapshot, and it
/// becomes a voter only after it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joining_node_catches_up_by_snapshot_at_scale_before_it_votes() {
    let policy = lock_core::node::Policy {
        max_ttl_ms: 3_600_000,
        ..lock_core::node::Policy::default()
    };
    let mut c = TestCluster::start_with(3, policy).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;

    phase("20,000 leases, then a snapshot and a purged log on the leader");
    let grants = c.acquire_many(leader, "join", 20_000, 64, 3_600_000).await;
    let purged = c.snapshot_and_purge(leader).await;

    phase("an empty node 4 is added: a learner until it installed the snapshot");
    let addr4 = c.start_joining(4).await;
    let (code, body) = c
        .post(
            leader,
            "/v1/cluster/members/add",
            json!({
                "node_id": 4,
                "addr": addr4,
                "peer_addr": c.peer_addrs[&4],
                "catch_up_timeout_ms": 120_000
            }),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let r: MembershipResponse = serde_json::from_value(body).expect("voters");
    assert_eq!(r.voters, BTreeSet::from([1, 2, 3, 4]));
    let installed = c.node(4).node.raft.metrics().borrow().snapshot;
    assert!(
        installed.is_some_and(|s| s.index >= purged),
        "node 4 caught up through the snapshot: {installed:?}"
    );

    phase("node 4 serves linearizable reads of the state it received");
    for grant in grants.iter().step_by(211) {
        let resource = grant["resource"].as_str().expect("resource");
        let (status, lock) = c.get(4, &format!("/v1/locks/{resource}")).await;
        assert_eq!(status, 200, "{lock}");
        assert_eq!(lock["held"], true, "{lock}");
        assert_eq!(lock["fencing_token"], grant["fencing_token"], "{lock}");
    }
    c.shutdown().await;
}

/// A removed member that keeps running does not disturb the cluster: it never wins a pre-vote,
/// so its term stays put, and adding it back later does not depose the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_left_running_can_be_added_back_without_an_election() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let addr4 = c.start_joining(4).await;
    let add = json!({ "node_id": 4, "addr": addr4, "peer_addr": c.peer_addrs[&4] });
    let (s, r) = c.post(leader, "/v1/cluster/members/add", add.clone()).await;
    assert_eq!(s, 200, "{r}");
    wait_voters(&c, 4, &[1, 2, 3, 4]).await;
    let term = cluster_status(&c, leader).await["term"].clone();

    phase("remove node 4 and leave it running for several election timeouts");
    let (s, r) = c
        .post(
            leader,
            "/v1/cluster/members/remove",
            json!({ "node_id": 4 }),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    wait_voters(&c, leader, &[1, 2, 3]).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let v = cluster_status(&c, 4).await;
    assert_eq!(v["term"], term, "the removed member raised its term: {v}");

    phase("add it back: the same leader in the same term");
    let (s, r) = c.post(leader, "/v1/cluster/members/add", add.clone()).await;
    assert_eq!(s, 200, "{r}");
    wait_voters(&c, 4, &[1, 2, 3, 4]).await;

    phase("the same add again is a retry; a voter's id at another address is refused");
    let (s, r) = c.post(leader, "/v1/cluster/members/add", add).await;
    assert_eq!(s, 200, "{r}");
    let elsewhere = json!({ "node_id": 4, "addr": "127.0.0.1:1", "peer_addr": "127.0.0.1:2" });
    let (s, r) = c.post(leader, "/v1/cluster/members/add", elsewhere).await;
    assert_eq!(
        (s, r["error"].as_str()),
        (409, Some("membership_change_failed")),
        "{r}"
    );
    assert!(
        r["message"].as_str().unwrap_or("").contains(&addr4),
        "names where node 4 is: {r}"
    );

    phase("each change is in the leader's audit log");
    let (s, audit) = c.get(leader, "/v1/admin/audit?limit=100").await;
    assert_eq!(s, 200, "{audit}");
    let ops: Vec<(String, String)> = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["caller"] == "operator:cluster-api")
        .map(|e| (e["op"].to_string(), e["outcome"].to_string()))
        .collect();
    for (op, outcome) in [
        ("add_member", "done"),
        ("remove_member", "done"),
        ("add_member", "membership_change_failed"),
    ] {
        assert!(
            ops.contains(&(format!("{op:?}"), format!("{outcome:?}"))),
            "{op} {outcome} in {ops:?}"
        );
    }
    let got = c.acquire(4, "member:back", "m-back", 10_000).await;
    assert_grant(&got, "member:back", 10_000);
    for id in [1, 2, 3, 4] {
        let v = cluster_status(&c, id).await;
        assert_eq!(
            (v["leader_id"].as_u64(), &v["term"]),
            (Some(leader), &term),
            "node {id}: {v}"
        );
    }
    c.shutdown().await;
}

/// A member's public API is reached over the peer port (operators' calls relayed to the
/// leader, health probes): it works whatever the public port speaks — with TLS there, the
/// nodes called `http://` and every relay and probe failed — and the operator's credential is
/// checked on the member as if the call had come straight to it. Nobody without the cluster
/// secret can use the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_members_public_api_is_reached_over_the_peer_port() {
    const TOKEN: &str = "relay-admin-token-0123456789";
    let c = TestCluster::start_with_auth(3, TOKEN, lock_core::node::TenantPolicy::default()).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = &c.node(c.followers(leader)[0]).node;
    let call = |path: &'static str, auth: Option<&'static str>| async move {
        follower
            .call_member_api(leader, "GET", path, None, auth, Duration::from_secs(5))
            .await
            .expect("the leader answers over the peer port")
    };

    phase("the leader's /readyz, through the peer port");
    let (status, body) = call("/readyz", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("\"leader_id\":{leader}")), "{body}");

    phase("the operator's credential is checked there");
    assert_eq!(call("/v1/admin/overview", None).await.0, 401);
    let bearer = format!("Bearer {TOKEN}");
    let bearer: &'static str = Box::leak(bearer.into_boxed_str());
    assert_eq!(call("/v1/admin/overview", Some(bearer)).await.0, 200);

    phase("a caller without the cluster secret is refused on the peer port");
    let stranger = reqwest::Client::new()
        .post(format!(
            "http://{}{}",
            c.peer_addrs[&leader],
            lock_core::node::MEMBER_API_PATH
        ))
        .body(vec![0u8; 8])
        .send()
        .await
        .expect("the peer port answers");
    assert_eq!(stranger.status().as_u16(), 401);
    c.shutdown().await;
}

/// Membership changes are operator actions: a node without an admin token refuses them, and a
/// node with one refuses a caller without it. (They used to stay open on a node without a
/// token, so anyone who reached the public port could remove the voters.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn membership_changes_need_the_admin_credential() {
    let c = TestCluster::start_adjusted(3, |config| config.admin_token = None).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];
    for path in [
        "/v1/cluster/members/remove",
        "/v1/admin/members/remove",
        "/v1/cluster/members/add",
    ] {
        let (s, v) = c
            .post(
                leader,
                path,
                json!({ "node_id": follower, "operator": "t" }),
            )
            .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (403, Some("forbidden")),
            "{path}: {v}"
        );
        assert!(
            v["message"].as_str().unwrap_or("").contains("admin_token"),
            "{v}"
        );
    }
    let (s, v) = c.get(leader, "/v1/cluster").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["members"].as_array().map(Vec::len),
        Some(3),
        "nothing changed: {v}"
    );
    c.shutdown().await;

    phase("with a token: a caller without it gets 401, with a wrong one 403");
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let url = c.url(leader, "/v1/cluster/members/remove");
    let body = json!({ "node_id": c.followers(leader)[0] });
    let http = reqwest::Client::new();
    let none = http.post(&url).json(&body).send().await.expect("answer");
    assert_eq!(none.status().as_u16(), 401);
    let wrong = http
        .post(&url)
        .bearer_auth("not-the-admin-token-0000")
        .json(&body)
        .send()
        .await
        .expect("answer");
    assert_eq!(wrong.status().as_u16(), 403);
    let (s, v) = c.get(leader, "/v1/cluster").await;
    assert_eq!(v["members"].as_array().map(Vec::len), Some(3), "{s} {v}");
    c.shutdown().await;
}
