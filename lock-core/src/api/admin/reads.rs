//! What the admin UI reads: the cluster overview with member health, the locks of every
//! tenant, one resource in detail, hot resources, the metrics series and the audit tail.
//! Open like the other reads.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;

use crate::api::cluster::{cluster_status, role};
use crate::api::locks::{list_page, ListQuery, Names};
use crate::api::{read_barrier, ApiError};
use crate::node::ops::AuditFilter;
use crate::node::Node;
use crate::wire::{
    validate_stored_name, AuditTail, ClusterOverview, GrantView, HotEntry, HotResources,
    LeaseDetail, LockList, MetricsSeries, PeerHealth, ResourceDetail, Role, WaiterView,
};

/// Most entries a hot list or an audit tail returns.
const MAX_LIMIT: usize = 1_000;

fn bounded(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(default);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::invalid(format!("limit must be 1–{MAX_LIMIT}.")));
    }
    Ok(limit)
}

fn query<T>(q: Result<Query<T>, QueryRejection>, takes: &str) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_query(&e, takes))
}

/// `GET /v1/admin/overview`.
pub async fn overview(State(node): State<Arc<Node>>) -> Json<ClusterOverview> {
    let status = cluster_status(&node);
    let m = node.raft.metrics().borrow().clone();
    let last_log = m.last_log_index.unwrap_or(0);
    let voters: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
    let peers = m
        .membership_config
        .membership()
        .nodes()
        .map(|(id, n)| {
            // A peer the leader has not matched yet (none since it was elected, e.g. one that
            // is down) has an unknown position, not position 0 and the whole log to go.
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(id))
                .and_then(|l| l.map(|l| l.index));
            let mut peer = PeerHealth {
                id: *id,
                addr: n.api_addr.clone(),
                voter: voters.contains(id),
                up: true,
                leader_id: m.current_leader,
                last_seen_ms: Some(node.wall_ms()),
                error: None,
                role: None,
                matched_index: matched,
                lag: matched.map(|i| last_log.saturating_sub(i)),
                clock_offset_ms: None,
                clock_rate: None,
                version: None,
            };
            if *id == node.id {
                peer.version = Some(crate::build_info::build().to_string());
                peer.role = Some(role(m.state));
                peer.leader_id = node.leader_in_touch();
                peer.up = peer.leader_id.is_some();
                if !peer.up {
                    peer.error = Some(NOT_IN_TOUCH.into());
                }
            } else {
                let probe = node.ops.health.get(*id).unwrap_or_default();
                // Up means serving: answering, and in touch with a leader.
                peer.up = probe.up && probe.ready;
                peer.leader_id = probe.leader_id;
                peer.last_seen_ms = probe.last_seen_ms;
                peer.error = match (&probe.error, probe.up) {
                    (Some(e), _) => Some(e.clone()),
                    (None, true) if !probe.ready => Some(NOT_IN_TOUCH.into()),
                    (None, true) => None,
                    (None, false) => Some("not probed yet".into()),
                };
                peer.role = peer_role(*id, voters.contains(id), &probe);
                peer.clock_offset_ms = probe.clock_offset_ms;
                peer.clock_rate = probe.clock_rate;
                peer.version = probe.version;
            }
            peer
        })
        .collect();
    Json(ClusterOverview {
        status,
        peers,
        elections: node.ops.elections(),
        // With keys on, any admin key may act, bootstrap token or not.
        actions_enabled: node.config.admin_token.is_some() || node.auth_on(),
    })
}

const NOT_IN_TOUCH: &str =
    "answers, but is not in touch with a leader (cut off, removed or electing)";

/// Another member's role, from its own answer to the probe: the leader it names (itself, if
/// it leads). Unknown while it answers without one.
fn peer_role(id: u64, voter: bool, probe: &crate::node::ops::Probe) -> Option<Role> {
    if !probe.up || !probe.ready {
        return None;
    }
    match probe.leader_id? {
        l if l == id => Some(Role::Leader),
        _ if voter => Some(Role::Follower),
        _ => Some(Role::Learner),
    }
}

/// `GET /v1/admin/resources/{resource}`: linearizable, like `GET /v1/locks/{resource}`.
pub async fn resource(
    State(node): State<Arc<Node>>,
    resource: Result<Path<String>, PathRejection>,
) -> Result<Json<ResourceDetail>, ApiError> {
    let Path(resource) = resource
        .map_err(|e| ApiError::invalid(format!("Bad resource in the URL: {}.", e.body_text())))?;
    validate_stored_name(&resource).map_err(ApiError::invalid)?;
    read_barrier(&node).await?;
    let events = node.ops.hot.events(&resource);
    let detail = node.machine.read(|m| {
        let now_ms = m.now_ms();
        let view = m.view(&resource, now_ms);
        let rec = m.resource(&resource);
        ResourceDetail {
            view,
            now_ms,
            lease: rec.and_then(|r| r.lease.as_ref()).map(|l| LeaseDetail {
                holder: l.holder.clone(),
                fencing_token: l.fencing_token,
                lease_digest: l.lease_id.digest(),
                ttl_ms: l.ttl_ms,
                granted_at_ms: l.granted_at_ms,
                expires_at_ms: l.expires_at_ms,
            }),
            queue: rec.map_or_else(Vec::new, |r| {
                r.waiters
                    .iter()
                    .enumerate()
                    .map(|(i, w)| WaiterView {
                        position: i as u32 + 1,
                        holder: w.holder.clone(),
                        ttl_ms: w.ttl_ms,
                        deadline_ms: w.deadline_ms,
                    })
                    .collect()
            }),
            last_token: rec.map_or(0, |r| r.last_token),
            admitted: rec.map_or(0, |r| r.admitted),
            grants: rec.map_or_else(Vec::new, |r| {
                r.grants
                    .iter()
                    .filter(|g| g.until_ms > now_ms)
                    .map(|g| GrantView {
                        proxy: g.proxy,
                        fencing_token: g.fencing_token,
                        until_ms: g.until_ms,
                    })
                    .collect()
            }),
            reissue_at_ms: rec.and_then(|r| r.reissue_at_ms),
            events,
        }
    });
    Ok(Json(detail))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitQuery {
    limit: Option<usize>,
}

/// `GET /v1/admin/locks?prefix=&limit=&after=`: like `GET /v1/locks`, across every tenant.
/// Names, the prefix and the cursor are stored names (`tenant#name`; the default tenant's
/// names are bare), the names `GET /v1/admin/resources/{resource}` takes.
pub async fn locks(
    State(node): State<Arc<Node>>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<LockList>, ApiError> {
    let q = list_page(q, Names::Stored)?;
    read_barrier(&node).await?;
    let (locks, next_after, now_ms) = node.machine.read(|m| {
        let now_ms = m.now_ms();
        let (page, next) = m.list_after(&q.prefix, q.after.as_deref(), q.limit, now_ms);
        (page, next, now_ms)
    });
    Ok(Json(LockList {
        locks,
        next_after,
        now_ms,
    }))
}

/// `GET /v1/admin/hot?limit=`.
pub async fn hot(
    State(node): State<Arc<Node>>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<HotResources>, ApiError> {
    let limit = bounded(query(q, "limit (1–1000)")?.limit, 10)?;
    let [by_acquire_rate, by_wait_ms, by_fence_rejections] =
        node.ops.hot.top(node.wall_ms(), limit);
    let by_queue_depth = node
        .machine
        .read(|m| m.deepest_queues(limit))
        .into_iter()
        .map(|(resource, depth)| HotEntry {
            resource,
            value: f64::from(depth),
        })
        .collect();
    Ok(Json(HotResources {
        by_acquire_rate,
        by_wait_ms,
        by_queue_depth,
        by_fence_rejections,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    #[serde(default)]
    since: u64,
}

/// `GET /v1/admin/series?since=`: samples newer than `since` (ms since the Unix epoch).
pub async fn series(
    State(node): State<Arc<Node>>,
    q: Result<Query<SeriesQuery>, QueryRejection>,
) -> Result<Json<MetricsSeries>, ApiError> {
    let since = query(q, "since (ms since the Unix epoch)")?.since;
    Ok(Json(MetricsSeries {
        node_id: node.id,
        samples: node.ops.series.since(since),
        elections: node.ops.elections(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    resource: Option<String>,
    outcome: Option<String>,
    caller: Option<String>,
    holder: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/admin/audit?resource=&outcome=&caller=&holder=&limit=`: empty filters match
/// everything.
pub async fn audit(
    State(node): State<Arc<Node>>,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<AuditTail>, ApiError> {
    let q = query(q, "resource, outcome, caller, holder and limit (1–1000)")?;
    let limit = bounded(q.limit, 100)?;
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
    let filter = AuditFilter {
        resource: nonempty(q.resource),
        outcome: nonempty(q.outcome),
        caller: nonempty(q.caller),
        holder: nonempty(q.holder),
    };
    Ok(Json(AuditTail {
        entries: node.ops.audit.tail(&filter, limit),
    }))
}
