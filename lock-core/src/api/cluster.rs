//! Cluster status, membership changes, health, metrics and the fault-injection admin call.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use openraft::ServerState;
use serde::Serialize;
use serde_json::Value;

use super::admin::check_admin_if_configured;
use super::{parse_json, ApiError};
use crate::net::PeerError;
use crate::node::Node;
use crate::raft::NodeInfo;
use crate::wire::{
    AddMemberRequest, ClusterStatus, ErrorCode, FaultSnapshot, HealthStatus, Member,
    MembershipResponse, ReadyStatus, RemoveMemberRequest, Role,
};

/// `GET /v1/cluster`: this node's view of the cluster (not linearizable: it is a status page).
pub async fn status(State(node): State<Arc<Node>>) -> Json<ClusterStatus> {
    Json(cluster_status(&node))
}

pub(super) fn cluster_status(node: &Node) -> ClusterStatus {
    let m = node.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, n)| Member {
            id: *id,
            addr: n.api_addr.clone(),
            voter: voters.contains(id),
        })
        .collect();
    ClusterStatus {
        node_id: node.id,
        leader_id: m.current_leader,
        term: m.current_term,
        role: role(m.state),
        members,
        last_log_index: m.last_log_index,
        last_applied: m.last_applied.map_or(0, |l| l.index),
        snapshot_index: m.snapshot.map(|l| l.index),
        purged_index: m.purged.map(|l| l.index),
        millis_since_quorum_ack: m.millis_since_quorum_ack,
        locks: node.machine.read(|s| s.stats()),
    }
}

pub(super) fn role(state: ServerState) -> Role {
    match state {
        ServerState::Leader => Role::Leader,
        ServerState::Follower => Role::Follower,
        ServerState::Candidate => Role::Candidate,
        ServerState::Learner => Role::Learner,
        ServerState::Shutdown => Role::Shutdown,
    }
}

/// Membership changes run on the leader; a follower relays the call there and hands back
/// the leader's answer as it is — an error the leader gives (400, 409) is the caller's answer,
/// not a 503 about reaching the leader.
pub(super) async fn relay_to_leader<B: Serialize>(
    node: &Node,
    path: &str,
    body: &B,
    authorization: Option<&str>,
) -> Result<Response, ApiError> {
    let leader = node
        .current_leader()
        .ok_or_else(|| ApiError::from(crate::node::ProposeError::NoQuorum))?;
    let addr = node
        .member_addr(leader)
        .ok_or_else(|| ApiError::from(crate::node::ProposeError::NoQuorum))?;
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::new(
            ErrorCode::NoQuorum,
            format!("Could not reach the leader: {e}"),
        )
    };
    match node
        .peers
        .post_as::<_, Value>(
            leader,
            &addr,
            path,
            body,
            Duration::from_secs(30),
            authorization,
        )
        .await
    {
        Ok(v) => Ok(Json(v).into_response()),
        Err(PeerError::Status {
            status,
            body: answer,
            ..
        }) => match (
            StatusCode::from_u16(status),
            serde_json::from_str::<Value>(&answer),
        ) {
            (Ok(status), Ok(answer)) => Ok((status, Json(answer)).into_response()),
            _ => Err(unreachable(&format!(
                "node {leader} answered {status}: {answer}"
            ))),
        },
        Err(e) => Err(unreachable(&e)),
    }
}

fn membership_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::MembershipChangeFailed,
        format!("The membership change was refused: {e}. Check /v1/cluster and retry."),
    )
}

/// `POST /v1/cluster/members/add {node_id, addr}`: adds a node as a learner, waits for it to
/// catch up, then promotes it to voter. Needs the admin credential when the node has one.
pub async fn add_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let auth = check_admin_if_configured(&node, &headers)?;
    let req: AddMemberRequest = parse_json(&body)?;
    add(&node, req, auth).await
}

pub(super) async fn add(
    node: &Node,
    req: AddMemberRequest,
    authorization: Option<&str>,
) -> Result<Response, ApiError> {
    if req.addr.is_empty() {
        return Err(ApiError::invalid("Field 'addr' must be host:port."));
    }
    if node.current_leader() != Some(node.id) {
        return relay_to_leader(node, "/v1/cluster/members/add", &req, authorization).await;
    }
    node.raft
        .add_learner(req.node_id, NodeInfo { api_addr: req.addr }, true)
        .await
        .map_err(membership_error)?;
    let mut voters: BTreeSet<u64> = node
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    voters.insert(req.node_id);
    node.raft
        .change_membership(voters.clone(), false)
        .await
        .map_err(membership_error)?;
    Ok(Json(MembershipResponse { voters }).into_response())
}

/// `POST /v1/cluster/members/remove {node_id}`: removes a voter (and forgets the node).
/// Needs the admin credential when the node has one.
pub async fn remove_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let auth = check_admin_if_configured(&node, &headers)?;
    let req: RemoveMemberRequest = parse_json(&body)?;
    remove(&node, req, auth).await
}

pub(super) async fn remove(
    node: &Node,
    req: RemoveMemberRequest,
    authorization: Option<&str>,
) -> Result<Response, ApiError> {
    if node.current_leader() != Some(node.id) {
        return relay_to_leader(node, "/v1/cluster/members/remove", &req, authorization).await;
    }
    let mut voters: BTreeSet<u64> = node
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    if !voters.remove(&req.node_id) {
        return Err(ApiError::invalid(format!(
            "Node {} is not a voter.",
            req.node_id
        )));
    }
    if voters.is_empty() {
        return Err(ApiError::invalid("Cannot remove the last voter."));
    }
    node.raft
        .change_membership(voters.clone(), false)
        .await
        .map_err(membership_error)?;
    Ok(Json(MembershipResponse { voters }).into_response())
}

pub async fn healthz() -> Json<HealthStatus> {
    Json(HealthStatus {
        status: "ok".into(),
    })
}

/// Ready when this node knows a leader (it can then serve every call).
pub async fn readyz(State(node): State<Arc<Node>>) -> Result<Json<ReadyStatus>, ApiError> {
    match node.current_leader() {
        Some(leader_id) => Ok(Json(ReadyStatus {
            status: "ready".into(),
            leader_id,
        })),
        None => Err(ApiError::new(
            ErrorCode::NoLeader,
            "This node does not know a leader yet (election in progress or partitioned).",
        )),
    }
}

pub async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    node.refresh_gauges();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        node.metrics.render(),
    )
}

fn faults_enabled(node: &Node) -> Result<(), ApiError> {
    if node.config.enable_fault_injection {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::FaultInjectionDisabled,
            "Fault injection is off on this node (enable_fault_injection in its config).",
        ))
    }
}

pub async fn get_faults(State(node): State<Arc<Node>>) -> Result<Json<FaultSnapshot>, ApiError> {
    faults_enabled(&node)?;
    Ok(Json(node.faults().snapshot()))
}

/// `PUT /v1/admin/faults`: replaces this node's fault rules (per peer id) and clock offset.
pub async fn put_faults(
    State(node): State<Arc<Node>>,
    body: Bytes,
) -> Result<Json<FaultSnapshot>, ApiError> {
    faults_enabled(&node)?;
    let snapshot: FaultSnapshot = parse_json(&body)?;
    node.faults().replace(snapshot);
    Ok(Json(node.faults().snapshot()))
}
