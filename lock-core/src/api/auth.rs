//! Authentication of the public API, with keys on: who may call what.
//!
//! | path | needs |
//! |---|---|
//! | `/healthz`, `/readyz`, `/metrics`, `/ui` (the page and its assets) | nothing |
//! | `/v1/admin/...`, `/v1/cluster/members/...` | an admin key |
//! | every other `/v1/...` | a client or admin key |
//!
//! A refused call is counted (`auth_denied_total{reason}`) and audited with the key's id or a
//! digest prefix of what was sent, never the value. Lock calls also pass the tenant's rate
//! bucket on this node. The authenticated [`Caller`] goes to the handlers as a request
//! extension; they keep it to the caller's tenant namespace.

use std::time::Instant;

use axum::extract::Request;
use axum::http::header;

use super::ApiError;
use crate::node::{Caller, Denied, Node};
use crate::wire::{ErrorCode, KeyRole};

/// What a path needs.
#[derive(PartialEq, Eq)]
enum Needs {
    Nothing,
    AnyKey,
    Admin,
}

fn needs(path: &str) -> Needs {
    if path.starts_with("/v1/admin/") || path.starts_with("/v1/cluster/members/") {
        Needs::Admin
    } else if path == "/v1" || path.starts_with("/v1/") {
        Needs::AnyKey
    } else {
        Needs::Nothing
    }
}

/// The bearer value of a request, if it sent one.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::wire::headers::bearer_token)
}

/// Checks the API key of `req` against what its path needs, and with keys on hands the
/// authenticated [`Caller`] to the handler (as a request extension); or the refusal. With keys
/// off every request passes unchanged.
pub(crate) fn admit(node: &Node, mut req: Request) -> Result<Request, ApiError> {
    if !node.auth_on() {
        return Ok(req);
    }
    let path = req.uri().path();
    let needs = needs(path);
    if needs == Needs::Nothing {
        return Ok(req);
    }
    let presented = bearer(req.headers());
    let caller = match node.authenticate(presented) {
        Ok(c) if needs == Needs::Admin && c.role != KeyRole::Admin => Err(Denied::Role),
        other => other,
    };
    let caller = match caller {
        Ok(c) => c,
        Err(denied) => {
            node.record_denied(denied, req.method().as_str(), path, presented);
            return Err(refusal(denied));
        }
    };
    // The bootstrap credential (no key id) is the operator's and, like its lock calls, not
    // bounded by the tenant's rate.
    if path.starts_with("/v1/locks") && caller.key_id.is_some() {
        if let Err(retry_after_ms) =
            node.tenant_rates
                .take(&caller.tenant, &node.config.tenants, Instant::now())
        {
            node.metrics
                .tenant_limited
                .with_label_values(&["rate"])
                .inc();
            return Err(ApiError::new(
                ErrorCode::TenantRateLimited,
                "Your tenant sent more lock calls to this node than its rate allows; retry \
                 after retry_after_ms.",
            )
            .with_retry_after(retry_after_ms));
        }
    }
    req.extensions_mut().insert(caller);
    Ok(req)
}

pub(crate) fn refusal(denied: Denied) -> ApiError {
    match denied {
        Denied::Missing => ApiError::new(
            ErrorCode::Unauthenticated,
            "This node requires an API key: send 'Authorization: Bearer <api key>' (an admin \
             creates keys with 'fencegate keys create').",
        ),
        Denied::Invalid => ApiError::new(
            ErrorCode::Unauthenticated,
            "The API key is not valid here (unknown, revoked or mistyped); nothing was done.",
        ),
        Denied::Role => ApiError::new(
            ErrorCode::Forbidden,
            "This call needs an admin key; the key sent is a client key. Nothing was done.",
        ),
        Denied::Tenant => ApiError::new(
            ErrorCode::Forbidden,
            "The request names another tenant than the API key's; the key decides the tenant. \
             Nothing was done.",
        ),
    }
}

/// The caller a handler serves: the authenticated one, or with keys off the implicit one (the
/// default tenant, no key).
pub(crate) fn caller_of(ext: Option<axum::Extension<Caller>>) -> Option<Caller> {
    ext.map(|axum::Extension(c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_paths_need_an_admin_and_health_needs_nothing() {
        assert!(needs("/v1/admin/keys") == Needs::Admin);
        assert!(needs("/v1/admin/force-release/x") == Needs::Admin);
        assert!(needs("/v1/cluster/members/add") == Needs::Admin);
        assert!(needs("/v1/locks/x/acquire") == Needs::AnyKey);
        assert!(needs("/v1/cluster") == Needs::AnyKey);
        assert!(needs("/v1") == Needs::AnyKey);
        for open in [
            "/healthz",
            "/readyz",
            "/metrics",
            "/ui",
            "/ui/app.js",
            "/v1x",
        ] {
            assert!(needs(open) == Needs::Nothing, "{open}");
        }
    }
}
