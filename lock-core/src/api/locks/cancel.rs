//! `POST /v1/locks/{resource}/cancel`: withdraws a waiting acquire (never ends a granted lease).

use std::sync::Arc;

use super::{unexpected, Scope};
use crate::api::{parse_json, ApiError};
use crate::machine::{Command, Response};
use crate::node::Node;
use crate::wire::{validate_id, CancelRequest, CancelResponse};

pub(super) async fn cancel(
    node: &Arc<Node>,
    scope: &Scope,
    resource: &str,
    body: &[u8],
) -> Result<CancelResponse, ApiError> {
    let req: CancelRequest = parse_json(body)?;
    validate_id(&req.request_id, "request_id").map_err(ApiError::invalid)?;
    let cmd = Command::Cancel {
        resource: resource.to_string(),
        request_id: req.request_id,
    };
    match node.propose(scope.wrap(cmd)).await? {
        Response::Cancelled(cancelled) => Ok(CancelResponse { cancelled }),
        other => Err(unexpected(other)),
    }
}
