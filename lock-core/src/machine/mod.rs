//! The pure lock state machine (no IO, no clock, no randomness). See [`LockMachine`].

mod lock_machine;
mod types;

pub use lock_machine::{
    DedupRecord, DedupState, FenceGrant, Lease, LockMachine, MachineImage, ResourceState, Waiter,
    DEFAULT_IDLE_RETAIN_MS,
};
pub use types::{
    Acquire, AdmitOutcome, Command, Effect, Grant, LeaseId, Proposal, Response, WaiterGone,
};
