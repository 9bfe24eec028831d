//! The quota endpoints: `GET /v1/admin/quotas` lists every quota with the shares leased to
//! each proxy and each tenant's utilisation (open, like the other reads the admin UI polls);
//! `PUT /v1/admin/quotas/{name}` sets a quota at run time (admin credential, audited), as one
//! committed raft command, so every node and proxy sees the same definition.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;

use super::actions::authorize;
use crate::api::{parse_json, ApiError};
use crate::machine::{Command, LockMachine, QuotaPolicy, QuotaSpec, Response, MILLI};
use crate::node::{Committed, Node};
use crate::wire::{
    ErrorCode, QuotaDefinition, QuotaList, QuotaShareView, QuotaTenantView, QuotaView,
    SetQuotaRequest,
};

/// `GET /v1/admin/quotas`: this node's applied view (not a linearizable read: utilisation is
/// a moving figure anyway, and the page polls it).
pub async fn list(State(node): State<Arc<Node>>) -> Json<QuotaList> {
    Json(node.machine.read(quota_list))
}

/// `PUT /v1/admin/quotas/{name} {operator, rate_per_s, burst, lease_ms, policy, allowance}`.
pub async fn set(
    State(node): State<Arc<Node>>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<QuotaView>, ApiError> {
    let Path(name) = name
        .map_err(|e| ApiError::invalid(format!("Bad quota name in the URL: {}.", e.body_text())))?;
    let req: SetQuotaRequest = parse_json(&body)?;
    authorize(&node, &headers, "set_quota", &req.operator, None)?;
    let asked = name.clone();
    let spec = match spec_of(name, &req) {
        Ok(s) => s,
        Err(e) => {
            audit(&node, &req.operator, &asked, &req, e.code().as_str());
            return Err(e);
        }
    };
    let name = spec.name.clone();
    let index = match node.propose_committed(Command::QuotaSet(spec)).await {
        Ok(Committed {
            response: Response::QuotaDefined,
            index,
        }) => index,
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
            audit(&node, &req.operator, &name, &req, e.code().as_str());
            return Err(e);
        }
    };
    audit(&node, &req.operator, &name, &req, "done");
    // On a follower the change committed at the leader may not be applied here yet: the
    // answer shows this node's state, so it must include the change (the leader said at
    // which index it does; an earlier version did not: then ask it). Setting the same
    // definition again is harmless, so a caller that gets 503 here can simply retry.
    let caught_up = if index > 0 {
        node.wait_applied(index, APPLY_WAIT).await
    } else {
        node.read_barrier().await
    };
    caught_up.map_err(ApiError::from)?;
    let view = node.machine.read(|m| {
        quota_list(m)
            .quotas
            .into_iter()
            .find(|q| q.definition.name == name)
    });
    view.map(Json).ok_or_else(|| {
        ApiError::new(
            ErrorCode::Internal,
            "The quota was committed but is not in the applied state; this is a bug.",
        )
    })
}

/// The longest a follower waits to apply the change it forwarded before answering.
const APPLY_WAIT: Duration = Duration::from_secs(5);

fn audit(node: &Node, operator: &str, name: &str, req: &SetQuotaRequest, outcome: &str) {
    let name: String = name.chars().take(128).collect();
    let detail = format!(
        "quota={name:?} rate_per_s={} burst={} lease_ms={} policy={} allowance={}",
        req.rate_per_s,
        req.burst,
        req.lease_ms,
        req.policy.as_deref().unwrap_or("strict"),
        req.allowance.unwrap_or(0)
    );
    node.record_operator_action("set_quota", operator, None, None, outcome, Some(detail));
}

/// The definition asked for, checked like a config file's.
fn spec_of(name: String, req: &SetQuotaRequest) -> Result<QuotaSpec, ApiError> {
    let policy = QuotaPolicy::from_parts(req.policy.as_deref(), req.allowance)
        .map_err(|e| ApiError::invalid(format!("quota {name}: {e}.")))?;
    let spec = QuotaSpec {
        name,
        rate_per_s: req.rate_per_s,
        burst: req.burst,
        lease_ms: req.lease_ms,
        policy,
    };
    spec.validate()
        .map_err(|e| ApiError::invalid(format!("{e}.")))?;
    Ok(spec)
}

/// Every quota with the shares that count now, per proxy and tenant.
fn quota_list(m: &LockMachine) -> QuotaList {
    let ledger = m.quotas();
    let now = m.now_ms();
    let quotas = ledger
        .specs()
        .map(|spec| {
            // (tenant, proxy) -> (rate, burst, leases, latest end), in milli.
            let mut shares: BTreeMap<(&str, u64), (u64, u64, usize, u64)> = BTreeMap::new();
            for l in ledger.leases().filter(|l| {
                l.quota == spec.name && l.activates_at_ms <= now && now < l.expires_at_ms
            }) {
                let s = shares.entry((l.tenant.as_str(), l.proxy)).or_default();
                s.0 += l.rate_milli;
                s.1 += l.burst_milli;
                s.2 += 1;
                s.3 = s.3.max(l.expires_at_ms);
            }
            let demand = |tenant: &str, proxy: Option<u64>| -> u64 {
                ledger
                    .demand()
                    .filter(|d| d.quota == spec.name && d.tenant == tenant)
                    .filter(|d| proxy.is_none_or(|p| d.proxy == p))
                    .map(|d| d.demand_milli)
                    .sum()
            };
            let per_s = |milli: u64| milli as f64 / MILLI as f64;
            let mut tenants: Vec<&str> = shares.keys().map(|(t, _)| *t).collect();
            tenants.extend(
                ledger
                    .demand()
                    .filter(|d| d.quota == spec.name)
                    .map(|d| d.tenant.as_str()),
            );
            tenants.sort_unstable();
            tenants.dedup();
            let r = spec.rate_per_s.max(1) as f64;
            QuotaView {
                definition: definition(spec, ledger.is_pinned(&spec.name)),
                shares: shares
                    .iter()
                    .map(
                        |((tenant, proxy), (rate, burst, n, until))| QuotaShareView {
                            tenant: tenant.to_string(),
                            proxy: *proxy,
                            rate_per_s: per_s(*rate),
                            burst: per_s(*burst),
                            leases: *n,
                            expires_at_ms: *until,
                            demand_per_s: per_s(demand(tenant, Some(*proxy))),
                        },
                    )
                    .collect(),
                tenants: tenants
                    .iter()
                    .map(|t| {
                        let leased: u64 = shares
                            .iter()
                            .filter(|((tenant, _), _)| tenant == t)
                            .map(|(_, s)| s.0)
                            .sum();
                        QuotaTenantView {
                            tenant: t.to_string(),
                            leased_fraction: per_s(leased) / r,
                            demand_fraction: per_s(demand(t, None)) / r,
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    QuotaList {
        now_ms: now,
        rebalances: ledger.rebalances(),
        quotas,
    }
}

fn definition(spec: &QuotaSpec, pinned: bool) -> QuotaDefinition {
    let (policy, allowance) = match spec.policy {
        QuotaPolicy::Strict => ("strict", 0),
        QuotaPolicy::Emergency { allowance } => ("emergency", allowance),
    };
    QuotaDefinition {
        name: spec.name.clone(),
        rate_per_s: spec.rate_per_s,
        burst: spec.burst,
        lease_ms: spec.lease_ms,
        policy: policy.to_string(),
        allowance,
        set_at_run_time: pinned,
    }
}
