//! Operator actions: forced release, drain (the leader steps aside), snapshot, membership.
//! Each needs the admin credential, names its operator, and is audited (fsynced) on the node
//! that answered, refusals included.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::Json;

use super::auth::require_admin;
use crate::api::{cluster, parse_json, ApiError};
use crate::machine::{Command, Response};
use crate::node::{Committed, Node};
use crate::wire::{
    validate_id, validate_stored_name, AddMemberRequest, AdminAddMember, AdminRemoveMember,
    DrainRequest, DrainResponse, ErrorBody, ErrorCode, ForceReleaseResponse, OperatorRequest,
    RemoveMemberRequest, SnapshotResponse,
};

/// How long a drain waits for another voter to take over, and a snapshot to be built.
const ACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The credential check and the operator's name; a refusal is audited too.
pub(in crate::api) fn authorize<'h>(
    node: &Node,
    headers: &'h HeaderMap,
    op: &str,
    operator: &str,
    resource: Option<&str>,
) -> Result<&'h str, ApiError> {
    match require_admin(node, headers) {
        Ok(auth) => {
            validate_id(operator, "operator").map_err(ApiError::invalid)?;
            Ok(auth)
        }
        Err(e) => {
            node.record_refused_action(op, Some(operator), resource, e.code().as_str());
            Err(e)
        }
    }
}

/// `POST /v1/admin/force-release/{resource} {operator}`: ends the resource's lease through
/// raft, exactly as its holder's release would.
pub async fn force_release(
    State(node): State<Arc<Node>>,
    resource: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<ForceReleaseResponse>, ApiError> {
    let Path(resource) = resource
        .map_err(|e| ApiError::invalid(format!("Bad resource in the URL: {}.", e.body_text())))?;
    let req: OperatorRequest = parse_json(&body)?;
    authorize(
        &node,
        &headers,
        "force_release",
        &req.operator,
        Some(&resource),
    )?;
    validate_stored_name(&resource).map_err(ApiError::invalid)?;
    let cmd = Command::ForceRelease {
        resource: resource.clone(),
        operator: req.operator.clone(),
    };
    let (token, index) = match node.propose_committed(cmd).await {
        Ok(Committed {
            response: Response::ForceReleased { fencing_token },
            index,
        }) => (fencing_token, index),
        Ok(Committed {
            response: other, ..
        }) => {
            return Err(ApiError::new(
                ErrorCode::Internal,
                format!("Unexpected state machine response {other:?}; this is a bug."),
            ))
        }
        Err(e) => {
            let e = ApiError::from(e);
            node.record_operator_action(
                "force_release",
                &req.operator,
                Some(&resource),
                None,
                e.code().as_str(),
                None,
            );
            return Err(e);
        }
    };
    let released = token.is_some();
    if released {
        // As after a holder's release: answer once no proxy forwards the token any more.
        crate::api::locks::wait_revoked(&node, &resource, index).await;
    }
    node.record_operator_action(
        "force_release",
        &req.operator,
        Some(&resource),
        token,
        if released { "released" } else { "not_held" },
        None,
    );
    Ok(Json(ForceReleaseResponse {
        resource,
        released,
        fencing_token: token,
    }))
}

/// `POST /v1/admin/snapshot {operator}`: builds a snapshot on this node now and waits until it
/// covers everything applied when asked.
pub async fn snapshot(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<SnapshotResponse>, ApiError> {
    let req: OperatorRequest = parse_json(&body)?;
    authorize(&node, &headers, "snapshot", &req.operator, None)?;
    let applied = node
        .raft
        .metrics()
        .borrow()
        .last_applied
        .map_or(0, |l| l.index);
    let result = async {
        node.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| action_failed(format!("The snapshot was not started: {e}.")))?;
        let mut rx = node.raft.metrics();
        let covered = |m: &openraft::RaftMetrics<u64, crate::raft::NodeInfo>| {
            m.snapshot.is_some_and(|s| s.index >= applied)
        };
        let waited = tokio::time::timeout(ACTION_TIMEOUT, async {
            while !covered(&rx.borrow()) {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        })
        .await;
        let index = rx.borrow().snapshot.map(|s| s.index);
        match waited {
            Ok(()) if index.is_some_and(|i| i >= applied) => Ok(index),
            _ => Err(action_failed(format!(
                "No snapshot covering index {applied} within {} s; check the node's log.",
                ACTION_TIMEOUT.as_secs()
            ))),
        }
    }
    .await;
    let outcome = match &result {
        Ok(_) => "done",
        Err(e) => e.code().as_str(),
    };
    node.record_operator_action(
        "snapshot",
        &req.operator,
        None,
        None,
        outcome,
        Some(format!("node {}", node.id)),
    );
    result.map(|snapshot_index| {
        Json(SnapshotResponse {
            node_id: node.id,
            snapshot_index,
        })
    })
}

/// `POST /v1/admin/drain {operator, to?}`: the leader steps aside and another voter takes over
/// (`to`, or the follower whose appends the leader has lately seen answered fastest).
///
/// openraft 0.9 has no leader transfer, so this is done with what it offers: the leader stops
/// heartbeats and proposes nothing (callers' writes wait and retry, as in any election), and
/// asks a follower that holds its whole log to campaign at once; that one wins with the old
/// leader's vote, and the old leader becomes its follower. If no follower can (none caught up,
/// one of an older version), the followers' leader lease runs out and one of them wins an
/// election of its own. Best effort: if no voter takes over within the timeout, the old
/// leader resumes.
pub async fn drain(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let req: DrainRequest = parse_json(&body)?;
    let auth = authorize(&node, &headers, "drain", &req.operator, None)?;
    let leader = node.current_leader().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NoQuorum,
            "This node knows no leader right now (an election may be under way, or it is cut \
             off from the others), so there is none to drain; retry in a moment, or on \
             another node.",
        )
    })?;
    if leader != node.id {
        // The leader does it, and audits it there too; this node records that it relayed.
        let relayed = relay(&node, leader, "/v1/admin/drain", &req, auth).await;
        let outcome = match &relayed {
            Ok(_) => "relayed".to_string(),
            Err(e) => e.code().as_str().to_string(),
        };
        node.record_operator_action(
            "drain",
            &req.operator,
            None,
            None,
            &outcome,
            Some(format!("leader {leader}")),
        );
        return relayed;
    }
    let result = step_aside(&node, req.to).await;
    let (outcome, detail) = match &result {
        Ok(d) => (
            "done".to_string(),
            format!("leader {} -> {}", d.old_leader, d.new_leader),
        ),
        Err(e) => (e.code().as_str().to_string(), format!("leader {}", node.id)),
    };
    node.record_operator_action("drain", &req.operator, None, None, &outcome, Some(detail));
    result.map(|d| Json(d).into_response())
}

async fn step_aside(node: &Node, to: Option<u64>) -> Result<DrainResponse, ApiError> {
    let voters: Vec<u64> = node
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    if voters.len() < 2 {
        return Err(action_failed(
            "This leader is the only voter; there is nobody to hand over to.",
        ));
    }
    match to {
        Some(t) if t == node.id => {
            return Err(ApiError::invalid(format!(
                "to: node {t} is the leader that steps aside; name another voter."
            )))
        }
        Some(t) if !voters.contains(&t) => {
            return Err(ApiError::invalid(format!(
                "to: node {t} is not a voter of this cluster (voters: {voters:?})."
            )))
        }
        _ => {}
    }
    node.ops.draining.store(true, Ordering::SeqCst);
    node.raft.runtime_config().heartbeat(false);
    let deadline = Instant::now() + ACTION_TIMEOUT;
    crate::node::hand_over(node, to).await;
    let mut rx = node.raft.metrics();
    let taken_over = loop {
        {
            let m = rx.borrow();
            if let Some(l) = m.current_leader.filter(|l| *l != node.id) {
                break Some((l, m.current_term));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
            break None;
        }
    };
    node.raft.runtime_config().heartbeat(true);
    node.ops.draining.store(false, Ordering::Release);
    match taken_over {
        Some((new_leader, term)) => Ok(DrainResponse {
            old_leader: node.id,
            new_leader,
            term,
        }),
        None => Err(action_failed(format!(
            "No other voter took over within {} s; node {} leads on.",
            ACTION_TIMEOUT.as_secs(),
            node.id
        ))),
    }
}

/// `POST /v1/admin/members/add {operator, node_id, addr}`.
pub async fn add_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let req: AdminAddMember = parse_json(&body)?;
    let auth = authorize(&node, &headers, "add_member", &req.operator, None)?;
    let detail = format!("node {} at {}", req.node_id, req.addr);
    let result = cluster::add(
        &node,
        AddMemberRequest {
            node_id: req.node_id,
            addr: req.addr,
            peer_addr: req.peer_addr,
            catch_up_timeout_ms: None,
        },
        Some(auth),
    )
    .await;
    audit_result(&node, "add_member", &req.operator, detail, &result);
    result
}

/// `POST /v1/admin/members/remove {operator, node_id}`.
pub async fn remove_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let req: AdminRemoveMember = parse_json(&body)?;
    let auth = authorize(&node, &headers, "remove_member", &req.operator, None)?;
    let detail = format!("node {}", req.node_id);
    let result = cluster::remove(
        &node,
        RemoveMemberRequest {
            node_id: req.node_id,
            force: false,
        },
        Some(auth),
    )
    .await;
    audit_result(&node, "remove_member", &req.operator, detail, &result);
    result
}

pub(in crate::api) fn audit_result(
    node: &Node,
    op: &str,
    operator: &str,
    detail: String,
    result: &Result<HttpResponse, ApiError>,
) {
    let outcome = match result {
        Ok(r) if r.status().is_success() => "done".to_string(),
        // A relayed answer carries the leader's status; its code is in the body we pass on.
        Ok(r) => r.status().as_u16().to_string(),
        Err(e) => e.code().as_str().to_string(),
    };
    node.record_operator_action(op, operator, None, None, &outcome, Some(detail));
}

/// Passes an operator call to the leader with the caller's credential; the leader's answer,
/// error or not, is the caller's answer.
async fn relay(
    node: &Node,
    leader: u64,
    path: &str,
    body: &DrainRequest,
    auth: &str,
) -> Result<HttpResponse, ApiError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::new(
            ErrorCode::NoQuorum,
            format!("Could not reach the leader: {e}"),
        )
    };
    let body = serde_json::to_vec(body).map_err(|e| unreachable(&e))?;
    let (status, answer) = node
        .call_member_api(
            leader,
            "POST",
            path,
            Some(body),
            Some(auth),
            ACTION_TIMEOUT + Duration::from_secs(5),
        )
        .await
        .map_err(|e| unreachable(&e))?;
    if (200..300).contains(&status) {
        return match serde_json::from_str::<DrainResponse>(&answer) {
            Ok(d) => Ok(Json(d).into_response()),
            Err(e) => Err(action_failed(format!(
                "The leader's answer did not parse ({e}): {answer}"
            ))),
        };
    }
    // The leader's refusal, whatever its status, is the caller's answer.
    let body = ErrorBody::from_answer(status, answer.as_bytes());
    Err(ApiError::new(body.error, body.message)
        .with_status(axum::http::StatusCode::from_u16(status).unwrap_or_default()))
}

fn action_failed(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::ActionFailed, message)
}
