//! The peer listener's gate: a request without a valid tag made with the cluster secret is
//! refused with 401 before its body is read (see [`crate::net::auth`] for the tag).

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::raft_rpc::PEER_BODY_LIMIT;
use super::ApiError;
use crate::net::auth::{AuthError, PeerSecret};
use crate::net::{AUTH_HEADER, FROM_HEADER};
use crate::wire::ErrorCode;

fn refuse(e: AuthError) -> Response {
    ApiError::new(
        ErrorCode::PeerUnauthenticated,
        format!("Peer request refused: {e}. Peers must share the cluster's peer secret."),
    )
    .into_response()
}

fn header<'a>(req: &'a Request, name: &str) -> Result<&'a str, AuthError> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .ok_or(AuthError::Missing)
}

pub async fn authenticate(
    State(secret): State<Arc<PeerSecret>>,
    req: Request,
    next: Next,
) -> Response {
    let head = header(&req, FROM_HEADER).and_then(|from| {
        let tag = header(&req, AUTH_HEADER)?;
        secret.verify_head(from, req.uri().path(), tag)
    });
    let head = match head {
        Ok(h) => h,
        Err(e) => return refuse(e),
    };
    let (parts, body) = req.into_parts();
    let body = match to_bytes(body, PEER_BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::invalid(format!("Cannot read the peer request body: {e}."))
                .into_response()
        }
    };
    if let Err(e) = secret.verify_body(&head, &body) {
        return refuse(e);
    }
    next.run(Request::from_parts(parts, Body::from(body))).await
}
