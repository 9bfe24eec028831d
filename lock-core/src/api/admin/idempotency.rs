//! Operator endpoints for the fencing proxy's `Idempotency-Key` records whose outcome is
//! unknown: list them, and settle one as "it ran" or "it never ran". Both need the admin
//! credential; a resolution is a committed raft command and is audited on the node that
//! answered, refusals included.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;

use super::actions::authorize;
use super::auth::require_admin;
use crate::api::{parse_json, read_barrier, ApiError};
use crate::machine::{
    Command, Finding, IdemCommand, IdemOutcome, IdemScope, IdemState, Response, StoredAnswer,
    StoredBody,
};
use crate::node::Node;
use crate::wire::{
    hex, ErrorCode, IdemResolution, IdemResolveRequest, IdemResolveResponse, IdemResolvedAnswer,
    IdemUnknownPage, IdemUnknownRecord,
};

/// Most records one page lists.
const MAX_PAGE: usize = 100;
/// Longest tenant, route or key a resolution may name (the proxy's keys are at most 255).
const MAX_PART: usize = 1_024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnknownQuery {
    limit: Option<usize>,
    /// The `next` of the previous page.
    after: Option<String>,
}

/// `GET /v1/admin/idempotency/unknown?limit=&after=`: records whose outcome is unknown, in
/// a stable order (a claim whose owner's lease has ended counts). Linearizable: the page
/// reflects every command committed before the request, whichever node answers it.
pub async fn unknown(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    q: Result<Query<UnknownQuery>, QueryRejection>,
) -> Result<Json<IdemUnknownPage>, ApiError> {
    require_admin(&node, &headers)?;
    let Query(q) = q.map_err(|e| {
        ApiError::bad_query(
            &e,
            &format!("limit (1–{MAX_PAGE}) and after (a page's next)"),
        )
    })?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::invalid(format!("limit must be 1–{MAX_PAGE}.")));
    }
    let after = q
        .after
        .filter(|a| !a.is_empty())
        .map(|a| {
            hex_decode(&a).ok_or_else(|| {
                ApiError::invalid("after must be the `next` cursor of an earlier page.")
            })
        })
        .transpose()?;
    // An operator settles what the list shows: a follower that has not applied the latest
    // claims and resolutions yet must not offer a stale list.
    read_barrier(&node).await?;
    let now_ms = node.now_ms();
    let page = node
        .machine
        .idem_unknown(now_ms, after.as_deref(), limit)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("Cannot read records: {e}.")))?;
    let records = page
        .records
        .into_iter()
        .filter_map(|(scope, rec)| {
            Some(IdemUnknownRecord {
                attempt: lost_attempt(&rec.state)?.to_string(),
                tenant: scope.tenant,
                route: scope.route,
                key: scope.key,
                created_ms: rec.created_ms,
                expires_at_ms: rec.expires_at_ms,
            })
        })
        .collect();
    Ok(Json(IdemUnknownPage {
        records,
        next: page.next.map(|c| hex::encode(&c)),
        now_ms,
    }))
}

/// The attempt a listed record lost: the unknown one, or the processing one whose owner's
/// lease has ended.
fn lost_attempt(state: &IdemState) -> Option<u64> {
    match state {
        IdemState::Processing { attempt, .. } | IdemState::Unknown { attempt } => Some(*attempt),
        IdemState::Succeeded(_) | IdemState::Failed(_) => None,
    }
}

/// `POST /v1/admin/idempotency/resolve {operator, tenant, route, key, attempt, resolution}`.
///
/// `succeeded` stores a fixed answer, 200 with an [`IdemResolvedAnswer`] naming the operator,
/// rather than one the operator types in: the upstream's real answer is not known, and a
/// made-up one would be replayed to clients as if the upstream had said it.
pub async fn resolve(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<IdemResolveResponse>, ApiError> {
    const OP: &str = "idempotency_resolve";
    let req: IdemResolveRequest = parse_json(&body)?;
    let what = format!(
        "tenant {} route {} key {} attempt {} as {}",
        req.tenant,
        req.route,
        req.key,
        req.attempt,
        req.resolution.as_str()
    );
    authorize(&node, &headers, OP, &req.operator, None)?;
    for (name, part) in [
        ("tenant", &req.tenant),
        ("route", &req.route),
        ("key", &req.key),
    ] {
        if part.is_empty() || part.len() > MAX_PART {
            return Err(ApiError::invalid(format!(
                "{name} must be 1–{MAX_PART} bytes, as the record was listed."
            )));
        }
    }
    let audit = |outcome: &str| {
        node.record_operator_action(OP, &req.operator, None, None, outcome, Some(what.clone()));
    };
    let attempt: u64 = match req.attempt.parse() {
        Ok(a) => a,
        Err(_) => {
            audit(ErrorCode::InvalidRequest.as_str());
            return Err(ApiError::invalid(
                "attempt must be the decimal attempt id the record was listed with.",
            ));
        }
    };
    let finding = match req.resolution {
        IdemResolution::Succeeded => Finding::Ran(resolved_answer(&req.operator)?),
        IdemResolution::NeverRan => Finding::NeverRan,
    };
    let cmd = Command::Idem(IdemCommand::Resolve {
        scope: IdemScope {
            tenant: req.tenant.clone(),
            route: req.route.clone(),
            key: req.key.clone(),
        },
        attempt,
        finding,
        operator: req.operator.clone(),
    });
    let refused = |why: &str| ApiError::new(ErrorCode::IdempotencyNotUnknown, why.to_string());
    let result = match node.propose(cmd).await {
        Ok(Response::Idem(IdemOutcome::Completed)) => Ok(()),
        Ok(Response::Idem(IdemOutcome::NotOwner)) => Err(ApiError::not_found(
            "No record with this tenant, route and key (never used, or forgotten after its \
             tombstone window).",
        )),
        Ok(Response::Idem(IdemOutcome::InFlight { .. })) => Err(refused(
            "The record is in flight, not unknown: its owner's claim has not ended yet.",
        )),
        Ok(Response::Idem(IdemOutcome::Replay(_))) => Err(refused(
            "The record is settled already (answered, reconciled or resolved); nothing changed.",
        )),
        Ok(Response::Idem(IdemOutcome::Unknown { .. })) => Err(refused(
            "Another attempt of this key is unknown now; list the records again and resolve \
             that one.",
        )),
        Ok(Response::Idem(IdemOutcome::Expired { .. })) => Err(refused(
            "The record has expired: the key is refused as expired whatever is decided.",
        )),
        Ok(other) => Err(ApiError::new(
            ErrorCode::Internal,
            format!("Unexpected state machine response {other:?}; this is a bug."),
        )),
        Err(e) => Err(ApiError::from(e)),
    };
    match result {
        Ok(()) => {
            audit(req.resolution.as_str());
            node.metrics
                .idem_resolutions
                .with_label_values(&[req.resolution.as_str()])
                .inc();
            Ok(Json(IdemResolveResponse {
                tenant: req.tenant,
                route: req.route,
                key: req.key,
                resolution: req.resolution,
            }))
        }
        Err(e) => {
            audit(e.code().as_str());
            Err(e)
        }
    }
}

/// The answer replayed for a record resolved as `succeeded`.
fn resolved_answer(operator: &str) -> Result<StoredAnswer, ApiError> {
    let body = IdemResolvedAnswer {
        resolved_by: operator.to_string(),
        message: "An operator confirmed that this request took effect; its original answer \
                  was lost and is not known."
            .into(),
    };
    let bytes = serde_json::to_vec(&body)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("Cannot encode: {e}.")))?;
    Ok(StoredAnswer {
        status: 200,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("idempotent-resolved-by".into(), operator.to_string()),
        ],
        body: StoredBody::Inline(base64::engine::general_purpose::STANDARD.encode(bytes)),
        reconciled: false,
    })
}

/// A cursor's bytes: hex of at most 1 KiB.
fn hex_decode(s: &str) -> Option<Vec<u8>> {
    (s.len() <= 2 * 1_024).then(|| hex::decode(s)).flatten()
}
