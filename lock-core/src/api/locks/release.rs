//! `POST /v1/locks/{resource}/release`: idempotent; a stale lease id releases nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{lease_facts, required_lease, unexpected, Audit, Scope};
use crate::api::{parse_json, ApiError};
use crate::machine::{Command, Response};
use crate::node::Node;
use crate::wire::{LeaseRequest, ReleaseResponse};

/// The longest a release waits for the fencing proxies to confirm; past it, the answer goes
/// out. A proxy's grant is never longer (its config is checked against this bound), so by
/// then a proxy that could not confirm has stopped forwarding the token on its own.
const MAX_REVOKE_WAIT: Duration = Duration::from_secs(5);

/// Waits until no fencing proxy forwards the released token any more: every proxy that held a
/// grant confirmed, or the grants ran out. So once the caller hears `released: true`, a write
/// with the released token is refused by every proxy, and the next holder can be granted.
///
/// `index` is where the release committed ([`Committed`](crate::node::Committed)).
pub(crate) async fn wait_revoked(node: &Node, resource: &str, index: u64) {
    let mut completions = node.revocations.completions();
    let started = Instant::now();
    // A follower may not have applied the release yet; its state must include it. The
    // leader said at which index it does (an earlier version did not: then ask it). If this
    // node cannot catch up (no quorum), waiting out the longest grant keeps the promise.
    if node.current_leader() != Some(node.id) {
        let caught_up = if index > 0 {
            node.wait_applied(index, MAX_REVOKE_WAIT).await
        } else {
            node.read_barrier().await
        };
        if caught_up.is_err() {
            tokio::time::sleep(MAX_REVOKE_WAIT.saturating_sub(started.elapsed())).await;
            return;
        }
    }
    loop {
        let left = node.machine.read(|m| {
            m.revoking_until(resource)
                .map(|until| until.saturating_sub(m.now_ms()))
        });
        let Some(left_ms) = left else {
            return;
        };
        let wait =
            Duration::from_millis(left_ms).min(MAX_REVOKE_WAIT.saturating_sub(started.elapsed()));
        if wait.is_zero() {
            return;
        }
        // Log time only moves with commits; the sweeper's tick ends the grants at the latest.
        let _ = tokio::time::timeout(wait, completions.changed()).await;
        if started.elapsed() >= MAX_REVOKE_WAIT {
            return;
        }
    }
}

pub(super) async fn release(
    node: &Arc<Node>,
    scope: &Scope,
    resource: &str,
    body: &[u8],
) -> Result<ReleaseResponse, ApiError> {
    let req: LeaseRequest = parse_json(body)?;
    let lease_id = required_lease(req.lease_id)?;
    let cmd = Command::Release {
        resource: resource.to_string(),
        lease_id,
    };
    // Read before the release: afterwards the lease (and its holder's name) is gone.
    let (holder, token) = lease_facts(node, resource, &lease_id).await;
    let audit = |token| Audit {
        op: "release",
        resource,
        lease: Some(&lease_id),
        token,
        caller: scope.audit_name.clone(),
        holder: holder.clone(),
    };
    let committed = node
        .propose_committed(scope.wrap(cmd))
        .await
        .map_err(|e| audit(None).failed(node, e.into(), None))?;
    match committed.response {
        Response::Released(released) => {
            audit(token.filter(|_| released)).record(
                node,
                if released { "released" } else { "not_held" },
                None,
            );
            if released {
                wait_revoked(node, resource, committed.index).await;
            }
            Ok(ReleaseResponse { released })
        }
        other => Err(unexpected(other)),
    }
}
