//! The admin credential: one bearer token from the node's config (`admin_token`), or, with
//! API keys on, any admin key of the cluster (the bootstrap token is then one of them).

use axum::http::{header, HeaderMap};

use crate::api::ApiError;
use crate::node::{constant_time_eq, Denied, Node};
use crate::wire::{ErrorCode, KeyRole};

/// Checks `Authorization: Bearer <admin_token>`. A node without a token refuses every
/// operator action. Returns the header, to relay the call to the leader on the caller's
/// behalf.
pub fn require_admin<'h>(node: &Node, headers: &'h HeaderMap) -> Result<&'h str, ApiError> {
    if node.auth_on() {
        return require_admin_key(node, headers);
    }
    let Some(expected) = node.config.admin_token.as_deref() else {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "Operator actions are off on this node: set admin_token in its config.",
        ));
    };
    check(expected, headers)
}

/// For fault injection (only served where a test harness turned it on): checked when the node
/// has an admin token, open otherwise.
pub fn check_admin_if_configured<'h>(
    node: &Node,
    headers: &'h HeaderMap,
) -> Result<Option<&'h str>, ApiError> {
    if node.auth_on() {
        return require_admin_key(node, headers).map(Some);
    }
    match node.config.admin_token.as_deref() {
        Some(expected) => check(expected, headers).map(Some),
        None => Ok(None),
    }
}

/// With keys on: an admin key of the cluster. The middleware checked this already; checking
/// again here keeps an operator action safe even if a route were mounted outside it.
fn require_admin_key<'h>(node: &Node, headers: &'h HeaderMap) -> Result<&'h str, ApiError> {
    match node.authenticate(crate::api::auth::bearer(headers)) {
        Ok(caller) if caller.role == KeyRole::Admin => headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| crate::api::auth::refusal(Denied::Missing)),
        Ok(_) => Err(crate::api::auth::refusal(Denied::Role)),
        Err(denied) => Err(crate::api::auth::refusal(denied)),
    }
}

fn check<'h>(expected: &str, headers: &'h HeaderMap) -> Result<&'h str, ApiError> {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "Operator actions need the admin credential: send 'Authorization: Bearer <admin \
             token>' (fencegate dev prints it; a node takes it from admin_token in its config).",
        ));
    };
    let presented = crate::wire::headers::bearer_token(value).unwrap_or("");
    if constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
        Ok(value)
    } else {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            "The admin credential is wrong; nothing was changed.",
        ))
    }
}
