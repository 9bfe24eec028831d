//! Calls to another member's public API — an operator's call relayed to the leader, a health
//! probe — carried over the peer port. There they are authenticated as coming from a member,
//! and they work whatever the public port speaks: with TLS on it, a node has no client
//! configuration to reach another's (relays and probes to `http://` failed there). The
//! receiving node runs the call through its own public routes, so the operator's credential is
//! checked exactly as if the call had come straight to it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Node;
use crate::net::PeerError;

/// The peer endpoint that runs a call through the receiving node's public routes.
pub const MEMBER_API_PATH: &str = "/internal/api";

/// Largest answer a relayed call returns (the public answers are small JSON documents).
pub const MAX_MEMBER_API_ANSWER: usize = 4 << 20;

/// A call for another member's public API.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberApiCall {
    pub method: String,
    /// Path and query, starting with `/`.
    pub path: String,
    /// The caller's `Authorization` header, passed on as it came.
    pub authorization: Option<String>,
    /// A JSON body, or empty.
    pub body: Vec<u8>,
}

/// What the member's public routes answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberApiAnswer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Node {
    /// Runs `method path` (with `body` as JSON) on member `id`'s public API and returns its
    /// status and body; `Err` says why it could not be asked. A member of an earlier version
    /// (no such peer endpoint) is asked on its public address over plain HTTP instead.
    pub async fn call_member_api(
        &self,
        id: u64,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        authorization: Option<&str>,
        timeout: Duration,
    ) -> Result<(u16, String), String> {
        let peer_addr = self
            .member_addr(id)
            .ok_or_else(|| format!("node {id} is not a member"))?;
        let call = MemberApiCall {
            method: method.to_string(),
            path: path.to_string(),
            authorization: authorization.map(str::to_string),
            body: body.unwrap_or_default(),
        };
        let answer = self
            .peers
            .post::<_, MemberApiAnswer>(id, &peer_addr, MEMBER_API_PATH, &call, timeout)
            .await;
        match answer {
            Ok(a) => Ok((a.status, String::from_utf8_lossy(&a.body).into_owned())),
            Err(PeerError::Status { status: 404, .. }) => {
                let api_addr = self
                    .member_api_addr(id)
                    .ok_or_else(|| format!("node {id} is not a member"))?;
                self.peers
                    .http_json(method, &api_addr, path, call.body, timeout, authorization)
                    .await
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        }
    }
}
