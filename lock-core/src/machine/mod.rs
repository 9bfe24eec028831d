//! The pure lock state machine (no IO, no clock, no randomness). See [`LockMachine`].

mod dedup;
mod idempotency;
mod image;
mod indexes;
mod keys;
mod lock_machine;
mod name;
mod quota;
mod rare;
mod reads;
mod state;
mod types;

pub use dedup::DedupTable;
pub use idempotency::{
    Completion, Finding, IdemCommand, IdemOutcome, IdemRecord, IdemScope, IdemState,
    IdempotencyMachine, RecordWrite, StoredAnswer, StoredBody,
};
pub use image::SnapshotImage;
pub use keys::ApiKeyRecord;
pub use lock_machine::LockMachine;
pub use quota::{
    DemandReport, QuotaGrant, QuotaLease, QuotaLedger, QuotaOutcome, QuotaPolicy, QuotaRequest,
    QuotaSpec, MILLI,
};
pub use rare::Rare;
pub use state::{
    dedup_key, DedupEntry, DedupGrant, DedupKey, DedupRecord, DedupState, FenceGrant, Lease,
    MachineImage, ResourceState, RestoredDedup, RestoredImage, Waiter, DEFAULT_IDLE_RETAIN_MS,
};
pub use types::{
    Acquire, AdmitOutcome, Batch, Command, Effect, Grant, LeaseId, Proposal, Response,
    TenantLimitHit, TenantLimits, WaiterGone,
};
