//! The peer listener's gate: a request without a valid tag made with the cluster secret is
//! refused with 401 before its body is read (see [`crate::net::auth`] for the tag); an
//! authenticated one has its body read under the peer listener's limits.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::listen::{read_limited, BodyLimits};
use super::ApiError;
use crate::net::auth::{AuthError, PeerSecret};
use crate::net::{AUTH_HEADER, FROM_HEADER};
use crate::node::HttpLimits;
use crate::wire::ErrorCode;

fn refuse(e: AuthError) -> Response {
    ApiError::new(
        ErrorCode::PeerUnauthenticated,
        format!("Peer request refused: {}", e.refusal()),
    )
    .into_response()
}

fn header<'a>(req: &'a Request, name: &str) -> Result<&'a str, AuthError> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .ok_or(AuthError::Missing)
}

/// What the gate checks peer requests with.
pub struct PeerGate {
    secret: PeerSecret,
    /// The peer listener's body limits: a body is read only once its head is authenticated,
    /// and then only up to the limit and within the body timeout.
    body: BodyLimits,
}

impl PeerGate {
    pub fn new(secret: PeerSecret, limits: &HttpLimits) -> Self {
        PeerGate {
            secret,
            body: BodyLimits::from(limits),
        }
    }
}

pub async fn authenticate(State(gate): State<Arc<PeerGate>>, req: Request, next: Next) -> Response {
    let secret = &gate.secret;
    let head = header(&req, FROM_HEADER).and_then(|from| {
        let tag = header(&req, AUTH_HEADER)?;
        secret.verify_head(from, req.uri().path(), tag)
    });
    let head = match head {
        Ok(h) => h,
        Err(e) => {
            let claimed = header(&req, FROM_HEADER).unwrap_or("(unnamed)");
            crate::net::auth::warn_refused(&format!("node {claimed}"), &e);
            return refuse(e);
        }
    };
    let (parts, body) = req.into_parts();
    let body = match read_limited(&parts, body, gate.body).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    if let Err(e) = secret.verify_body(&head, &body) {
        return refuse(e);
    }
    next.run(Request::from_parts(parts, Body::from(body))).await
}
