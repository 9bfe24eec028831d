//! HTTP client for node-to-node calls, with the fault layer applied. Bodies are in the peer
//! wire format (see [`codec`](super::codec)), never JSON.

use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

use super::auth::{PeerSecret, AUTH_HEADER};
use super::codec::{self, CodecError};
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
    #[error("message to or from node {node}: {source}")]
    Codec {
        node: u64,
        #[source]
        source: CodecError,
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
    secret: PeerSecret,
}

impl PeerClient {
    pub fn new(self_id: u64, faults: FaultLayer, secret: PeerSecret) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            // Below the peer listener's idle close (its header timeout, 30 s by default), so a
            // pooled connection is never reused just as the other side closes it.
            .pool_idle_timeout(Duration::from_secs(20))
            .tcp_nodelay(true)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self {
            http,
            self_id,
            faults,
            secret,
        }
    }

    pub fn faults(&self) -> &FaultLayer {
        &self.faults
    }

    /// POSTs `body` as JSON to another node's public API (`http://{addr}{path}`) and returns
    /// the status and body of its answer: used to relay an operator's call to the leader, with
    /// the operator's own `Authorization` header.
    pub async fn post_json<Req>(
        &self,
        addr: &str,
        path: &str,
        body: &Req,
        timeout: Duration,
        authorization: Option<&str>,
    ) -> Result<(u16, String), reqwest::Error>
    where
        Req: Serialize + ?Sized,
    {
        let mut request = self
            .http
            .post(format!("http://{addr}{path}"))
            .timeout(timeout)
            .json(body);
        if let Some(auth) = authorization {
            request = request.header(reqwest::header::AUTHORIZATION, auth);
        }
        let resp = request.send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    }

    /// POSTs `body` in the peer format to `http://{addr}{path}` on node `target` and decodes
    /// a 200 reply.
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
        let codec_error = |source| PeerError::Codec {
            node: target,
            source,
        };
        let body = codec::encode(body).map_err(codec_error)?;
        let reply = self.post_frame(target, addr, path, body, timeout).await?;
        codec::decode(&reply).map_err(codec_error)
    }

    /// POSTs an already encoded peer body and returns the bytes of a 200 reply.
    pub async fn post_frame(
        &self,
        target: u64,
        addr: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<bytes::Bytes, PeerError> {
        self.faults
            .outgoing(target)
            .await
            .map_err(|_| PeerError::Dropped(target))?;
        let unreachable = |source| PeerError::Unreachable {
            node: target,
            source,
        };
        let from = self.self_id.to_string();
        let tag = self.secret.sign(&from, path, &body);
        let resp = self
            .http
            .post(format!("http://{addr}{path}"))
            .header(FROM_HEADER, from)
            .header(AUTH_HEADER, tag)
            .header(reqwest::header::CONTENT_TYPE, codec::CONTENT_TYPE)
            .timeout(timeout)
            .body(body)
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
        resp.bytes().await.map_err(unreachable)
    }
}
