//! Bodies of the operator endpoints for the fencing proxy's `Idempotency-Key` records whose
//! outcome is unknown (`/v1/admin/idempotency/...`).

use serde::{Deserialize, Serialize};

/// `GET /v1/admin/idempotency/unknown?limit=&after=`: one page of the records whose outcome is
/// unknown, as of a linearizable read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemUnknownPage {
    pub records: Vec<IdemUnknownRecord>,
    /// Pass as `after` for the next page; absent when this page reached the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// The log time the states were judged at (a claim whose lease ended by then is unknown).
    pub now_ms: u64,
}

/// One record whose outcome is unknown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemUnknownRecord {
    pub tenant: String,
    /// The proxy route's path pattern.
    pub route: String,
    pub key: String,
    /// The attempt whose answer was lost (a decimal u64, as a string: JavaScript numbers
    /// cannot hold every u64). A resolution names it.
    pub attempt: String,
    pub created_ms: u64,
    /// The key is refused as expired from then on; it cannot be resolved any more.
    pub expires_at_ms: u64,
}

/// How an operator settles an unknown record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdemResolution {
    /// The upstream did act: retries get a fixed answer (200, [`IdemResolvedAnswer`]) with
    /// `Idempotent-Replayed: true` and `Idempotent-Resolved-By: <operator>`, never a second
    /// effect.
    Succeeded,
    /// The upstream never acted: the record is dropped, and the next request with the key
    /// runs (once).
    NeverRan,
}

impl IdemResolution {
    pub fn as_str(self) -> &'static str {
        match self {
            IdemResolution::Succeeded => "succeeded",
            IdemResolution::NeverRan => "never_ran",
        }
    }
}

/// `POST /v1/admin/idempotency/resolve`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemResolveRequest {
    #[serde(default)]
    pub operator: String,
    pub tenant: String,
    pub route: String,
    pub key: String,
    /// The lost attempt, as listed: a record that moved on since is left alone.
    pub attempt: String,
    pub resolution: IdemResolution,
}

/// The answer to a resolution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemResolveResponse {
    pub tenant: String,
    pub route: String,
    pub key: String,
    pub resolution: IdemResolution,
}

/// The body replayed for a record an operator resolved as `succeeded`: the upstream's own
/// answer is not known, and is not made up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemResolvedAnswer {
    pub resolved_by: String,
    pub message: String,
}
