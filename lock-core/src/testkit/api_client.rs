//! A cloneable HTTP client on a cluster's addresses, for tasks that run beside the test.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// A cloneable HTTP client on the cluster's addresses, for concurrent tasks that must outlive
/// `&mut TestCluster` calls such as `crash`. Transport errors (a crashed node) are returned,
/// not panicked on, so callers can retry elsewhere.
#[derive(Clone)]
pub struct ApiClient {
    pub addrs: BTreeMap<u64, String>,
    pub(super) http: reqwest::Client,
}

impl ApiClient {
    pub async fn post(
        &self,
        id: u64,
        path: &str,
        body: impl Serialize,
    ) -> Result<(u16, Value), reqwest::Error> {
        let resp = self
            .http
            .post(format!("http://{}{}", self.addrs[&id], path))
            .json(&body)
            .send()
            .await?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().await.unwrap_or(Value::Null)))
    }
}
