//! The operator's endpoints: `GET /v1/cluster`, `/healthz`, `/readyz` and `/metrics`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_core::testkit::{phase, TestCluster};
use serde_json::Value;

use super::support::{assert_error, assert_grant, cluster_status, metrics, sample, voters};

/// Polls `GET /v1/cluster` on `node` (a status page, not linearizable) until it names the
/// leader and has applied something: a follower that has not yet heard from the leader shows
/// no membership, and one that has not applied an entry yet (the first is the membership)
/// shows `last_applied: 0` and no members.
async fn wait_cluster_status(c: &TestCluster, node: u64, leader: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = cluster_status(c, node).await;
        let applied = v["last_applied"].as_u64().is_some_and(|i| i > 0);
        if v["leader_id"].as_u64() == Some(leader) && applied {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} never saw leader {leader}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every node reports the cluster, its health and Prometheus metrics, and counts each outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_health_and_metrics_endpoints() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("GET /v1/cluster on every node: node_id, leader_id, term, 3 members, last_applied");
    for node in [leader, f[0], f[1]] {
        let v = wait_cluster_status(&c, node, leader).await;
        assert_eq!(v["node_id"].as_u64(), Some(node), "{v}");
        assert!(v["term"].as_u64().is_some_and(|t| t >= 1), "{v}");
        assert!(v["last_applied"].as_u64().is_some(), "{v}");
        assert_eq!(voters(&v), BTreeSet::from([1, 2, 3]), "{v}");
        for m in v["members"].as_array().unwrap() {
            let id = m["id"].as_u64().unwrap();
            assert_eq!(m["addr"], c.addrs[&id].as_str(), "{v}");
        }
    }

    phase("/healthz and /readyz (a leader is known) answer 200 on every node");
    for node in [leader, f[0], f[1]] {
        let (s, v) = c.get(node, "/healthz").await;
        assert_eq!(s, 200, "{v}");
        let (s, v) = c.get(node, "/readyz").await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["leader_id"].as_u64(), Some(leader), "{v}");
    }

    phase("a brand-new cluster's members all vote once they (or their leader) caught up");
    for node in [leader, f[0], f[1]] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while sample(&metrics(&c, node).await, "fencegate_raft_vote_held", &[]) != 0.0 {
            assert!(Instant::now() < deadline, "node {node} holds its vote");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    phase("/metrics is Prometheus text with the series operators rely on");
    let before = metrics(&c, f[0]).await;
    // Outcomes nothing has caused yet are there at 0, so the first one shows as an increase.
    for series in [
        r#"fencegate_op_outcomes_total{op="renew",outcome="lease_lost",node="NODE"} 0"#,
        r#"fencegate_op_outcomes_total{op="acquire",outcome="no_quorum",node="NODE"} 0"#,
        r#"fencegate_op_outcomes_total{op="acquire",outcome="invalid_request",node="NODE"} 0"#,
        r#"fencegate_op_outcomes_total{op="acquire",outcome="wait_cancelled",node="NODE"} 0"#,
        r#"fencegate_op_outcomes_total{op="renew",outcome="overloaded",node="NODE"} 0"#,
        // Waits last up to 5 minutes: the latency buckets reach that far.
        r#"fencegate_op_seconds_bucket{op="acquire",node="NODE",le="300"} 0"#,
        r#"fencegate_auth_denied_total{reason="invalid",node="NODE"} 0"#,
        r#"fencegate_op_seconds_count{op="list",node="NODE"} 0"#,
    ] {
        let series = series.replace("NODE", &f[0].to_string());
        assert!(
            before.lines().any(|l| l == series),
            "/metrics lacks {series}:\n{before}"
        );
    }
    let acquires = |text: &str| {
        sample(
            text,
            "fencegate_op_outcomes_total",
            &[("op", "acquire"), ("outcome", "success")],
        )
    };
    let got = c.acquire(f[0], "met:a", "met-1", 5_000).await;
    let (_, token) = assert_grant(&got, "met:a", 5_000);
    let after = metrics(&c, f[0]).await;
    // Gauges mirror the local state machine: the leader applied the acquire before answering.
    let leader_text = metrics(&c, leader).await;
    for name in [
        "fencegate_op_seconds_bucket",
        "fencegate_op_outcomes_total",
        "fencegate_active_locks",
        "fencegate_raft_commit_seconds",
        "fencegate_leader_changes_total",
        "fencegate_lease_expirations_total",
    ] {
        assert!(after.contains(name), "/metrics lacks {name}:\n{after}");
    }
    assert_eq!(acquires(&after), acquires(&before) + 1.0, "acquire counter");
    assert!(
        sample(&after, "fencegate_op_seconds_count", &[("op", "acquire")]) >= 1.0,
        "acquire latency observed"
    );
    assert!(sample(&leader_text, "fencegate_active_locks", &[]) >= 1.0);
    assert!(sample(&leader_text, "fencegate_last_fencing_token", &[]) >= token as f64);

    phase("metrics: a refused acquire is counted under its own outcome");
    let got = c.acquire(f[0], "met:a", "met-2", 5_000).await;
    assert_error(&got, 409, "lock_held", &["retry_after_ms"]);
    let text = metrics(&c, f[0]).await;
    assert_eq!(
        sample(
            &text,
            "fencegate_op_outcomes_total",
            &[("op", "acquire"), ("outcome", "lock_held")]
        ),
        sample(
            &after,
            "fencegate_op_outcomes_total",
            &[("op", "acquire"), ("outcome", "lock_held")]
        ) + 1.0
    );
    assert_eq!(
        acquires(&text),
        acquires(&after),
        "a refusal is not a success"
    );
    // The leader proposed the acquire (forwarded to it), so it measured a raft commit.
    let text = metrics(&c, leader).await;
    assert!(sample(&text, "fencegate_raft_commit_seconds_count", &[]) >= 1.0);

    phase("metrics: the hottest resources by acquire rate, from 1 acquire/s up");
    for i in 0..12 {
        // One resource busier than the rest: 40 acquires in the 30 s window is over the bar,
        // one acquire is not (an even spread must not make a series per resource).
        let (resource, times) = if i == 0 {
            ("met:hot".to_string(), 40)
        } else {
            (format!("met:r{i}"), 1)
        };
        for n in 0..times {
            let got = c
                .acquire(f[1], &resource, &format!("met-hot-{i}-{n}"), 5_000)
                .await;
            assert!(got.0 == 200 || got.0 == 409, "{got:?}");
        }
    }
    let text = metrics(&c, f[1]).await;
    let hot: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("fencegate_hot_resource_acquires_per_second{"))
        .collect();
    assert_eq!(hot.len(), 1, "only the hot one is named: {hot:#?}");
    let hottest = sample(
        &text,
        "fencegate_hot_resource_acquires_per_second",
        &[("resource", "met:hot")],
    );
    assert!(hottest >= 1.0, "{hot:#?}");
    c.shutdown().await;
}

/// A restarted node applies its log again; the hand-offs, expiries and timeouts in it happened
/// before the restart and are not counted again (they were, and every restart made these
/// counters jump as if a burst of leases had just expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_does_not_count_its_replayed_log_again() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader)[0];

    phase("three leases expire unrenewed; every node counts them");
    for i in 0..3 {
        let got = c
            .acquire(
                leader,
                &format!("replay:{i}"),
                &format!("replay-{i}"),
                1_000,
            )
            .await;
        assert_grant(&got, &format!("replay:{i}"), 1_000);
    }
    let expired = |text: &str| sample(text, "fencegate_lease_expirations_total", &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while expired(&metrics(&c, f).await) < 3.0 {
        assert!(
            Instant::now() < deadline,
            "the leases never expired on node {f}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let applied = cluster_status(&c, leader).await["last_applied"]
        .as_u64()
        .expect("last_applied");

    phase("the follower restarts and applies its log again: the counter starts at 0");
    c.stop(f).await;
    c.restart(f).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster_status(&c, f).await["last_applied"]
        .as_u64()
        .is_none_or(|a| a < applied)
    {
        assert!(Instant::now() < deadline, "node {f} never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(expired(&metrics(&c, f).await), 0.0);
    c.shutdown().await;
}
