//! The leader coalesces commands that arrive while a raft write is in flight, from its own API
//! and forwarded by followers, into one log entry; each caller still gets its own result.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

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
    let api = Arc::new(c.api_client());
    let nodes = c.running();
    let mut calls = Vec::new();
    for i in 0..CALLERS {
        let api = api.clone();
        let node = nodes[i as usize % nodes.len()];
        calls.push(tokio::spawn(async move {
            let body = AcquireRequest {
                request_id: format!("batch-{i}"),
                ttl_ms: Some(60_000),
                ..AcquireRequest::default()
            };
            let path = format!("/v1/locks/batch:{i}/acquire");
            let (status, grant) = api.post(node, &path, body.clone()).await.expect("acquire");
            assert_eq!(status, 200, "acquire {i}: {grant}");
            // A retry of the same request, possibly in the same batch as other callers' first
            // tries, returns the same lease (invariant 6).
            let (status, again) = api.post(node, &path, body).await.expect("retry");
            assert_eq!(status, 200, "retry {i}: {again}");
            assert_eq!(again["lease_id"], grant["lease_id"]);
            assert_eq!(again["fencing_token"], grant["fencing_token"]);
            (i, grant)
        }));
    }
    let mut tokens = BTreeSet::new();
    for call in calls {
        let (i, grant) = call.await.expect("caller");
        assert_eq!(grant["resource"], format!("batch:{i}"), "{grant}");
        tokens.insert(grant["fencing_token"].as_u64().expect("token"));
    }

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
