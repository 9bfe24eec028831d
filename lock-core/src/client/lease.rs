//! A lease as the server describes it: plain data, no renewal.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A granted lease as the server reported it. This is what the `fencegate lock` CLI prints
/// and what [`LeaseGuard::detach`](super::LeaseGuard::detach) hands back.
///
/// `lease_id` is a bearer capability: whoever knows it can renew and release the lease. Do
/// not log it or send it anywhere but to the lock service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Lease {
    #[serde(default)]
    pub resource: String,
    pub lease_id: String,
    pub fencing_token: u64,
    pub ttl_ms: u64,
    /// When the lease expires on the leader's wall clock (Unix ms). Informational only: the
    /// client never judges validity by it (see `docs/client.md`).
    pub expires_at_ms: u64,
}

impl Lease {
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}
