//! Overload: once the leader holds as many commands for its next raft writes as it may, a call
//! is refused at once with 503 `overloaded` and a `retry_after_ms`, nothing of it happens, and
//! its retry with the same request id is granted once there is room.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_core::testkit::{phase, TestCluster};
use serde_json::json;

use super::support::{assert_error, assert_free, assert_grant, metrics, sample};

const CALLS: u64 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_write_queue_refuses_calls_at_once_and_their_retries_are_granted() {
    let c = TestCluster::start_adjusted(3, |config| config.max_queued_writes = Some(2)).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let api = c.api_client();

    phase("300 acquires of distinct resources at once, spread over the three nodes");
    let mut set = tokio::task::JoinSet::new();
    for k in 0..CALLS {
        let api = api.clone();
        set.spawn(async move {
            let body = json!({ "request_id": format!("ovl-{k}"), "ttl_ms": 60_000 });
            let got = api
                .post(k % 3 + 1, &format!("/v1/locks/ovl:{k}/acquire"), body)
                .await
                .expect("every node answers");
            (k, got)
        });
    }
    let mut tokens = BTreeSet::new();
    let mut refused = Vec::new();
    while let Some(done) = set.join_next().await {
        let (k, got) = done.expect("caller task");
        match got.0 {
            200 => {
                let (_, token) = assert_grant(&got, &format!("ovl:{k}"), 60_000);
                assert!(tokens.insert(token), "token {token} issued twice");
            }
            _ => {
                assert_error(&got, 503, "overloaded", &["retry_after_ms"]);
                assert!(got.1["retry_after_ms"].as_u64().is_some_and(|ms| ms >= 1));
                refused.push(k);
            }
        }
    }
    assert!(
        !refused.is_empty(),
        "300 calls at once never filled a queue of 2"
    );
    assert!(!tokens.is_empty(), "the queue admitted nothing");
    let counted = sample(
        &metrics(&c, leader).await,
        "fencegate_raft_writes_refused_total",
        &[],
    );
    assert!(counted >= 1.0, "the leader counted {counted} refusals");

    phase("nothing of a refused call happened: its resource is free");
    for k in &refused {
        assert_free(&c, leader, &format!("ovl:{k}")).await;
    }

    phase("each refused call, retried alone with its request id, is granted");
    for k in &refused {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = c
                .acquire(k % 3 + 1, &format!("ovl:{k}"), &format!("ovl-{k}"), 60_000)
                .await;
            if got.0 == 200 {
                let (_, token) = assert_grant(&got, &format!("ovl:{k}"), 60_000);
                assert!(tokens.insert(token), "token {token} issued twice");
                break;
            }
            assert_error(&got, 503, "overloaded", &["retry_after_ms"]);
            assert!(Instant::now() < deadline, "ovl:{k} never admitted");
            let wait = got.1["retry_after_ms"].as_u64().unwrap_or(10);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }
    assert_eq!(tokens.len() as u64, CALLS, "one lease per resource");
    let (s, v) = c.get(leader, "/v1/locks?prefix=ovl:&limit=1000").await;
    assert_eq!(s, 200);
    assert_eq!(v["locks"].as_array().map(Vec::len), Some(CALLS as usize));
    c.shutdown().await;
}
