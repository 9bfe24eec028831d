//! Calls made with a given API key (or none), parsed into the wire types.

use std::collections::BTreeMap;
use std::time::Duration;

use lock_core::node::TenantPolicy;
use lock_core::testkit::{eventually, TestCluster};
use lock_core::wire::{
    AcquireRequest, AcquireResponse, CreateKeyRequest, CreatedKey, ErrorBody, KeyRole,
    LeaseRequest, LockList, LockView, ReleaseResponse, RevokeKeyResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub const ADMIN_TOKEN: &str = "auth-test-admin-token-0123456789";

/// An HTTP answer: the status and the body text.
pub struct Answer {
    pub status: u16,
    pub text: String,
}

impl Answer {
    #[track_caller]
    pub fn ok<T: DeserializeOwned>(&self) -> T {
        assert_eq!(self.status, 200, "{}", self.text);
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }

    /// Asserts an error answer with this status and code.
    #[track_caller]
    pub fn refused(&self, status: u16, code: &str) -> ErrorBody {
        assert_eq!(self.status, status, "{}", self.text);
        let body: ErrorBody =
            serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text));
        assert_eq!(body.error.as_str(), code, "{}", self.text);
        assert!(!body.message.is_empty());
        body
    }
}

/// Calls with one bearer value (or none), on the cluster's nodes (which keep their addresses
/// across restarts).
pub struct As {
    addrs: BTreeMap<u64, String>,
    bearer: Option<String>,
    http: reqwest::Client,
}

impl As {
    pub fn key(cluster: &TestCluster, key: &str) -> Self {
        Self::new(cluster, Some(key.to_string()))
    }

    pub fn nobody(cluster: &TestCluster) -> Self {
        Self::new(cluster, None)
    }

    fn new(cluster: &TestCluster, bearer: Option<String>) -> Self {
        As {
            addrs: cluster.addrs.clone(),
            bearer,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self, node: u64, path: &str) -> String {
        format!("http://{}{}", self.addrs[&node], path)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        let req = match &self.bearer {
            Some(b) => req.bearer_auth(b),
            None => req,
        };
        let resp = req.send().await.expect("request");
        Answer {
            status: resp.status().as_u16(),
            text: resp.text().await.unwrap_or_default(),
        }
    }

    pub async fn get(&self, node: u64, path: &str) -> Answer {
        self.send(self.http.get(self.url(node, path))).await
    }

    pub async fn post(&self, node: u64, path: &str, body: &impl Serialize) -> Answer {
        self.send(self.http.post(self.url(node, path)).json(body))
            .await
    }

    pub async fn acquire(&self, node: u64, resource: &str, request_id: &str) -> Answer {
        let body = AcquireRequest {
            request_id: request_id.to_string(),
            ..AcquireRequest::default()
        };
        self.post(node, &format!("/v1/locks/{resource}/acquire"), &body)
            .await
    }

    pub async fn granted(&self, node: u64, resource: &str, request_id: &str) -> AcquireResponse {
        self.acquire(node, resource, request_id).await.ok()
    }

    pub async fn renew(&self, node: u64, resource: &str, lease: &AcquireResponse) -> Answer {
        let body = LeaseRequest {
            lease_id: Some(lease.lease_id),
        };
        self.post(node, &format!("/v1/locks/{resource}/renew"), &body)
            .await
    }

    pub async fn release(&self, node: u64, resource: &str, lease: &AcquireResponse) -> bool {
        let body = LeaseRequest {
            lease_id: Some(lease.lease_id),
        };
        let r: ReleaseResponse = self
            .post(node, &format!("/v1/locks/{resource}/release"), &body)
            .await
            .ok();
        r.released
    }

    pub async fn view(&self, node: u64, resource: &str) -> LockView {
        self.get(node, &format!("/v1/locks/{resource}")).await.ok()
    }

    pub async fn list(&self, node: u64, prefix: &str) -> LockList {
        self.get(node, &format!("/v1/locks?prefix={prefix}"))
            .await
            .ok()
    }

    /// Waits until every node accepts this caller's key (a new key is known to a node once it
    /// applied the creation).
    pub async fn known_everywhere(&self) {
        eventually(
            Duration::from_secs(10),
            "key applied on every node",
            async || {
                for node in self.addrs.keys() {
                    if self.get(*node, "/v1/locks/kv:probe").await.status != 200 {
                        return false;
                    }
                }
                true
            },
        )
        .await;
    }

    /// Revokes a key by id (this caller must be an admin).
    pub async fn revoke(&self, node: u64, id: &str) -> RevokeKeyResponse {
        self.post(node, &format!("/v1/admin/keys/{id}/revoke"), &())
            .await
            .ok()
    }

    /// Creates a key (this caller must be an admin).
    pub async fn create_key(&self, node: u64, tenant: &str, role: KeyRole) -> CreatedKey {
        let body = CreateKeyRequest {
            tenant: tenant.to_string(),
            role,
            label: Some(format!("{tenant} test key")),
        };
        self.post(node, "/v1/admin/keys", &body).await.ok()
    }
}

/// The value of a counter line of `/metrics` whose labels include `label` (0 when absent).
pub async fn counter(cluster: &TestCluster, node: u64, metric: &str, label: &str) -> u64 {
    let text = As::nobody(cluster).get(node, "/metrics").await.text;
    text.lines()
        .filter(|l| l.starts_with(&format!("fencegate_{metric}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// A cluster that requires keys, its leader, and client keys of tenants `a` and `b`, known on
/// every node.
pub async fn two_tenants(tenants: TenantPolicy) -> (TestCluster, u64, CreatedKey, CreatedKey) {
    let cluster = TestCluster::start_with_auth(3, ADMIN_TOKEN, tenants).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let admin = As::key(&cluster, ADMIN_TOKEN);
    let a = admin.create_key(leader, "tenant-a", KeyRole::Client).await;
    let b = admin.create_key(leader, "tenant-b", KeyRole::Client).await;
    As::key(&cluster, &a.key).known_everywhere().await;
    As::key(&cluster, &b.key).known_everywhere().await;
    (cluster, leader, a, b)
}
