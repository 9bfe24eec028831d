//! Cluster status, membership changes, health, metrics and the fault-injection admin call.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use openraft::{ChangeMembers, ServerState};
use serde::Serialize;
use serde_json::Value;

use super::admin::{audit_result, authorize, check_admin_if_configured};
use super::{parse_json, ApiError};
use crate::node::ops::Behind;
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
            peer_addr: n.peer_addr().to_string(),
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
    extra_time: Duration,
    authorization: Option<&str>,
) -> Result<Response, ApiError> {
    let leader = node
        .current_leader()
        .ok_or_else(|| ApiError::from(crate::node::ProposeError::NoQuorum))?;
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
            authorization,
            Duration::from_secs(30) + extra_time,
        )
        .await
        .map_err(|e| unreachable(&e))?;
    match (
        StatusCode::from_u16(status),
        serde_json::from_str::<Value>(&answer),
    ) {
        (Ok(status), Ok(answer)) => Ok((status, Json(answer)).into_response()),
        _ => Err(unreachable(&format!(
            "node {leader} answered {status}: {answer}"
        ))),
    }
}

/// `host:port` with a port number and a host name or address (IPv6 in brackets).
fn is_host_port(addr: &str) -> bool {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        }
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

fn membership_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::MembershipChangeFailed,
        format!("The membership change was refused: {e}. Check /v1/cluster and retry."),
    )
}

/// How close (in log entries) a learner must come to the leader's log before it is promoted.
const CAUGHT_UP_LAG: u64 = 100;
/// Default and largest time a learner gets to catch up before an add is refused.
const DEFAULT_CATCH_UP: Duration = Duration::from_secs(20);
const MAX_CATCH_UP: Duration = Duration::from_secs(600);
/// How long the leader waits for a member's `/healthz` when judging whether a removal keeps a
/// reachable quorum.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

fn voters(node: &Node) -> BTreeSet<u64> {
    node.raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect()
}

/// `POST /v1/cluster/members/add {node_id, addr, peer_addr, catch_up_timeout_ms?}`: adds the node as a
/// learner, waits until it has caught up with the leader's log, and only then makes it a
/// voter. A node that cannot catch up in time (down, unreachable, too slow) is removed again
/// and the call answers 409 `member_not_caught_up`: the voter set never gains a member that
/// cannot vote.
/// Needs the admin credential; a node without one refuses.
pub async fn add_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let auth = authorize(&node, &headers, "add_member", CLUSTER_API_OPERATOR, None)?;
    let req: AddMemberRequest = parse_json(&body)?;
    let detail = format!("node {} at {}", req.node_id, req.addr);
    let result = add(&node, req, Some(auth)).await;
    audit_result(&node, "add_member", CLUSTER_API_OPERATOR, detail, &result);
    result
}

/// The operator name membership changes made through `/v1/cluster/members/*` (the CLI's, and
/// those a member relays to the leader) are audited under: these calls name no operator.
const CLUSTER_API_OPERATOR: &str = "cluster-api";

pub(super) async fn add(
    node: &Node,
    req: AddMemberRequest,
    authorization: Option<&str>,
) -> Result<Response, ApiError> {
    if !is_host_port(&req.addr) || !is_host_port(&req.peer_addr) {
        return Err(ApiError::invalid(
            "Fields 'addr' (its API) and 'peer_addr' (its peer listener) must be host:port.",
        ));
    }
    let catch_up = req
        .catch_up_timeout_ms
        .map_or(DEFAULT_CATCH_UP, Duration::from_millis);
    if catch_up.is_zero() || catch_up > MAX_CATCH_UP {
        return Err(ApiError::invalid(format!(
            "catch_up_timeout_ms must be 1–{}.",
            MAX_CATCH_UP.as_millis()
        )));
    }
    if node.current_leader() != Some(node.id) {
        return relay_to_leader(
            node,
            "/v1/cluster/members/add",
            &req,
            catch_up,
            authorization,
        )
        .await;
    }
    let mut voters = voters(node);
    if voters.contains(&req.node_id) {
        // The same member again is a retry, answered as done; another address under a
        // voter's id is a mistake (ids are never reused), refused rather than ignored.
        let known = node
            .member_api_addr(req.node_id)
            .zip(node.member_addr(req.node_id));
        return match known {
            Some((api, peer)) if api == req.addr && peer == req.peer_addr => {
                Ok(Json(MembershipResponse { voters }).into_response())
            }
            Some((api, peer)) => Err(ApiError::new(
                ErrorCode::MembershipChangeFailed,
                format!(
                    "Node {} is already a voter, at {api} (peer {peer}); node ids are never \
                     reused: give the new node an id no member has had, or remove node {} first.",
                    req.node_id, req.node_id
                ),
            )),
            None => Ok(Json(MembershipResponse { voters }).into_response()),
        };
    }
    node.raft
        .add_learner(
            req.node_id,
            NodeInfo {
                api_addr: req.addr.clone(),
                peer_addr: req.peer_addr.clone(),
            },
            false,
        )
        .await
        .map_err(membership_error)?;
    let started = Instant::now();
    if let Err(lag) = wait_caught_up(node, req.node_id, catch_up).await {
        // The health probes reach learners too: their last failure is often the cause (a
        // wrong peer secret, a port that refuses).
        let probe = node
            .ops
            .health
            .get(req.node_id)
            .and_then(|p| p.error)
            .map(|e| format!(" The leader's last call to it failed: {e}."))
            .unwrap_or_default();
        // Leave no half-added member behind: a learner that never answers only costs the
        // leader replication work, but the operator asked for a voter and did not get one.
        if let Err(e) = node
            .raft
            .change_membership(ChangeMembers::RemoveNodes([req.node_id].into()), false)
            .await
        {
            tracing::warn!(node = req.node_id, error = %e, "could not remove the learner again");
        }
        return Err(ApiError::new(
            ErrorCode::MemberNotCaughtUp,
            format!(
                "Node {} at {} did not catch up with the leader's log within {} ms ({lag}); it \
                 was not made a voter and was removed again.{probe} Check that it runs, is \
                 reachable from the leader and has the cluster's peer secret, then retry.",
                req.node_id,
                req.addr,
                catch_up.as_millis()
            ),
        ));
    }
    tracing::info!(
        node = req.node_id,
        caught_up_ms = started.elapsed().as_millis() as u64,
        "learner caught up; promoting it to voter"
    );
    voters.insert(req.node_id);
    node.raft
        .change_membership(voters.clone(), false)
        .await
        .map_err(membership_error)?;
    Ok(Json(MembershipResponse { voters }).into_response())
}

/// Waits until the leader has replicated to `id` up to within `CAUGHT_UP_LAG` entries of its
/// own log. On timeout, says how far behind the learner was.
async fn wait_caught_up(node: &Node, id: u64, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut metrics = node.raft.metrics();
    let mut last_progress = Instant::now();
    loop {
        let (matched, last) = {
            let m = metrics.borrow_and_update();
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map(|l| l.index);
            (matched, m.last_log_index.unwrap_or(0))
        };
        if matched.is_some_and(|i| i + CAUGHT_UP_LAG >= last) {
            return Ok(());
        }
        let describe = || match matched {
            Some(i) => format!("it had {i} of the leader's {last} log entries"),
            None => format!("it had none of the leader's {last} log entries"),
        };
        if last_progress.elapsed() >= Duration::from_secs(2) {
            tracing::info!(node = id, progress = %describe(), "learner catching up");
            last_progress = Instant::now();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(describe());
        }
        // Metrics change with every replication step; the timeout keeps a silent learner from
        // parking us past the deadline.
        let _ = tokio::time::timeout(left.min(Duration::from_millis(500)), metrics.changed()).await;
    }
}

/// `POST /v1/cluster/members/remove {node_id, force?}`: removes a voter or learner. A removal
/// that would leave fewer reachable voters than a quorum of the new voter set is refused with
/// 409 `quorum_at_risk` unless `force` is set. Removing the leader is allowed: it commits the
/// new configuration, steps down, and the remaining voters elect a new leader.
/// Needs the admin credential; a node without one refuses.
pub async fn remove_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let auth = authorize(&node, &headers, "remove_member", CLUSTER_API_OPERATOR, None)?;
    let req: RemoveMemberRequest = parse_json(&body)?;
    let detail = format!("node {}", req.node_id);
    let result = remove(&node, req, Some(auth)).await;
    audit_result(
        &node,
        "remove_member",
        CLUSTER_API_OPERATOR,
        detail,
        &result,
    );
    result
}

pub(super) async fn remove(
    node: &Node,
    req: RemoveMemberRequest,
    authorization: Option<&str>,
) -> Result<Response, ApiError> {
    if node.current_leader() != Some(node.id) {
        return relay_to_leader(
            node,
            "/v1/cluster/members/remove",
            &req,
            Duration::ZERO,
            authorization,
        )
        .await;
    }
    let mut voters = voters(node);
    if !voters.remove(&req.node_id) {
        let is_member = node.member_addr(req.node_id).is_some();
        if !is_member {
            return Err(ApiError::invalid(format!(
                "Node {} is not a member.",
                req.node_id
            )));
        }
        node.raft
            .change_membership(ChangeMembers::RemoveNodes([req.node_id].into()), false)
            .await
            .map_err(membership_error)?;
        return Ok(Json(MembershipResponse { voters }).into_response());
    }
    if voters.is_empty() {
        return Err(ApiError::invalid("Cannot remove the last voter."));
    }
    if !req.force {
        let mut reachable = 0;
        for id in &voters {
            if *id == node.id || probe(node, *id).await {
                reachable += 1;
            }
        }
        let quorum = voters.len() / 2 + 1;
        if reachable < quorum {
            return Err(ApiError::new(
                ErrorCode::QuorumAtRisk,
                format!(
                    "Removing node {} would leave {reachable} reachable voter(s) of {}, fewer \
                     than the quorum of {quorum}: the cluster could stop accepting writes. Bring \
                     the other voters back first, or force the removal (`\"force\": true` in the \
                     request; `--force` with `fencegate cluster remove`).",
                    req.node_id,
                    voters.len()
                ),
            ));
        }
    }
    node.raft
        .change_membership(voters.clone(), false)
        .await
        .map_err(membership_error)?;
    Ok(Json(MembershipResponse { voters }).into_response())
}

/// Whether a member answers `/healthz` within `PROBE_TIMEOUT` (over the peer port).
async fn probe(node: &Node, id: u64) -> bool {
    let asked = node.call_member_api(id, "GET", "/healthz", None, None, PROBE_TIMEOUT);
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, asked).await,
        Ok(Ok((200..=299, _)))
    )
}

/// Alive unless raft has stopped on its own (a full or failing disk): such a node serves
/// nothing until it is restarted, so a supervisor that probes this should restart it.
pub async fn healthz(State(node): State<Arc<Node>>) -> Result<Json<HealthStatus>, ApiError> {
    if let Some(cause) = node.raft_failure() {
        return Err(raft_stopped(&cause));
    }
    Ok(Json(HealthStatus {
        status: "ok".into(),
    }))
}

fn raft_stopped(cause: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NodeStopped,
        format!(
            "Raft stopped on this node ({cause}); it serves nothing until restarted. See its log."
        ),
    )
}

/// Ready when this node is in touch with a leader and, as a follower, keeps up with it (it can
/// then serve every call without waiting).
pub async fn readyz(State(node): State<Arc<Node>>) -> Result<Json<ReadyStatus>, ApiError> {
    readiness(&node).map(Json)
}

/// What `/readyz` answers, and `fencegate_ready` shows.
fn readiness(node: &Node) -> Result<ReadyStatus, ApiError> {
    if let Some(cause) = node.raft_failure() {
        return Err(raft_stopped(&cause));
    }
    let applied = node.machine.last_applied_index();
    let Some(leader_id) = node.leader_in_touch() else {
        return Err(ApiError::new(
            ErrorCode::NoLeader,
            "This node is not in touch with a leader (election in progress, partitioned, or \
             not a member any more).",
        ));
    };
    // A follower must also keep up with the leader; the leader is never behind itself.
    if leader_id != node.id {
        if node.ops.health.leader_unheard() {
            return Err(ApiError::new(
                ErrorCode::NodeBehind,
                format!(
                    "This node has just started (it has applied the log up to index {applied}) \
                     and has not yet heard from the leader how far the log is; it is ready once \
                     it has, and has applied as much."
                ),
            ));
        }
        if let Some(behind) = node.ops.health.behind_leader(applied) {
            return Err(behind_leader(applied, behind));
        }
    }
    Ok(ReadyStatus {
        status: "ready".into(),
        leader_id,
        clock_ms: Some(node.clock.wall_ms()),
        monotonic_ms: Some(crate::node::monotonic_ms()),
        applied_index: Some(applied),
        version: Some(crate::build_info::build().to_string()),
    })
}

/// `/readyz` of a follower that applies the log too far behind the leader.
fn behind_leader(applied: u64, behind: Behind) -> ApiError {
    if applied >= behind.leader_applied {
        // Caught up, but behind a moment ago: held back a while, so it does not flap.
        return ApiError::new(
            ErrorCode::NodeBehind,
            format!(
                "This node has caught up (it has applied the log up to index {applied}), but it \
                 was behind the leader moments ago; it reports ready once it has kept up for a \
                 few seconds, so a node that keeps falling behind does not flap."
            ),
        );
    }
    ApiError::new(
        ErrorCode::NodeBehind,
        format!(
            "This node has applied the log up to index {applied}, and the leader had applied {} \
             already {:.1} s ago: it does not keep up (a slow disk, an overloaded node, or \
             appends from the leader that do not arrive: see its log), and reads here wait for \
             it.",
            behind.leader_applied,
            behind.ago.as_secs_f64()
        ),
    )
}

pub async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    node.refresh_gauges();
    node.metrics.ready.set(i64::from(readiness(&node).is_ok()));
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

pub async fn get_faults(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> Result<Json<FaultSnapshot>, ApiError> {
    faults_enabled(&node)?;
    check_admin_if_configured(&node, &headers)?;
    Ok(Json(node.faults().snapshot()))
}

/// `PUT /v1/admin/faults`: replaces this node's fault rules (per peer id) and clock offset.
/// Needs the admin credential when the node has one: a partition or a clock offset is an
/// outage an anonymous caller must not be able to cause.
pub async fn put_faults(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<FaultSnapshot>, ApiError> {
    faults_enabled(&node)?;
    check_admin_if_configured(&node, &headers)?;
    let snapshot: FaultSnapshot = parse_json(&body)?;
    node.faults().replace(snapshot);
    node.record_operator_action(
        "set_faults",
        "fault-injection",
        None,
        None,
        "done",
        Some(format!(
            "{} peer rules",
            node.faults().snapshot().peers.len()
        )),
    );
    Ok(Json(node.faults().snapshot()))
}

#[cfg(test)]
mod tests {
    use super::is_host_port;

    #[test]
    fn member_addresses_must_be_host_and_port() {
        for good in [
            "10.0.4.10:7001",
            "node4.example:7101",
            "[::1]:7001",
            "localhost:1",
        ] {
            assert!(is_host_port(good), "{good}");
        }
        for bad in [
            "nonsense",
            "",
            ":7001",
            "host:",
            "host:0",
            "host:99999",
            "a b:1",
            "[zz]:1",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
    }
}
