//! The v1 wire contract: every body that crosses the public API, as serde types.
//!
//! The server, the Rust client, the `fencegate` CLI, the load and chaos harnesses and the tests
//! all speak through these types; nobody builds or parses these bodies by hand. This module
//! needs only serde: a client built with `default-features = false` gets it without the server.
//!
//! - [`locks`]: acquire, renew, release, cancel, get and list.
//! - [`cluster`]: cluster status, membership, health and fault injection.
//! - [`admin`]: what the admin UI reads (overview, resource detail, hot resources, metrics
//!   series, audit tail) and the operator actions.
//! - [`error`]: the error body, its stable codes with their HTTP statuses, and [`classify`],
//!   which sorts any answer into success, a definite refusal or an uncertain outcome.
//! - [`headers`]: the header names the fencing proxy reads and the leader hint on answers.
//! - [`demo_store`]: the demo store's log of accepted writes, its orders and its record of
//!   rate-limited requests.
//! - [`idempotency`]: the operator endpoints for the proxy's records of unknown outcome.
//! - [`quotas`]: the operator's view and run-time changes of global rate limits.
//! - [`tenant`]: tenant names and namespaces, API keys and the key management bodies.

pub mod admin;
pub mod cluster;
pub mod demo_store;
pub mod error;
pub mod headers;
pub mod hex;
pub mod idempotency;
mod lease_id;
pub mod locks;
pub mod quotas;
pub mod tenant;

pub use admin::{
    AdminAddMember, AdminRemoveMember, AuditEntry, AuditLine, AuditTail, ClusterOverview,
    DrainRequest, DrainResponse, ElectionRecord, ForceReleaseResponse, GrantView, HotEntry,
    HotResources, LeaseDetail, MetricsSample, MetricsSeries, OperatorRequest, PeerHealth,
    Quantiles, ResourceDetail, ResourceEvent, SnapshotResponse, WaiterView,
};
pub use cluster::{
    AddMemberRequest, ClusterStatus, FaultRule, FaultSnapshot, HealthStatus, LockStats, Member,
    MembershipResponse, ReadyStatus, RemoveMemberRequest, Role,
};
pub use demo_store::{LimitedLogEntry, Order, StoreLogEntry};
pub use error::{classify, ErrorBody, ErrorCode, Failure};
pub use headers::{
    BACKUP_INDEX_HEADER, BACKUP_TERM_HEADER, FENCE_RESOURCE_HEADER, FENCE_TOKEN_HEADER,
    LEADER_ID_HEADER, NODE_ID_HEADER,
};
pub use idempotency::{
    IdemResolution, IdemResolveRequest, IdemResolveResponse, IdemResolvedAnswer, IdemUnknownPage,
    IdemUnknownRecord,
};
pub use lease_id::{LeaseDigest, LeaseId};
pub use locks::{
    resource_in_path, validate_id, validate_resource, validate_shown, AcquireRequest,
    AcquireResponse, CancelRequest, CancelResponse, LeaseRequest, LockList, LockView,
    ReleaseResponse, RenewResponse, LOCK_ACTIONS, MAX_ID_LEN, MAX_LIST_LIMIT, MAX_RESOURCE_LEN,
};
pub use quotas::{
    QuotaDefinition, QuotaList, QuotaShareView, QuotaTenantView, QuotaView, SetQuotaRequest,
    MAX_QUOTA_BURST, MAX_QUOTA_LEASE_MS, MAX_QUOTA_NAME_LEN, MAX_QUOTA_RATE_PER_S,
    MIN_QUOTA_LEASE_MS,
};
pub use tenant::{
    api_key_id, scoped_name, split_scoped, validate_stored_name, validate_tenant, CreateKeyRequest,
    CreatedKey, KeyInfo, KeyList, KeyRole, RevokeKeyResponse, API_KEY_PREFIX, DEFAULT_TENANT,
    TENANT_SEPARATOR,
};
