//! `POST /v1/locks/{resource}/acquire`: try once, or wait in the resource's FIFO queue
//! (a long poll) until granted, timed out or cancelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{lock_held, unexpected, Audit, Scope};
use crate::api::{parse_json, ApiError};
use crate::machine::{Acquire, Command, Grant, Response, TenantLimitHit, WaiterGone};
use crate::node::{Node, WaitOutcome, WaitTicket};
use crate::wire::{AcquireRequest, AcquireResponse, ErrorCode};

/// The outcome metrics and the audit log give a wait that ended without the lock (it answers
/// `lock_held`, as a refusal at once does).
const WAIT_TIMEOUT: &str = "wait_timeout";

/// How long a long-poll waits beyond its own timeout for the leader's sweeper to remove it.
const WAIT_SLACK: Duration = Duration::from_secs(2);

pub(super) async fn acquire(
    node: &Arc<Node>,
    scope: &Scope,
    resource: &str,
    body: &[u8],
) -> Result<AcquireResponse, ApiError> {
    let started = Instant::now();
    let req: AcquireRequest = parse_json(body)?;
    let holder = req.holder.clone();
    let audit = |lease, token| Audit {
        op: "acquire",
        resource,
        lease,
        token,
        caller: scope.audit_name.clone(),
        holder: holder.clone(),
    };
    let mut cmd = node
        .acquire_command(resource, req)
        .map_err(ApiError::invalid)?;
    cmd.tenant_limits = scope.limits;
    let waits = cmd.wait_timeout_ms > 0;
    if waits {
        room_to_wait(node)?;
    }
    // Subscribe before proposing so a hand-off applied before we hear back is not missed.
    let mut ticket = waits.then(|| node.waits.subscribe(resource, &cmd.request_id));
    // Armed before proposing: a caller that hangs up while the acquire is being committed
    // must not leave a waiter behind for the whole wait timeout.
    let mut guard = CancelOnDrop::arm(node, &cmd, waits);
    let response = match node
        .propose(scope.wrap(Command::Acquire(cmd.clone())))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            // The caller hears 503 and retries with the same request_id; the waiter (if the
            // acquire commits after all) stays for that retry, bounded by its wait timeout.
            guard.disarm();
            return Err(audit(None, None).failed(node, e.into(), Some(started)));
        }
    };
    if !matches!(response, Response::Queued { .. }) {
        guard.disarm();
    }
    let outcome = match response {
        Response::Granted(g) => Ok(g),
        Response::Held { retry_after_ms } => Err(lock_held(
            retry_after_ms,
            "The lock is held by another lease; retry after retry_after_ms or wait with \
             wait_timeout_ms.",
        )),
        Response::Revoking { retry_after_ms } => Err(ApiError::new(
            ErrorCode::LockRevoking,
            "The previous holder released the lock; the fencing proxies are confirming they \
             stopped its writes (usually milliseconds, at most retry_after_ms). Retry, or \
             wait with wait_timeout_ms to be handed the lock as soon as they have.",
        )
        .with_retry_after(retry_after_ms)),
        Response::TenantLimit(hit) => Err(tenant_limit(node, hit)),
        Response::TooManyWaiters => Err(ApiError::new(
            ErrorCode::TooManyWaiters,
            "The wait queue for this resource (or the node) is full; retry later.",
        )),
        Response::Queued { .. } => match ticket.as_mut() {
            Some(t) => wait_in_queue(node, &cmd, t, guard).await,
            // A try-once retry (wait_timeout_ms 0) of a request_id that is still waiting in
            // the queue: the original wait goes on untouched; this call just reports it.
            None => {
                let retry_after_ms = node.machine.read(|m| {
                    let now = m.now_ms();
                    m.view(resource, now)
                        .expires_at_ms
                        .map_or(0, |e| e.saturating_sub(now))
                });
                Err(lock_held(
                    retry_after_ms,
                    "This request_id is already waiting in the queue; retry it with \
                     wait_timeout_ms to wait for its outcome, or cancel it.",
                ))
            }
        },
        other => Err(unexpected(other)),
    };
    match &outcome {
        Ok(g) => {
            audit(Some(&g.lease_id), Some(g.fencing_token)).record(node, "granted", Some(started))
        }
        Err(e) => audit(None, None).record(node, e.outcome(), Some(started)),
    }
    outcome.map(|g| AcquireResponse {
        resource: scope.shown(&g.resource),
        lease_id: g.lease_id,
        fencing_token: g.fencing_token,
        ttl_ms: g.ttl_ms,
        expires_at_ms: g.expires_at_ms,
    })
}

/// Refuses a wait when this node's long polls already hold three quarters of its API
/// connections: each holds a connection for as long as it waits, and the rest are kept for
/// renewals, releases, reads and health checks, which would otherwise queue behind the waits
/// in the listen backlog.
fn room_to_wait(node: &Node) -> Result<(), ApiError> {
    let connections = node.config.limits.max_connections;
    let most = (connections - connections / 4).max(1);
    let open = node.waits.open();
    if open < most {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::TooManyWaiters,
        format!(
            "This node holds {open} waiting acquires, as many as its {connections} connections \
             leave room for (a quarter are kept for other calls); wait on another node, retry \
             later, or try once (wait_timeout_ms 0)."
        ),
    ))
}

/// An acquire beyond the tenant's bounds: counted, and a 429 with its own code.
fn tenant_limit(node: &Node, hit: TenantLimitHit) -> ApiError {
    let (label, code, message) = match hit {
        TenantLimitHit::Leases => (
            "leases",
            ErrorCode::TenantLeaseLimit,
            "Your tenant holds as many leases as its limit allows; release one or retry later.",
        ),
        TenantLimitHit::Waiters => (
            "waiters",
            ErrorCode::TenantWaiterLimit,
            "Your tenant has as many waiting acquires as its limit allows; retry later or \
             try once (wait_timeout_ms 0).",
        ),
    };
    node.metrics
        .tenant_limited
        .with_label_values(&[label])
        .inc();
    ApiError::new(code, message)
}

/// Long-polls a queued acquire. If the caller goes away (the future is dropped), the guard
/// proposes a cancel so the queue does not carry a dead waiter.
async fn wait_in_queue(
    node: &Arc<Node>,
    cmd: &Acquire,
    ticket: &mut WaitTicket,
    mut guard: CancelOnDrop,
) -> Result<Grant, ApiError> {
    let limit = Duration::from_millis(cmd.wait_timeout_ms) + WAIT_SLACK;
    let outcome = tokio::select! {
        outcome = tokio::time::timeout(limit, ticket.outcome()) => outcome,
        () = node.stopping() => {
            // The wait stays queued (until its own deadline): the caller's retry with the same
            // request_id, on another node, finds it in its place.
            guard.disarm();
            return Err(ApiError::new(
                ErrorCode::NodeStopped,
                "This node is shutting down. Your wait keeps its place in the queue until \
                 wait_timeout_ms: retry with the same request_id on another node.",
            ));
        }
        () = node.cut_off() => {
            // The leader may hand the lock to this wait while we cannot hear of it: the
            // caller's retry on a node in touch with the leader collects the grant, or
            // finds the wait in its place.
            guard.disarm();
            return Err(ApiError::new(
                ErrorCode::NoQuorum,
                "This node lost touch with the leader. Your wait keeps its place in the queue \
                 until wait_timeout_ms: retry with the same request_id on another node.",
            ));
        }
    };
    let result = match outcome {
        Ok(Some(WaitOutcome::Granted(g))) => Ok(g),
        Ok(Some(WaitOutcome::Removed(WaiterGone::TimedOut))) => Err(lock_held(
            still_held_ms(node, &cmd.resource),
            "wait_timeout_ms passed before the lock became free; retry after retry_after_ms \
             (the same request_id is fine: the wait is over).",
        )
        .counted_as(WAIT_TIMEOUT)),
        Ok(Some(WaitOutcome::Removed(WaiterGone::Cancelled))) => Err(ApiError::new(
            ErrorCode::WaitCancelled,
            "The wait was cancelled: by a cancel call for this request_id, or because another \
             connection waiting with it closed (a caller that hangs up withdraws its wait). \
             Acquire again to wait anew.",
        )),
        // The sweeper did not remove us in time (e.g. no leader): withdraw ourselves.
        Ok(None) | Err(_) => {
            let cancel = Command::Cancel {
                resource: cmd.resource.clone(),
                request_id: cmd.request_id.clone(),
            };
            guard.disarm();
            abandon(node, cancel).await?;
            Err(lock_held(
                still_held_ms(node, &cmd.resource),
                "wait_timeout_ms passed before the lock became free.",
            )
            .counted_as(WAIT_TIMEOUT))
        }
    };
    guard.disarm();
    result
}

/// How long `resource`'s current lease has left by this node's state: a waiter that timed
/// out is told when to try again. A hint, read without a round to the leader.
fn still_held_ms(node: &Node, resource: &str) -> u64 {
    node.machine.read(|m| {
        let now = m.now_ms();
        m.view(resource, now)
            .expires_at_ms
            .map_or(0, |until| until.saturating_sub(now))
    })
}

/// Withdraws a queued acquire nobody will collect. If the lock was already handed to it, the
/// lease stays: only its lease id may end it, a retry with the same request_id must get that
/// live lease back, and its TTL bounds it. (Releasing it here once let a retry receive a dead
/// lease with a future expiry — found by the chaos harness.)
async fn abandon(node: &Node, cancel: Command) -> Result<(), ApiError> {
    node.propose(cancel).await?;
    Ok(())
}

/// Abandons a queued acquire when the handler future is dropped (the client went away).
struct CancelOnDrop {
    node: Option<Arc<Node>>,
    resource: String,
    request_id: String,
}

impl CancelOnDrop {
    fn arm(node: &Arc<Node>, cmd: &Acquire, armed: bool) -> Self {
        CancelOnDrop {
            node: armed.then(|| node.clone()),
            resource: cmd.resource.clone(),
            request_id: cmd.request_id.clone(),
        }
    }

    fn disarm(&mut self) {
        self.node = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(node) = self.node.take() else {
            return;
        };
        let cmd = Command::Cancel {
            resource: std::mem::take(&mut self.resource),
            request_id: std::mem::take(&mut self.request_id),
        };
        tokio::spawn(async move {
            if let Err(e) = abandon(&node, cmd).await {
                tracing::warn!(error = %e.body.message, "cancel of an abandoned wait failed; its deadline will remove it");
            }
        });
    }
}
