//! `POST /v1/locks/{resource}/cancel`: withdraws a waiting acquire (never ends a granted lease).

use std::sync::Arc;

use super::{unexpected, Audit, Scope};
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
    let audit = || Audit {
        op: "cancel",
        resource,
        lease: None,
        token: None,
        caller: scope.audit_name.clone(),
        holder: None,
    };
    let answer = node.propose(scope.wrap(cmd)).await;
    match answer.map_err(|e| audit().failed(node, e.into(), None))? {
        Response::Cancelled(cancelled) => {
            audit().record(
                node,
                if cancelled {
                    "cancelled"
                } else {
                    "not_waiting"
                },
                None,
            );
            Ok(CancelResponse { cancelled })
        }
        other => Err(unexpected(other)),
    }
}
