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
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
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
    /// How the audit log names the caller (`key:<id>`); none with keys off.
    audit_name: Option<String>,
    limits: Option<TenantLimits>,
}

impl Scope {
    /// With keys off (no caller) or the bootstrap credential: the default tenant, unbounded,
    /// exactly as before tenants existed.
    fn of(node: &Node, caller: Option<Caller>) -> Scope {
        match caller {
            // The bootstrap credential (no key id) is the operator's: unbounded, as with keys off.
            Some(c) => Scope {
                limits: c.key_id.is_some().then(|| node.config.tenants.limits()),
                audit_name: Some(c.audit_name()),
                tenant: c.tenant,
                key_id: c.key_id,
            },
            None => Scope {
                tenant: DEFAULT_TENANT.to_string(),
                key_id: None,
                audit_name: None,
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

/// `POST /v1/locks/{resource}/{action}`; the resource may itself contain `/` (raw or `%2F`).
/// The action is the last segment of the path as sent, so a name ending in an action word is
/// unambiguous with its `/` sent as `%2F`.
pub async fn post(
    State(node): State<Arc<Node>>,
    caller: Option<axum::Extension<Caller>>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<HttpResponse, ApiError> {
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
    let Some((resource, action)) = lock_path(&uri).rsplit_once('/') else {
        // The path names a lock, which is read with GET.
        return Err(ApiError::new(
            ErrorCode::MethodNotAllowed,
            "A lock is read with GET /v1/locks/{resource} and changed with POST \
             /v1/locks/{resource}/acquire|renew|release|cancel.",
        ));
    };
    let resource = &decode_name(resource)?;
    if !LOCK_ACTIONS.contains(&action) {
        return Err(ApiError::not_found(format!(
            "Unknown lock action '{action}'; use acquire, renew, release or cancel."
        )));
    }
    let scope = Scope::of(&node, caller_of(caller));
    let mut pending = Unanswered {
        node: &node,
        op: action,
        resource: None,
        caller: scope.audit_name.clone(),
        started: Instant::now(),
        answered: false,
    };
    let result = async {
        validate_resource(resource).map_err(ApiError::invalid)?;
        let resource = &scope.stored(resource);
        pending.resource = Some(resource.clone());
        match action {
            "acquire" => json(acquire::acquire(&node, &scope, resource, &body).await),
            "renew" => json(renew::renew(&node, &scope, resource, &body).await),
            "release" => json(release::release(&node, &scope, resource, &body).await),
            _ => json(cancel::cancel(&node, &scope, resource, &body).await),
        }
    }
    .await;
    pending.answered(result.as_ref().err());
    result
}

/// A lock call being served. Answered, its latency and outcome are counted; if its caller
/// hangs up first (axum drops the handler's future), it is counted and audited as `abandoned`
/// on drop, so calls given up on under load are not missing from the latency and the trail.
/// Whether an abandoned call took effect is unknown to its caller: an acquire's wait is
/// withdrawn, a committed grant stays until its TTL, a retry with the same request_id finds it.
struct Unanswered<'a> {
    node: &'a Node,
    op: &'a str,
    /// The stored name, once the name was valid.
    resource: Option<String>,
    caller: Option<String>,
    started: Instant,
    answered: bool,
}

impl Unanswered<'_> {
    fn answered(mut self, error: Option<&ApiError>) {
        record(
            self.node,
            self.op,
            self.started,
            error.map(ApiError::outcome),
        );
        self.answered = true;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        record(self.node, self.op, self.started, Some(ABANDONED));
        if let Some(resource) = &self.resource {
            self.node.record_lock_call(LockCallRecord {
                op: self.op,
                resource,
                lease: None,
                token: None,
                caller: self.caller.take(),
                holder: None,
                outcome: ABANDONED,
                took_ms: Some(self.started.elapsed().as_millis() as u64),
            });
        }
    }
}

/// The outcome of a lock call whose caller hung up before the answer.
const ABANDONED: &str = "abandoned";

fn json<T: Serialize>(result: Result<T, ApiError>) -> Result<HttpResponse, ApiError> {
    result.map(|body| Json(body).into_response())
}

/// `/v1/locks/` with nothing after it: a lock call without its resource.
pub async fn no_name() -> ApiError {
    ApiError::invalid(
        "The resource name is missing: use /v1/locks/{resource} (1–256 bytes of letters, digits \
         and . _ : / -).",
    )
}

/// What follows `/v1/locks/` in the request's path, as sent (percent-encoded).
fn lock_path(uri: &Uri) -> &str {
    uri.path().strip_prefix("/v1/locks/").unwrap_or_default()
}

/// A resource name from its spelling in a path: percent-decoded, and UTF-8 (`%FF` is a JSON
/// 400).
fn decode_name(spelled: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(spelled)
        .decode_utf8()
        .map(|name| name.into_owned())
        .map_err(|_| ApiError::invalid("Bad resource in the URL: it is not UTF-8 once decoded."))
}

/// Latency and outcome metrics of one call; `failed` is the outcome of a call that failed.
fn record(node: &Node, op: &str, started: Instant, failed: Option<&str>) {
    let outcome = failed.unwrap_or("success");
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
    /// The API key that made the call (the scope's audit name).
    caller: Option<String>,
    holder: Option<String>,
}

impl Audit<'_> {
    fn record(self, node: &Node, outcome: &str, took: Option<Instant>) {
        node.record_lock_call(LockCallRecord {
            op: self.op,
            resource: self.resource,
            lease: self.lease,
            token: self.token,
            caller: self.caller,
            holder: self.holder,
            outcome,
            took_ms: took.map(|t| t.elapsed().as_millis() as u64),
        });
    }

    /// Audits a call that failed before the state machine answered (no quorum, overload),
    /// and passes its error on.
    fn failed(self, node: &Node, error: ApiError, took: Option<Instant>) -> ApiError {
        self.record(node, error.outcome(), took);
        error
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
