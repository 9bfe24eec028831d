//! `POST /v1/locks/{resource}/release`: idempotent; a stale lease id releases nothing.

use std::sync::Arc;

use super::{audit, required_lease, unexpected};
use crate::api::{parse_json, ApiError};
use crate::machine::{Command, Response};
use crate::node::Node;
use crate::wire::{LeaseRequest, ReleaseResponse};

pub(super) async fn release(
    node: &Arc<Node>,
    resource: &str,
    body: &[u8],
) -> Result<ReleaseResponse, ApiError> {
    let req: LeaseRequest = parse_json(body)?;
    let lease_id = required_lease(req.lease_id)?;
    let cmd = Command::Release {
        resource: resource.to_string(),
        lease_id,
    };
    match node.propose(cmd).await? {
        Response::Released(released) => {
            audit(
                "release",
                resource,
                Some(&lease_id),
                None,
                if released { "released" } else { "not_held" },
            );
            Ok(ReleaseResponse { released })
        }
        other => Err(unexpected(other)),
    }
}
