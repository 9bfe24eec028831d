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

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

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
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The middleware: passes every request through unchanged when keys are off.
pub async fn authenticate(State(node): State<Arc<Node>>, mut req: Request, next: Next) -> Response {
    if !node.auth_on() {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    let needs = needs(&path);
    if needs == Needs::Nothing {
        return next.run(req).await;
    }
    let presented = bearer(req.headers()).map(str::to_string);
    let method = req.method().to_string();
    let caller = match node.authenticate(presented.as_deref()) {
        Ok(c) if needs == Needs::Admin && c.role != KeyRole::Admin => Err(Denied::Role),
        other => other,
    };
    let caller = match caller {
        Ok(c) => c,
        Err(denied) => {
            node.record_denied(denied, &method, &path, presented.as_deref());
            return refusal(denied).into_response();
        }
    };
    if path.starts_with("/v1/locks") {
        if let Err(retry_after_ms) =
            node.tenant_rates
                .take(&caller.tenant, &node.config.tenants, Instant::now())
        {
            node.metrics
                .tenant_limited
                .with_label_values(&["rate"])
                .inc();
            return ApiError::new(
                ErrorCode::TenantRateLimited,
                "Your tenant sent more lock calls to this node than its rate allows; retry \
                 after retry_after_ms.",
            )
            .with_retry_after(retry_after_ms)
            .into_response();
        }
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
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
