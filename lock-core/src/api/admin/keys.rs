//! Key management: `POST /v1/admin/keys` creates a key and shows its secret once,
//! `GET /v1/admin/keys` lists keys (never secrets), `POST /v1/admin/keys/{id}/revoke` removes
//! one. Each is an admin call, a raft command (so every node knows the same keys), and audited.
//!
//! A creation that times out (503) may still commit: its secret is then lost, the key shows in
//! the list, and the operator revokes it and creates another.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;

use super::auth::require_admin;
use crate::api::auth::bearer;
use crate::api::{parse_json, read_barrier, ApiError};
use crate::machine::{ApiKeyRecord, Command, Response};
use crate::node::{key_digest, new_api_key, Node};
use crate::wire::{
    validate_tenant, CreateKeyRequest, CreatedKey, ErrorCode, KeyList, RevokeKeyResponse,
    MAX_ID_LEN,
};

/// How the audit log names the admin behind a key call.
fn operator(node: &Node, headers: &HeaderMap) -> String {
    node.authenticate(bearer(headers))
        .map_or_else(|_| "admin_token".to_string(), |c| c.audit_name())
}

/// Checks the credential; a refusal is audited.
fn authorize(node: &Node, headers: &HeaderMap, op: &str) -> Result<String, ApiError> {
    if let Err(e) = require_admin(node, headers) {
        node.record_refused_action(op, None, None, e.code().as_str());
        return Err(e);
    }
    Ok(operator(node, headers))
}

fn unexpected(resp: Response) -> ApiError {
    ApiError::new(
        ErrorCode::Internal,
        format!("Unexpected state machine response {resp:?}; this is a bug, please report it."),
    )
}

/// `POST /v1/admin/keys {tenant, role, label?}`.
pub async fn create_key(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<CreatedKey>, ApiError> {
    let operator = authorize(&node, &headers, "key_create")?;
    let req: CreateKeyRequest = parse_json(&body)?;
    validate_tenant(&req.tenant).map_err(ApiError::invalid)?;
    if req
        .label
        .as_ref()
        .is_some_and(|l| l.chars().count() > MAX_ID_LEN)
    {
        return Err(ApiError::invalid(format!(
            "Field 'label' must be at most {MAX_ID_LEN} characters."
        )));
    }
    let (id, key) = new_api_key();
    let record = ApiKeyRecord {
        id: id.clone(),
        tenant: req.tenant.clone(),
        role: req.role,
        digest: key_digest(&key),
        label: req.label.clone(),
        created_at_ms: 0,
    };
    let detail = format!("key {id} tenant {} role {}", req.tenant, req.role.as_str());
    let outcome = match node.propose(Command::KeyCreate(record)).await {
        Ok(Response::KeyCreated(true)) => Ok(()),
        Ok(Response::KeyCreated(false)) => Err(ApiError::new(
            ErrorCode::ActionFailed,
            "A key with the new key's random id exists already; nothing was changed. Retry.",
        )),
        Ok(other) => Err(unexpected(other)),
        Err(e) => Err(ApiError::from(e)),
    };
    let code = outcome.as_ref().err().map_or("done", |e| e.code().as_str());
    node.record_operator_action("key_create", &operator, None, None, code, Some(detail));
    outcome?;
    Ok(Json(CreatedKey {
        id,
        key,
        tenant: req.tenant,
        role: req.role,
        label: req.label,
    }))
}

/// `GET /v1/admin/keys`: every key of the cluster, linearizable.
pub async fn list_keys(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> Result<Json<KeyList>, ApiError> {
    require_admin(&node, &headers)?;
    read_barrier(&node).await?;
    let keys = node
        .machine
        .read(|m| m.api_keys().map(ApiKeyRecord::info).collect());
    Ok(Json(KeyList { keys }))
}

/// `POST /v1/admin/keys/{id}/revoke`: once answered, no node applies a call made with the key
/// (calls are checked against the key table when they are applied, in log order).
pub async fn revoke_key(
    State(node): State<Arc<Node>>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Json<RevokeKeyResponse>, ApiError> {
    let operator = authorize(&node, &headers, "key_revoke")?;
    let Path(id) =
        id.map_err(|e| ApiError::invalid(format!("Bad key id in the URL: {}.", e.body_text())))?;
    if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid(
            "Key ids are hex digits, as 'fencegate keys list' shows them.",
        ));
    }
    let outcome = match node.propose(Command::KeyRevoke { id: id.clone() }).await {
        Ok(Response::KeyRevoked(revoked)) => Ok(revoked),
        Ok(other) => Err(unexpected(other)),
        Err(e) => Err(ApiError::from(e)),
    };
    let code = match &outcome {
        Ok(true) => "revoked",
        Ok(false) => "not_found",
        Err(e) => e.code().as_str(),
    };
    node.record_operator_action(
        "key_revoke",
        &operator,
        None,
        None,
        code,
        Some(format!("key {id}")),
    );
    Ok(Json(RevokeKeyResponse {
        id,
        revoked: outcome?,
    }))
}
