//! Restarts: the whole cluster crashes and comes back; a crashed follower catches up by log
//! replay and by snapshot install.

use lock_core::testkit::{eventually, phase, TestCluster};
use serde_json::json;

use super::{acquire_answered, machine_last_token, recorded_lease, stream_acquire, Granted, EVENT};

/// Acknowledged state is durable and tokens only grow: the whole cluster crashes and restarts;
/// every lease survives with its token and expiry, old lease ids still renew, and new tokens
/// keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_all_nodes_restarted() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;

    phase("acquire five locks through different nodes");
    let mut held = Vec::new();
    for i in 0..5u64 {
        let id = i % 3 + 1;
        let (s, v) = c
            .acquire(id, &format!("durable:{i}"), &format!("req-d{i}"), 60_000)
            .await;
        assert_eq!(s, 200, "{v}");
        held.push(Granted::parse(&v));
    }
    let max_token = held.iter().map(|g| g.token).max().unwrap();

    phase("crash all three nodes");
    let mut order = vec![leader];
    order.extend(c.followers(leader));
    for id in order {
        c.crash(id).await;
    }
    assert!(c.running().is_empty());

    phase("restart all three and wait for a leader");
    for id in 1..=3 {
        c.restart(id).await;
    }
    let leader = c.wait_leader(EVENT).await;

    phase("every lease is still held with the same token, expiring no earlier");
    for g in &held {
        let (s, v) = c.get(leader, &format!("/v1/locks/{}", g.resource)).await;
        assert_eq!((s, &v["held"]), (200, &json!(true)), "{v}");
        assert_eq!(v["fencing_token"].as_u64(), Some(g.token), "{v}");
        assert!(
            v["expires_at_ms"].as_u64().unwrap() >= g.expires_at_ms,
            "{v}"
        );
    }

    phase("renew with the old lease ids succeeds and keeps the tokens");
    for g in &held {
        let body = json!({ "lease_id": g.lease_id });
        let (s, v) = c
            .post(
                leader % 3 + 1,
                &format!("/v1/locks/{}/renew", g.resource),
                body,
            )
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["fencing_token"].as_u64(), Some(g.token));
        assert!(v["expires_at_ms"].as_u64().unwrap() >= g.expires_at_ms);
    }

    phase("a retried request_id still gets its original lease, across restarts");
    let (s, v) = c.acquire(leader, "durable:0", "req-d0", 60_000).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(Granted::parse(&v).lease_id, held[0].lease_id);

    phase("a new acquire gets a token above every earlier one");
    let (s, v) = c.acquire(leader, "durable:new", "req-d-new", 60_000).await;
    assert_eq!(s, 200, "{v}");
    assert!(Granted::parse(&v).token > max_token, "{v}");
    c.shutdown().await;
}

/// Acquires `count` distinct resources `{prefix}{k}` through `id` with 8 concurrent clients
/// and returns the grants.
async fn write_many(c: &TestCluster, id: u64, prefix: &str, count: u64) -> Vec<Granted> {
    let api = c.api_client();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..8 {
        let (api, prefix) = (api.clone(), prefix.to_string());
        set.spawn(async move {
            let mut out = Vec::new();
            for k in (w..count).step_by(8) {
                let res = format!("{prefix}{k}");
                let (s, v) = stream_acquire(&api, id, &res, &format!("req-{res}"), 60_000).await;
                assert_eq!(s, 200, "{res}: {v}");
                out.push(Granted::parse(&v));
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.expect("writer task"));
    }
    all.sort_by_key(|g| g.token);
    all
}

/// A node that was down catches up: first by log replication, then — after the leader
/// compacted its log past the node's last entry — by installing a snapshot. The token counter
/// survives the snapshot install: tokens only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_crashed_follower_catches_up() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let f = c.followers(leader)[0];

    phase("crash a follower, then make 220 writes (200 acquires, 20 releases)");
    c.crash(f).await;
    let grants = write_many(&c, leader, "catchup:", 200).await;
    for g in grants.iter().take(20) {
        let body = json!({ "lease_id": g.lease_id });
        let (s, v) = c
            .post(leader, &format!("/v1/locks/{}/release", g.resource), body)
            .await;
        assert_eq!((s, v["released"].as_bool()), (200, Some(true)), "{v}");
    }

    phase("restart it: it replays the log up to the leader's last_applied");
    c.restart(f).await;
    c.wait_caught_up(f, EVENT).await;
    for (i, g) in grants.iter().enumerate() {
        let rec = recorded_lease(&c, f, &g.resource);
        if i < 20 {
            assert_eq!(rec, None, "{} was released", g.resource);
        } else {
            let (lease, token, _) = rec.unwrap_or_else(|| panic!("{} missing", g.resource));
            assert_eq!((lease, token), (g.lease_id.clone(), g.token));
        }
    }
    assert_eq!(machine_last_token(&c, f), machine_last_token(&c, leader));

    phase("linearizable GETs on it show the latest state");
    let (last, released) = (grants.last().unwrap(), &grants[0]);
    let (s, g) = c.get(f, &format!("/v1/locks/{}", last.resource)).await;
    assert_eq!(
        (s, g["fencing_token"].as_u64()),
        (200, Some(last.token)),
        "{g}"
    );
    let (s, g) = c.get(f, &format!("/v1/locks/{}", released.resource)).await;
    assert_eq!((s, &g["held"]), (200, &json!(false)), "{g}");

    phase("crash it again, write more, then snapshot and purge the leader's log");
    let leader = c.wait_leader(EVENT).await;
    assert_ne!(leader, f);
    c.crash(f).await;
    let more = write_many(&c, leader, "compact:", 40).await;
    let snapshot_index = c.snapshot_and_purge(leader).await;
    let token_before = machine_last_token(&c, leader);
    assert!(token_before >= more.last().unwrap().token);

    phase("restart it: it must install the snapshot, and converges");
    c.restart(f).await;
    eventually(
        EVENT,
        "the follower installs the leader's snapshot",
        async || {
            c.cluster_status(f)
                .await
                .snapshot_index
                .is_some_and(|i| i >= snapshot_index)
        },
    )
    .await;
    c.wait_caught_up(f, EVENT).await;
    for g in grants.iter().skip(20).chain(&more) {
        let (lease, token, _) = recorded_lease(&c, f, &g.resource).expect("lease after install");
        assert_eq!(
            (lease, token),
            (g.lease_id.clone(), g.token),
            "{}",
            g.resource
        );
    }
    assert_eq!(
        machine_last_token(&c, f),
        token_before,
        "counter survives the install"
    );

    phase("a new acquire through it gets a token above everything before");
    let (s, v) = acquire_answered(&c, f, "compact:new", "req-compact-new", 60_000).await;
    assert_eq!(s, 200, "{v}");
    assert!(Granted::parse(&v).token > token_before, "{v}");
    let (s, g) = c.get(f, "/v1/locks/compact:new").await;
    assert_eq!((s, g["held"].as_bool()), (200, Some(true)), "{g}");
    c.shutdown().await;
}
