//! HTTP client for node-to-node calls, with the fault layer applied.

use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

use super::faults::FaultLayer;

/// Header naming the sending node, so the receiver can apply its incoming fault rules.
pub const FROM_HEADER: &str = "x-fencegate-from";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    #[error("request to node {0} dropped by an injected fault")]
    Dropped(u64),
    #[error("node {node} unreachable: {source}")]
    Unreachable {
        node: u64,
        #[source]
        source: reqwest::Error,
    },
    #[error("node {node} answered {status}: {body}")]
    Status {
        node: u64,
        status: u16,
        body: String,
    },
}

#[derive(Clone, Debug)]
pub struct PeerClient {
    http: reqwest::Client,
    self_id: u64,
    faults: FaultLayer,
}

impl PeerClient {
    pub fn new(self_id: u64, faults: FaultLayer) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self {
            http,
            self_id,
            faults,
        }
    }

    pub fn faults(&self) -> &FaultLayer {
        &self.faults
    }

    /// POSTs `body` as JSON to `http://{addr}{path}` on node `target` and decodes a 200 reply.
    pub async fn post<Req, Resp>(
        &self,
        target: u64,
        addr: &str,
        path: &str,
        body: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.post_as(target, addr, path, body, timeout, None).await
    }

    /// [`post`](Self::post) carrying the caller's `Authorization` header, for operator calls
    /// a node relays to the leader on the caller's behalf.
    pub async fn post_as<Req, Resp>(
        &self,
        target: u64,
        addr: &str,
        path: &str,
        body: &Req,
        timeout: Duration,
        authorization: Option<&str>,
    ) -> Result<Resp, PeerError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.faults
            .outgoing(target)
            .await
            .map_err(|_| PeerError::Dropped(target))?;
        let unreachable = |source| PeerError::Unreachable {
            node: target,
            source,
        };
        let mut request = self
            .http
            .post(format!("http://{addr}{path}"))
            .header(FROM_HEADER, self.self_id.to_string());
        if let Some(auth) = authorization {
            request = request.header(reqwest::header::AUTHORIZATION, auth);
        }
        let resp = request
            .timeout(timeout)
            .json(body)
            .send()
            .await
            .map_err(unreachable)?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(PeerError::Status {
                node: target,
                status: status.as_u16(),
                body,
            });
        }
        resp.json().await.map_err(unreachable)
    }
}
