//! The operator endpoints under `/v1/admin/`: the reads the admin UI polls, and the operator
//! actions behind the admin credential. The page at `/ui` uses only these and the v1 API.

mod actions;
mod auth;
mod backup;
mod idempotency;
mod keys;
mod quotas;
mod reads;

pub use actions::{add_member, drain, force_release, remove_member, snapshot};
pub(super) use actions::{audit_result, authorize};
pub use auth::check_admin_if_configured;
pub use backup::backup;
pub use idempotency::{resolve as idempotency_resolve, unknown as idempotency_unknown};
pub use keys::{create_key, list_keys, revoke_key};
pub use quotas::{list as quotas, set as set_quota};
pub use reads::{audit, hot, locks, overview, resource, series};
