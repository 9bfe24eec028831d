//! Membership: a fourth node joins, serves reads and writes, and is removed again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_core::testkit::{phase, TestCluster};
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
            json!({ "node_id": 4, "addr": addr4 }),
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
