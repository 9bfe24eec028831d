//! The leader coalesces commands that arrive while a raft write is in flight, from its own API
//! and forwarded by followers, into one log entry; each caller still gets its own result.
//! Followers forward the commands proposed while earlier forwards are on their way together,
//! as one message.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use lock_core::net::FaultRule;
use lock_core::testkit::{phase, TestCluster};
use lock_core::wire::AcquireRequest;

const CALLERS: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_commands_share_log_entries_and_each_gets_its_own_result() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let before = c
        .cluster_status(leader)
        .await
        .last_log_index
        .expect("index");

    phase("100 callers acquire distinct resources at once, through every node");
    let tokens = acquire_at_once(&c, "batch", &c.running()).await;

    phase("every grant has its own token, and fewer log entries than commands were written");
    assert_eq!(tokens.len() as u64, CALLERS, "tokens are distinct");
    let after = c
        .cluster_status(leader)
        .await
        .last_log_index
        .expect("index");
    let entries = after - before;
    eprintln!("{} commands in {entries} log entries", 2 * CALLERS);
    assert!(
        entries < 2 * CALLERS,
        "{} commands took {entries} entries: nothing was batched",
        2 * CALLERS
    );

    c.shutdown().await;
}

/// `CALLERS` callers acquire `{prefix}:{i}` at once, spread over `nodes`, each then retrying
/// its own request; returns the distinct tokens granted.
async fn acquire_at_once(c: &TestCluster, prefix: &str, nodes: &[u64]) -> BTreeSet<u64> {
    let api = Arc::new(c.api_client());
    let mut calls = Vec::new();
    for i in 0..CALLERS {
        let api = api.clone();
        let node = nodes[i as usize % nodes.len()];
        let prefix = prefix.to_string();
        calls.push(tokio::spawn(async move {
            let body = AcquireRequest {
                request_id: format!("{prefix}-{i}"),
                ttl_ms: Some(60_000),
                ..AcquireRequest::default()
            };
            let path = format!("/v1/locks/{prefix}:{i}/acquire");
            let (status, grant) = api.post(node, &path, body.clone()).await.expect("acquire");
            assert_eq!(status, 200, "acquire {i}: {grant}");
            // A retry of the same request, possibly in the same batch as other callers' first
            // tries, returns the same lease (invariant 6).
            let (status, again) = api.post(node, &path, body).await.expect("retry");
            assert_eq!(status, 200, "retry {i}: {again}");
            assert_eq!(again["lease_id"], grant["lease_id"]);
            assert_eq!(again["fencing_token"], grant["fencing_token"]);
            assert_eq!(grant["resource"], format!("{prefix}:{i}"), "{grant}");
            grant["fencing_token"].as_u64().expect("token")
        }));
    }
    let mut tokens = BTreeSet::new();
    for call in calls {
        tokens.insert(call.await.expect("caller"));
    }
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_followers_forwards_travel_together_and_each_gets_its_own_result() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];

    phase("100 callers acquire distinct resources at once, all through one follower");
    let tokens = acquire_at_once(&c, "forward", &[follower]).await;
    assert_eq!(tokens.len() as u64, CALLERS, "tokens are distinct");

    phase("the follower forwarded them in fewer messages than commands");
    let sizes = &c.node(follower).node.metrics.forward_commands;
    let (messages, commands) = (sizes.get_sample_count(), sizes.get_sample_sum() as u64);
    eprintln!("{commands} forwarded commands in {messages} messages");
    assert!(commands >= 2 * CALLERS, "every command was forwarded");
    assert!(
        messages < commands,
        "{commands} commands took {messages} messages: nothing was batched"
    );

    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forward_that_gets_no_answer_is_counted_and_its_command_retried() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];
    let failures = c.node(follower).node.metrics.forward_failures.clone();

    phase("the follower's messages to the leader are lost; an acquire through it waits");
    c.node(follower).node.faults().set_rule(
        leader,
        FaultRule {
            drop_rate: 1.0,
            ..FaultRule::default()
        },
    );
    let api = Arc::new(c.api_client());
    let acquire = tokio::spawn({
        let api = api.clone();
        async move {
            let body = AcquireRequest {
                request_id: "lost-forward".into(),
                ttl_ms: Some(30_000),
                ..AcquireRequest::default()
            };
            api.post(follower, "/v1/locks/forward:lost/acquire", body)
                .await
                .expect("acquire")
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while failures.with_label_values(&["dropped"]).get() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no lost forward was counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    phase("the messages get through again: the retried command is granted, once");
    c.node(follower).node.faults().heal();
    let (status, grant) = acquire.await.expect("acquire task");
    assert_eq!(status, 200, "{grant}");
    assert!(failures.with_label_values(&["dropped"]).get() >= 1);
    let (_, view) = c.get(leader, "/v1/locks/forward:lost").await;
    assert_eq!(view["held"], true, "{view}");
    assert_eq!(view["fencing_token"], grant["fencing_token"], "{view}");

    c.shutdown().await;
}
