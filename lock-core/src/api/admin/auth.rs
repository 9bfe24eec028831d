//! The admin credential: one bearer token from the node's config (`admin_token`).

use axum::http::{header, HeaderMap};

use crate::api::ApiError;
use crate::node::Node;
use crate::wire::ErrorCode;

/// Checks `Authorization: Bearer <admin_token>`. A node without a token refuses every
/// operator action. Returns the header, to relay the call to the leader on the caller's
/// behalf.
pub fn require_admin<'h>(node: &Node, headers: &'h HeaderMap) -> Result<&'h str, ApiError> {
    let Some(expected) = node.config.admin_token.as_deref() else {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "Operator actions are off on this node: set admin_token in its config.",
        ));
    };
    check(expected, headers)
}

/// For the membership endpoints, which predate the credential: checked when the node has an
/// admin token, open otherwise.
pub fn check_admin_if_configured<'h>(
    node: &Node,
    headers: &'h HeaderMap,
) -> Result<Option<&'h str>, ApiError> {
    match node.config.admin_token.as_deref() {
        Some(expected) => check(expected, headers).map(Some),
        None => Ok(None),
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
    let presented = value.strip_prefix("Bearer ").unwrap_or("");
    if constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
        Ok(value)
    } else {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            "The admin credential is wrong; nothing was changed.",
        ))
    }
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was
/// right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
