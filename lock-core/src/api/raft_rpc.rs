//! Node-to-node endpoints: raft RPCs and the internal write/read-index calls a follower uses
//! to reach the leader. Incoming traffic passes the fault layer first. Bodies and replies are
//! in the peer wire format ([`codec`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesResponse, VoteRequest, VoteResponse};
use serde::Serialize;

use super::ApiError;
use crate::machine::Command;
use crate::net::codec::{self, CodecError};
use crate::net::FROM_HEADER;
use crate::node::{
    CampaignNowRequest, ForwardReply, MemberApiAnswer, MemberApiCall, Node, PreVoteRequest,
    MAX_MEMBER_API_ANSWER,
};
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

fn bad_body(e: CodecError) -> Response {
    ApiError::invalid(format!("Bad peer message: {e}.")).into_response()
}

fn reply<T: Serialize>(value: &T) -> Response {
    match codec::encode(value) {
        Ok(bytes) => ([(header::CONTENT_TYPE, codec::CONTENT_TYPE)], bytes).into_response(),
        Err(e) => ApiError::new(
            ErrorCode::Internal,
            format!("Cannot encode the reply: {e}."),
        )
        .into_response(),
    }
}

pub async fn append(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    let rpc = match codec::decode(&body) {
        Ok(rpc) => rpc,
        Err(e) => return bad_body(e),
    };
    let held = node.vote_hold.is_held();
    if held {
        node.vote_hold.heard(&rpc);
    }
    let sent = rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id);
    let term = rpc.vote.leader_id.term;
    let answer = node.raft.append_entries(rpc).await;
    if !matches!(answer, Ok(AppendEntriesResponse::HigherVote(_)) | Err(_)) {
        node.leader_contact.heard(term);
    }
    if !held {
        return reply(&answer);
    }
    // What the answer says the log now matches, read from it rather than from raft's
    // metrics, which may not show it yet when the leader that sent it is gone next.
    let matched = match &answer {
        Ok(AppendEntriesResponse::Success) => sent,
        Ok(AppendEntriesResponse::PartialSuccess(matching)) => *matching,
        _ => None,
    };
    caught_up(&node, matched.map(|l| l.index));
    reply(&answer)
}

/// Lets a node that holds back its vote (it started empty) vote and campaign again once its
/// log (up to `last_log`) reached a commit index a leader sent it (see `VoteHold`).
fn caught_up(node: &Node, last_log: Option<u64>) {
    node.vote_hold.caught_up(last_log);
}

pub async fn vote(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    let rpc: VoteRequest<u64> = match codec::decode(&body) {
        Ok(rpc) => rpc,
        Err(e) => return bad_body(e),
    };
    if node
        .config
        .founder()
        .is_some_and(|f| node.vote_hold.refuses(&rpc, f))
    {
        let refused: Result<VoteResponse<u64>, RaftError<u64>> = Ok(VoteResponse {
            vote: node.raft.metrics().borrow().vote,
            vote_granted: false,
            last_log_id: node.raft.data_metrics().borrow().last_log,
        });
        return reply(&refused);
    }
    reply(&node.raft.vote(rpc).await)
}

/// Would this node vote for the caller? Changes nothing (see `node::campaign`).
pub async fn pre_vote(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    match codec::decode::<PreVoteRequest>(&body) {
        Ok(req) => reply(&node.pre_vote(&req)),
        Err(e) => bad_body(e),
    }
}

/// The leader, stepping aside, asks this node to campaign at once (see `node::campaign`).
pub async fn campaign_now(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    match codec::decode::<CampaignNowRequest>(&body) {
        Ok(req) => reply(&node.campaign_now(&req).await),
        Err(e) => bad_body(e),
    }
}

/// One chunk of a snapshot; openraft assembles the chunks and installs the snapshot when the
/// last one arrives.
pub async fn snapshot(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    match codec::decode_snapshot_chunk(&body) {
        Ok(rpc) => {
            let sender = rpc.vote;
            let answer = node.raft.install_snapshot(rpc).await;
            // Answered with a vote other than the sender's: the sender is no longer leader.
            if answer.as_ref().is_ok_and(|a| a.vote == sender) {
                node.leader_contact.heard(sender.leader_id.term);
            }
            if node.vote_hold.is_held() {
                let last_log = node.raft.metrics().borrow().last_log_index;
                caught_up(&node, last_log);
            }
            reply(&answer)
        }
        Err(e) => bad_body(e),
    }
}

/// A follower's forwarded command. Only proposes locally: it never forwards again, so a
/// stale leader hint cannot make requests bounce between nodes.
pub async fn propose(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    let cmd: Command = match codec::decode(&body) {
        Ok(c) => c,
        Err(e) => return bad_body(e),
    };
    let timeout = Duration::from_millis(node.config.policy.write_timeout_ms);
    reply(&node.propose_local(cmd, timeout).await.map(|c| c.response))
}

/// A batch of commands a follower forwards (see `node::forward`): each gets its own answer,
/// and the reply names a log index that includes them all.
pub async fn forward(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    match forwarded_batch(&node, &headers, &body).await {
        Ok(forwarded) => reply(&forwarded),
        Err(refused) => refused,
    }
}

/// The same for followers of earlier versions: the bare answers.
pub async fn propose_batch(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match forwarded_batch(&node, &headers, &body).await {
        Ok(forwarded) => reply(&forwarded.answers),
        Err(refused) => refused,
    }
}

async fn forwarded_batch(
    node: &Node,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<ForwardReply, Response> {
    admit(node, headers).map_err(IntoResponse::into_response)?;
    let cmds: Vec<Command> = codec::decode(body).map_err(bad_body)?;
    let timeout = Duration::from_millis(node.config.policy.write_timeout_ms);
    Ok(node.propose_local_all(cmds, timeout).await)
}

pub async fn read_index(State(node): State<Arc<Node>>, headers: HeaderMap) -> Response {
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    let timeout = Duration::from_millis(node.config.policy.write_timeout_ms);
    reply(&node.local_read_index(timeout).await)
}

/// A call for this node's public API from another member (a relayed operator call, a health
/// probe): run through the public routes, so the caller's credential is checked as usual.
pub async fn member_api(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    use tower::ServiceExt;
    if let Err(e) = admit(&node, &headers) {
        return e.into_response();
    }
    let call: MemberApiCall = match codec::decode(&body) {
        Ok(call) => call,
        Err(e) => return bad_body(e),
    };
    if !call.path.starts_with('/') {
        return ApiError::invalid("A relayed call's path must start with '/'.").into_response();
    }
    let Ok(method) = axum::http::Method::from_bytes(call.method.as_bytes()) else {
        return ApiError::invalid("A relayed call names no HTTP method.").into_response();
    };
    let mut request = axum::http::Request::builder()
        .method(method)
        .uri(&call.path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(auth) = &call.authorization {
        request = request.header(header::AUTHORIZATION, auth);
    }
    let request = match request.body(axum::body::Body::from(call.body)) {
        Ok(r) => r,
        Err(e) => return ApiError::invalid(format!("Bad relayed call: {e}.")).into_response(),
    };
    let Ok(answer) = super::router(node.clone()).oneshot(request).await;
    let status = answer.status().as_u16();
    match axum::body::to_bytes(answer.into_body(), MAX_MEMBER_API_ANSWER).await {
        Ok(body) => reply(&MemberApiAnswer {
            status,
            body: body.to_vec(),
        }),
        Err(e) => ApiError::new(
            ErrorCode::Internal,
            format!("The relayed call's answer could not be read: {e}."),
        )
        .into_response(),
    }
}
