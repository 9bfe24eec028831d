//! The linearizable reads: `GET /v1/locks/{resource}` and `GET /v1/locks?prefix=&limit=`.
//! Neither ever shows a lease id.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Uri;
use axum::Json;
use serde::Deserialize;

use super::{decode_name, lock_path, record, Scope};
use crate::api::auth::caller_of;
use crate::api::{read_barrier, ApiError};
use crate::node::Caller;
use crate::node::Node;
use crate::wire::tenant::MAX_TENANT_LEN;
use crate::wire::MAX_RESOURCE_LEN;
use crate::wire::{validate_resource, ErrorCode, LockList, LockView, LOCK_ACTIONS, MAX_LIST_LIMIT};

/// `GET /v1/locks/{resource}`. A path whose last segment as sent is a lock action is that
/// action (`GET /v1/locks/jobs/acquire`: 405); a name that ends in one is read with its `/`
/// as `%2F` (`GET /v1/locks/jobs%2Facquire`).
pub async fn get(
    State(node): State<Arc<Node>>,
    caller: Option<axum::Extension<Caller>>,
    uri: Uri,
) -> Result<Json<LockView>, ApiError> {
    let spelled = lock_path(&uri);
    if let Some((_, action)) = spelled.rsplit_once('/') {
        if LOCK_ACTIONS.contains(&action) {
            return Err(ApiError::new(
                ErrorCode::MethodNotAllowed,
                format!("'{action}' is a lock action: use POST /v1/locks/{{resource}}/{action}."),
            ));
        }
    }
    let resource = decode_name(spelled)?;
    let started = Instant::now();
    let result = async {
        validate_resource(&resource).map_err(ApiError::invalid)?;
        let scope = Scope::of(&node, caller_of(caller));
        let stored = scope.stored(&resource);
        read_barrier(&node).await?;
        scope.still_valid(&node)?;
        let mut view = node.machine.read(|m| m.view(&stored, m.now_ms()));
        view.resource = resource.clone();
        Ok(view)
    }
    .await;
    record(
        &node,
        "get",
        started,
        result.as_ref().err().map(ApiError::outcome),
    );
    result.map(Json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    /// The cursor of the previous page (its `next_after`).
    after: Option<String>,
}

/// A checked listing query: the prefix, the page size and the cursor.
pub(crate) struct ListPage {
    pub prefix: String,
    pub limit: usize,
    pub after: Option<String>,
}

/// Which names a listing's prefix is matched against.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Names {
    /// The caller's own resource names.
    Own,
    /// Stored names across tenants (`tenant#name`), for operators.
    Stored,
}

/// Checks a listing's query. A prefix no name can start with is refused rather than answered
/// with an empty page that would read as "no locks".
pub(crate) fn list_page(
    query: Result<Query<ListQuery>, QueryRejection>,
    names: Names,
) -> Result<ListPage, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::bad_query(
            &e,
            &format!("prefix, limit (1–{MAX_LIST_LIMIT}) and after (the next_after of a page)"),
        )
    })?;
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_LIST_LIMIT {
        return Err(ApiError::invalid(format!(
            "limit must be 1–{MAX_LIST_LIMIT}."
        )));
    }
    let resource_byte = |b: u8| b.is_ascii_alphanumeric() || b"._:/-".contains(&b);
    let prefix_ok = match names {
        Names::Own => q.prefix.len() <= MAX_RESOURCE_LEN && q.prefix.bytes().all(resource_byte),
        // A tenant's name (a-z, 0-9, _ and -), `#`, then a resource name.
        Names::Stored => {
            q.prefix.len() <= MAX_TENANT_LEN + 1 + MAX_RESOURCE_LEN
                && q.prefix.bytes().all(|b| resource_byte(b) || b == b'#')
        }
    };
    if !prefix_ok {
        return Err(ApiError::invalid(match names {
            Names::Own => {
                "prefix: resource names are at most 256 bytes of letters, digits and . _ : / -, \
                 so no lock starts with this prefix."
            }
            Names::Stored => {
                "prefix: stored names are a resource name (at most 256 bytes of letters, digits \
                 and . _ : / -), or a tenant's name, '#' and a resource name, so no lock starts \
                 with this prefix."
            }
        }));
    }
    Ok(ListPage {
        prefix: q.prefix,
        limit,
        after: q.after,
    })
}

/// `GET /v1/locks?prefix=&limit=&after=`: held or waited-on resources, in name order, one page
/// at a time.
pub async fn list(
    State(node): State<Arc<Node>>,
    caller: Option<axum::Extension<Caller>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<LockList>, ApiError> {
    let started = Instant::now();
    let result = async {
        let q = list_page(query, Names::Own)?;
        let scope = Scope::of(&node, caller_of(caller));
        read_barrier(&node).await?;
        scope.still_valid(&node)?;
        let tenant = scope.tenant;
        let (locks, next_after, now_ms) = node.machine.read(|m| {
            let now_ms = m.now_ms();
            let (page, next) =
                m.list_tenant(&tenant, &q.prefix, q.after.as_deref(), q.limit, now_ms);
            (page, next, now_ms)
        });
        Ok(LockList {
            locks,
            next_after,
            now_ms,
        })
    }
    .await;
    record(
        &node,
        "list",
        started,
        result.as_ref().err().map(ApiError::outcome),
    );
    result.map(Json)
}
