//! Lock calls, one file each: acquire (with long-poll waiting), renew, release, cancel, and
//! the reads (get, list).

mod acquire;
mod cancel;
mod read;
mod release;
mod renew;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::Json;
use serde::Serialize;

pub use read::{get, list};
pub(crate) use read::{list_page, ListQuery, Names};
pub(crate) use release::wait_revoked;

use super::auth::caller_of;
use super::ApiError;
use crate::machine::{Command, LeaseId, Response, TenantLimits};
use crate::node::ops::LockCallRecord;
use crate::node::{Caller, Node};
use crate::wire::{
    scoped_name, split_scoped, validate_resource, ErrorCode, DEFAULT_TENANT, LOCK_ACTIONS,
};

/// The caller's namespace for one lock call. Handlers work on stored names (`tenant#name`, or
/// the bare name in the default tenant) and show callers their own names.
pub(crate) struct Scope {
    tenant: String,
    /// The API key the call was made with, checked again when its command is applied.
    key_id: Option<String>,
    limits: Option<TenantLimits>,
}

impl Scope {
    /// With keys off (no caller) or the bootstrap credential: the default tenant, unbounded,
    /// exactly as before tenants existed.
    fn of(node: &Node, caller: Option<Caller>) -> Scope {
        match caller {
            Some(c) => Scope {
                limits: Some(node.config.tenants.limits()),
                tenant: c.tenant,
                key_id: c.key_id,
            },
            None => Scope {
                tenant: DEFAULT_TENANT.to_string(),
                key_id: None,
                limits: None,
            },
        }
    }

    fn stored(&self, name: &str) -> String {
        scoped_name(&self.tenant, name)
    }

    fn shown(&self, stored: &str) -> String {
        split_scoped(stored).1.to_string()
    }

    /// After a read barrier: whether the caller's key still exists in state at least as new as
    /// the leader's commit, so a read after a committed revocation is refused on every node
    /// (writes get the same guarantee from [`wrap`](Self::wrap)).
    fn still_valid(&self, node: &Node) -> Result<(), ApiError> {
        match &self.key_id {
            Some(id) if node.machine.read(|m| m.api_key(id).is_none()) => {
                Err(super::auth::refusal(crate::node::Denied::Invalid))
            }
            _ => Ok(()),
        }
    }

    /// The command as made with the caller's key: not applied if the key is revoked first.
    fn wrap(&self, cmd: Command) -> Command {
        match &self.key_id {
            Some(id) => Command::AsKey {
                key_id: id.clone(),
                cmd: Box::new(cmd),
            },
            None => cmd,
        }
    }
}

/// `POST /v1/locks/{resource}/{action}`; the resource may itself contain `/`.
pub async fn post(
    State(node): State<Arc<Node>>,
    caller: Option<axum::Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<HttpResponse, ApiError> {
    let path = path_param(path)?;
    // Axum's own rejections (e.g. 413 for an oversized body) are plain text; every error
    // must be the JSON error body.
    let body = body.map_err(|e| {
        let code = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ErrorCode::PayloadTooLarge
        } else {
            ErrorCode::InvalidRequest
        };
        ApiError::new(code, e.body_text()).with_status(e.status())
    })?;
    let Some((resource, action)) = path.rsplit_once('/') else {
        return Err(ApiError::not_found(
            "Use POST /v1/locks/{resource}/acquire|renew|release|cancel.",
        ));
    };
    if !LOCK_ACTIONS.contains(&action) {
        return Err(ApiError::not_found(format!(
            "Unknown lock action '{action}'; use acquire, renew, release or cancel."
        )));
    }
    let started = Instant::now();
    let scope = Scope::of(&node, caller_of(caller));
    let result = async {
        validate_resource(resource).map_err(ApiError::invalid)?;
        let resource = &scope.stored(resource);
        match action {
            "acquire" => json(acquire::acquire(&node, &scope, resource, &body).await),
            "renew" => json(renew::renew(&node, &scope, resource, &body).await),
            "release" => json(release::release(&node, &scope, resource, &body).await),
            _ => json(cancel::cancel(&node, &scope, resource, &body).await),
        }
    }
    .await;
    record(&node, action, started, result.as_ref().err());
    result
}

fn json<T: Serialize>(result: Result<T, ApiError>) -> Result<HttpResponse, ApiError> {
    result.map(|body| Json(body).into_response())
}

/// The `{*path}` part of the URL; a path that does not decode (e.g. `%FF`) is a JSON 400.
fn path_param(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(p)| p)
        .map_err(|e| ApiError::invalid(format!("Bad resource in the URL: {}.", e.body_text())))
}

/// Latency and outcome metrics of one call.
fn record(node: &Node, op: &str, started: Instant, error: Option<&ApiError>) {
    let outcome = error.map_or("success", |e| e.code().as_str());
    node.metrics
        .op_seconds
        .with_label_values(&[op])
        .observe(started.elapsed().as_secs_f64());
    node.metrics
        .op_outcomes
        .with_label_values(&[op, outcome])
        .inc();
}

/// One audit line per lock call that reached the state machine (written by the node's audit
/// log, which never sees the lease id itself, only its digest).
struct Audit<'a> {
    op: &'a str,
    resource: &'a str,
    lease: Option<&'a LeaseId>,
    token: Option<u64>,
    caller: Option<String>,
}

impl Audit<'_> {
    fn record(self, node: &Node, outcome: &str, took: Option<Instant>) {
        node.record_lock_call(LockCallRecord {
            op: self.op,
            resource: self.resource,
            lease: self.lease,
            token: self.token,
            caller: self.caller,
            outcome,
            took_ms: took.map(|t| t.elapsed().as_millis() as u64),
        });
    }
}

/// The holder name and token of a lease, for the audit of renew and release (their bodies
/// carry only the lease id). Read from this node's state; a node that has not applied the grant
/// yet (a follower right after the acquire) first catches up with a read barrier, so the line
/// names the lease's holder rather than nobody. The barrier gets a short bound of its own: the
/// audit must not delay the call itself by more than a moment (e.g. on a node without quorum).
const AUDIT_CATCH_UP: std::time::Duration = std::time::Duration::from_millis(200);

async fn lease_facts(
    node: &Node,
    resource: &str,
    lease_id: &LeaseId,
) -> (Option<String>, Option<u64>) {
    let lookup = || {
        node.machine.read(|m| {
            m.lease(resource)
                .filter(|l| l.lease_id == *lease_id)
                .map(|l| (l.holder.clone(), l.fencing_token))
        })
    };
    if let Some((holder, token)) = lookup() {
        return (holder, Some(token));
    }
    let barrier = tokio::time::timeout(AUDIT_CATCH_UP, node.read_barrier()).await;
    if !matches!(barrier, Ok(Ok(()))) {
        return (None, None);
    }
    lookup().map_or((None, None), |(holder, token)| (holder, Some(token)))
}

fn lock_held(retry_after_ms: u64, message: &str) -> ApiError {
    ApiError::new(ErrorCode::LockHeld, message).with_retry_after(retry_after_ms)
}

fn unexpected(resp: Response) -> ApiError {
    if resp == Response::KeyRefused {
        // The key was revoked between the check at the door and the apply.
        return super::auth::refusal(crate::node::Denied::Invalid);
    }
    ApiError::new(
        ErrorCode::Internal,
        format!("Unexpected state machine response {resp:?}; this is a bug, please report it."),
    )
}

/// The lease id of a renew or release body.
fn required_lease(lease_id: Option<LeaseId>) -> Result<LeaseId, ApiError> {
    lease_id.ok_or_else(|| ApiError::invalid("Field 'lease_id' is required."))
}
