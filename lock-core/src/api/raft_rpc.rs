//! Node-to-node endpoints: raft RPCs and the internal write/read-index calls a follower uses
//! to reach the leader. Incoming traffic passes the fault layer first.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{parse_json, ApiError};
use crate::machine::Command;
use crate::net::FROM_HEADER;
use crate::node::Node;
use crate::wire::ErrorCode;

fn admit(node: &Node, headers: &HeaderMap) -> Result<(), ApiError> {
    let from = headers
        .get(FROM_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match from {
        Some(peer) if !node.faults().incoming_allowed(peer) => Err(ApiError::new(
            ErrorCode::Partitioned,
            "Traffic from this peer is blocked by an injected fault.",
        )),
        _ => Ok(()),
    }
}

pub async fn append(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    match parse_json(&body) {
        Ok(rpc) => Json(node.raft.append_entries(rpc).await).into_response(),
        Err(e) => e.into_response(),
    }
}

pub async fn vote(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    match parse_json(&body) {
        Ok(rpc) => Json(node.raft.vote(rpc).await).into_response(),
        Err(e) => e.into_response(),
    }
}

pub async fn snapshot(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    match parse_json(&body) {
        Ok(rpc) => Json(node.raft.install_snapshot(rpc).await).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A follower's forwarded command. Only proposes locally: it never forwards again, so a
/// stale leader hint cannot make requests bounce between nodes.
pub async fn propose(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    let cmd: Command = match parse_json(&body) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let timeout = Duration::from_millis(node.config.policy.write_timeout_ms);
    Json(node.propose_local(cmd, timeout).await).into_response()
}

pub async fn read_index(State(node): State<Arc<Node>>, headers: HeaderMap) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    let timeout = Duration::from_millis(node.config.policy.write_timeout_ms);
    Json(node.local_read_index(timeout).await).into_response()
}
