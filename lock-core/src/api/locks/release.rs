//! `POST /v1/locks/{resource}/release`: idempotent; a stale lease id releases nothing.

use std::sync::Arc;

use super::{lease_facts, required_lease, unexpected, Audit};
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
    // Read before the release: afterwards the lease (and its holder's name) is gone.
    let (caller, token) = lease_facts(node, resource, &lease_id).await;
    match node.propose(cmd).await? {
        Response::Released(released) => {
            Audit {
                op: "release",
                resource,
                lease: Some(&lease_id),
                token: token.filter(|_| released),
                caller,
            }
            .record(node, if released { "released" } else { "not_held" }, None);
            Ok(ReleaseResponse { released })
        }
        other => Err(unexpected(other)),
    }
}
