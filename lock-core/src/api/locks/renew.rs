//! `POST /v1/locks/{resource}/renew`: only the current lease id extends the lease.

use std::sync::Arc;

use super::{lease_facts, required_lease, unexpected, Audit, Scope};
use crate::api::{parse_json, ApiError};
use crate::machine::{Command, Response};
use crate::node::Node;
use crate::wire::{ErrorCode, LeaseRequest, RenewResponse};

pub(super) async fn renew(
    node: &Arc<Node>,
    scope: &Scope,
    resource: &str,
    body: &[u8],
) -> Result<RenewResponse, ApiError> {
    let req: LeaseRequest = parse_json(body)?;
    let lease_id = required_lease(req.lease_id)?;
    let cmd = Command::Renew {
        resource: resource.to_string(),
        lease_id,
    };
    let (holder, _) = lease_facts(node, resource, &lease_id).await;
    let audit = |token| Audit {
        op: "renew",
        resource,
        lease: Some(&lease_id),
        token,
        caller: scope.audit_name.clone(),
        holder: holder.clone(),
    };
    let answer = node.propose(scope.wrap(cmd)).await;
    match answer.map_err(|e| audit(None).failed(node, e.into(), None))? {
        Response::Renewed(g) => {
            audit(Some(g.fencing_token)).record(node, "renewed", None);
            Ok(RenewResponse {
                lease_id: g.lease_id,
                fencing_token: g.fencing_token,
                ttl_ms: g.ttl_ms,
                expires_at_ms: g.expires_at_ms,
            })
        }
        Response::LeaseLost => {
            node.metrics.renew_failures.inc();
            audit(None).record(node, "lease_lost", None);
            Err(ApiError::new(
                ErrorCode::LeaseLost,
                "This lease is no longer held (expired, released or replaced); stop work and \
                 acquire again.",
            ))
        }
        other => Err(unexpected(other)),
    }
}
