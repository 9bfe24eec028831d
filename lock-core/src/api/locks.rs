//! Lock calls: acquire (with long-poll waiting), renew, release, cancel, get, list.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_json, ApiError};
use crate::machine::{Acquire, Command, Grant, LeaseId, Response, WaiterGone};
use crate::node::{Node, WaitOutcome};

/// Longest resource name, in bytes (SPEC §4).
pub const MAX_RESOURCE_LEN: usize = 256;
/// Longest `request_id` and `holder`.
pub const MAX_ID_LEN: usize = 128;
/// How long a long-poll waits beyond its own timeout for the leader's sweeper to remove it.
const WAIT_SLACK: Duration = Duration::from_secs(2);

/// Checks a resource name: 1–256 bytes of `[A-Za-z0-9._:/-]`.
pub fn validate_resource(resource: &str) -> Result<(), ApiError> {
    let ok_char = |b: u8| b.is_ascii_alphanumeric() || b"._:/-".contains(&b);
    if resource.is_empty() || resource.len() > MAX_RESOURCE_LEN {
        return Err(ApiError::invalid(format!(
            "Resource names are 1–{MAX_RESOURCE_LEN} bytes; got {}.",
            resource.len()
        )));
    }
    if !resource.bytes().all(ok_char) {
        return Err(ApiError::invalid(
            "Resource names may only contain letters, digits and . _ : / -",
        ));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    request_id: Option<String>,
    holder: Option<String>,
    ttl_ms: Option<u64>,
    wait_timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseBody {
    lease_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    request_id: Option<String>,
}

/// `POST /v1/locks/{resource}/{action}`; the resource may itself contain `/`.
pub async fn post(
    State(node): State<Arc<Node>>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let path = path_param(path)?;
    // Axum's own rejections (e.g. 413 for an oversized body) are plain text; SPEC §4 wants
    // every error as {error, message}.
    let body = body.map_err(|e| {
        let code = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "payload_too_large"
        } else {
            "invalid_request"
        };
        ApiError::new(e.status(), code, e.body_text())
    })?;
    let Some((resource, action)) = path.rsplit_once('/') else {
        return Err(ApiError::not_found(
            "Use POST /v1/locks/{resource}/acquire|renew|release|cancel.",
        ));
    };
    let op = match action {
        "acquire" | "renew" | "release" | "cancel" => action,
        _ => {
            return Err(ApiError::not_found(format!(
                "Unknown lock action '{action}'; use acquire, renew, release or cancel."
            )))
        }
    };
    let started = Instant::now();
    let result = match op {
        "acquire" => acquire(&node, resource, &body).await,
        "renew" => renew(&node, resource, &body).await,
        "release" => release(&node, resource, &body).await,
        _ => cancel(&node, resource, &body).await,
    };
    record(&node, op, started, &result);
    result.map(Json)
}

/// The `{*path}` part of the URL; a path that does not decode (e.g. `%FF`) is a JSON 400.
fn path_param(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(p)| p)
        .map_err(|e| ApiError::invalid(format!("Bad resource in the URL: {}.", e.body_text())))
}

fn record(node: &Node, op: &str, started: Instant, result: &Result<Value, ApiError>) {
    let outcome = match result {
        Ok(_) => "success",
        Err(e) => e.code,
    };
    node.metrics
        .op_seconds
        .with_label_values(&[op])
        .observe(started.elapsed().as_secs_f64());
    node.metrics
        .op_outcomes
        .with_label_values(&[op, outcome])
        .inc();
}

fn audit(op: &str, resource: &str, lease: Option<&LeaseId>, token: Option<u64>, outcome: &str) {
    // A digest, not the lease id: the id is a bearer capability and logs are widely readable.
    let digest = lease.map(|l| format!("{:016x}", (l.0 >> 64) as u64 ^ l.0 as u64));
    tracing::info!(
        target: "fencegate::audit",
        op, resource, lease = digest.as_deref(), token, outcome
    );
}

fn grant_json(g: &Grant) -> Value {
    json!({
        "resource": g.resource,
        "lease_id": g.lease_id.to_string(),
        "fencing_token": g.fencing_token,
        "ttl_ms": g.ttl_ms,
        "expires_at_ms": g.expires_at_ms,
    })
}

fn lock_held(retry_after_ms: u64, message: &str) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "lock_held", message).with("retry_after_ms", retry_after_ms)
}

fn required_id(value: Option<String>, field: &str) -> Result<String, ApiError> {
    let v = value.ok_or_else(|| ApiError::invalid(format!("Field '{field}' is required.")))?;
    if v.is_empty() || v.chars().count() > MAX_ID_LEN {
        return Err(ApiError::invalid(format!(
            "Field '{field}' must be 1–{MAX_ID_LEN} characters."
        )));
    }
    Ok(v)
}

fn lease_id_field(value: Option<String>) -> Result<LeaseId, ApiError> {
    let v = value.ok_or_else(|| ApiError::invalid("Field 'lease_id' is required."))?;
    v.parse().map_err(|_| {
        ApiError::invalid("Field 'lease_id' must be the 32 hex digits acquire returned.")
    })
}

async fn acquire(node: &Arc<Node>, resource: &str, body: &[u8]) -> Result<Value, ApiError> {
    validate_resource(resource)?;
    let b: AcquireBody = parse_json(body)?;
    let request_id = required_id(b.request_id, "request_id")?;
    if b.holder
        .as_ref()
        .is_some_and(|h| h.chars().count() > MAX_ID_LEN)
    {
        return Err(ApiError::invalid(format!(
            "Field 'holder' must be at most {MAX_ID_LEN} characters."
        )));
    }
    let p = &node.config.policy;
    let ttl_ms = b.ttl_ms.unwrap_or(p.default_ttl_ms);
    if !(p.min_ttl_ms..=p.max_ttl_ms).contains(&ttl_ms) {
        return Err(ApiError::invalid(format!(
            "ttl_ms must be between {} and {} (policy).",
            p.min_ttl_ms, p.max_ttl_ms
        )));
    }
    let wait_timeout_ms = b.wait_timeout_ms.unwrap_or(0);
    if wait_timeout_ms > p.max_wait_timeout_ms {
        return Err(ApiError::invalid(format!(
            "wait_timeout_ms must be at most {} (policy).",
            p.max_wait_timeout_ms
        )));
    }
    let cmd = Acquire {
        resource: resource.to_string(),
        request_id: request_id.clone(),
        holder: b.holder,
        ttl_ms,
        wait_timeout_ms,
        lease_id: LeaseId(rand::random()),
        retain_ms: p.retry_window_ms,
        max_waiters: p.max_waiters_per_resource,
        max_total_waiters: p.max_total_waiters,
    };
    // Subscribe before proposing so a hand-off applied before we hear back is not missed.
    let mut ticket = (wait_timeout_ms > 0).then(|| node.waits.subscribe(resource, &request_id));
    // Armed before proposing: a caller that hangs up while the acquire is being committed
    // must not leave a waiter behind for the whole wait timeout.
    let mut guard = CancelOnDrop::arm(node, &cmd, wait_timeout_ms > 0);
    let response = match node.propose(Command::Acquire(cmd.clone())).await {
        Ok(r) => r,
        Err(e) => {
            // The caller hears 503 and retries with the same request_id; the waiter (if the
            // acquire commits after all) stays for that retry, bounded by its wait timeout.
            guard.disarm();
            return Err(e.into());
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
        Response::TooManyWaiters => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_waiters",
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
        Ok(g) => audit(
            "acquire",
            resource,
            Some(&g.lease_id),
            Some(g.fencing_token),
            "granted",
        ),
        Err(e) => audit("acquire", resource, None, None, e.code),
    }
    outcome.map(|g| grant_json(&g))
}

/// Long-polls a queued acquire. If the caller goes away (the future is dropped), the guard
/// proposes a cancel so the queue does not carry a dead waiter.
async fn wait_in_queue(
    node: &Arc<Node>,
    cmd: &Acquire,
    ticket: &mut crate::node::WaitTicket,
    mut guard: CancelOnDrop,
) -> Result<Grant, ApiError> {
    let limit = Duration::from_millis(cmd.wait_timeout_ms) + WAIT_SLACK;
    let result = match tokio::time::timeout(limit, ticket.outcome()).await {
        Ok(Some(WaitOutcome::Granted(g))) => Ok(g),
        Ok(Some(WaitOutcome::Removed(WaiterGone::TimedOut))) => Err(lock_held(
            0,
            "wait_timeout_ms passed before the lock became free; retry with a new request_id.",
        )),
        Ok(Some(WaitOutcome::Removed(WaiterGone::Cancelled))) => {
            Err(lock_held(0, "The wait was cancelled."))
        }
        // The sweeper did not remove us in time (e.g. no leader): cancel ourselves, and if
        // the cancel finds we were granted meanwhile it releases that lease.
        Ok(None) | Err(_) => {
            let cancel = Command::Cancel {
                resource: cmd.resource.clone(),
                request_id: cmd.request_id.clone(),
            };
            guard.disarm();
            abandon(node, cancel).await?;
            Err(lock_held(
                0,
                "wait_timeout_ms passed before the lock became free.",
            ))
        }
    };
    guard.disarm();
    result
}

/// Withdraws a queued acquire nobody will collect. If the lock was already handed to it, the
/// lease stays: only its lease id may end it (SPEC §3.4), a retry with the same request_id must
/// get that live lease back (§3.6), and its TTL bounds it (§4). (Releasing it here once let a
/// retry receive a dead lease with a future expiry — found by the chaos harness.)
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
                tracing::warn!(error = %e.message, "cancel of an abandoned wait failed; its deadline will remove it");
            }
        });
    }
}

async fn renew(node: &Arc<Node>, resource: &str, body: &[u8]) -> Result<Value, ApiError> {
    validate_resource(resource)?;
    let b: LeaseBody = parse_json(body)?;
    let lease_id = lease_id_field(b.lease_id)?;
    let cmd = Command::Renew {
        resource: resource.to_string(),
        lease_id,
    };
    match node.propose(cmd).await? {
        Response::Renewed(g) => {
            audit(
                "renew",
                resource,
                Some(&lease_id),
                Some(g.fencing_token),
                "renewed",
            );
            Ok(json!({
                "lease_id": g.lease_id.to_string(),
                "fencing_token": g.fencing_token,
                "ttl_ms": g.ttl_ms,
                "expires_at_ms": g.expires_at_ms,
            }))
        }
        Response::LeaseLost => {
            node.metrics.renew_failures.inc();
            audit("renew", resource, Some(&lease_id), None, "lease_lost");
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "lease_lost",
                "This lease is no longer held (expired, released or replaced); stop work and \
                 acquire again.",
            ))
        }
        other => Err(unexpected(other)),
    }
}

async fn release(node: &Arc<Node>, resource: &str, body: &[u8]) -> Result<Value, ApiError> {
    validate_resource(resource)?;
    let b: LeaseBody = parse_json(body)?;
    let lease_id = lease_id_field(b.lease_id)?;
    let cmd = Command::Release {
        resource: resource.to_string(),
        lease_id,
    };
    match node.propose(cmd).await? {
        Response::Released(released) => {
            audit(
                "release",
                resource,
                Some(&lease_id),
                None,
                if released { "released" } else { "not_held" },
            );
            Ok(json!({ "released": released }))
        }
        other => Err(unexpected(other)),
    }
}

async fn cancel(node: &Arc<Node>, resource: &str, body: &[u8]) -> Result<Value, ApiError> {
    validate_resource(resource)?;
    let b: CancelBody = parse_json(body)?;
    let request_id = required_id(b.request_id, "request_id")?;
    let cmd = Command::Cancel {
        resource: resource.to_string(),
        request_id,
    };
    match node.propose(cmd).await? {
        Response::Cancelled(cancelled) => Ok(json!({ "cancelled": cancelled })),
        other => Err(unexpected(other)),
    }
}

fn unexpected(resp: Response) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("Unexpected state machine response {resp:?}; this is a bug, please report it."),
    )
}

/// `GET /v1/locks/{resource}`: linearizable; never shows the lease id.
pub async fn get(
    State(node): State<Arc<Node>>,
    resource: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let resource = path_param(resource)?;
    let started = Instant::now();
    let result = async {
        validate_resource(&resource)?;
        node.read_barrier().await?;
        let view = node.machine.read(|m| m.view(&resource, m.now_ms()));
        Ok(serde_json::to_value(view).unwrap_or_default())
    }
    .await;
    record(&node, "get", started, &result);
    result.map(Json)
}

#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
}

/// Most entries one list call returns.
const MAX_LIST: usize = 1_000;

/// `GET /v1/locks?prefix=&limit=`: held or waited-on resources, linearizable.
pub async fn list(
    State(node): State<Arc<Node>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(format!("Bad query: {e}.")))?;
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_LIST {
        return Err(ApiError::invalid(format!("limit must be 1–{MAX_LIST}.")));
    }
    node.read_barrier().await?;
    let locks = node.machine.read(|m| m.list(&q.prefix, limit, m.now_ms()));
    Ok(Json(json!({ "locks": locks })))
}
