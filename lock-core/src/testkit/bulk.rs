//! Cluster state at the scale the service is sized for: many leases at once, then a snapshot
//! and a purge of the log behind it, so a node that joins or returns must catch up by snapshot.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{eventually, TestCluster};
use crate::wire::AcquireRequest;

impl TestCluster {
    /// Acquires `count` distinct resources `{prefix}:{i}` on node `id` with `writers`
    /// concurrent clients, each lease for `ttl_ms`, and returns the grants (in no particular
    /// order). A 503 (a commit that missed the write timeout while the leader builds a
    /// snapshot) is retried with the same request id, the documented remedy.
    pub async fn acquire_many(
        &self,
        id: u64,
        prefix: &str,
        count: u64,
        writers: u64,
        ttl_ms: u64,
    ) -> Vec<Value> {
        let api = Arc::new(self.api_client());
        let mut tasks = Vec::new();
        for w in 0..writers {
            let api = api.clone();
            let prefix = prefix.to_string();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for i in (w..count).step_by(writers as usize) {
                    let body = AcquireRequest {
                        request_id: format!("{prefix}-{i}"),
                        ttl_ms: Some(ttl_ms),
                        ..AcquireRequest::default()
                    };
                    let path = format!("/v1/locks/{prefix}:{i}/acquire");
                    let (status, grant) = loop {
                        let got = api.post(id, &path, body.clone()).await.expect("acquire");
                        if got.0 != 503 {
                            break got;
                        }
                    };
                    assert_eq!(status, 200, "acquire {prefix}:{i}: {grant}");
                    got.push(grant);
                }
                got
            }));
        }
        let mut grants = Vec::new();
        for t in tasks {
            grants.extend(t.await.expect("writer task"));
        }
        grants
    }

    /// Has node `id` (the leader) snapshot everything it applied and purge the log up to
    /// there, then waits until both happened. Commands are batched, so even many acquires may
    /// fill fewer entries than the automatic snapshot interval. Returns the purged index.
    pub async fn snapshot_and_purge(&self, id: u64) -> u64 {
        let raft = self.node(id).node.raft.clone();
        let applied = self.last_applied(id).await;
        raft.trigger().snapshot().await.expect("trigger snapshot");
        eventually(Duration::from_secs(60), "leader snapshot", async || {
            let m = raft.metrics().borrow().clone();
            m.snapshot.is_some_and(|s| s.index >= applied)
        })
        .await;
        raft.trigger()
            .purge_log(applied)
            .await
            .expect("trigger purge");
        eventually(Duration::from_secs(60), "leader purge", async || {
            let m = raft.metrics().borrow().clone();
            m.purged.is_some_and(|p| p.index >= applied)
        })
        .await;
        applied
    }
}
