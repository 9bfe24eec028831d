//! Lease ids: 128 random bits, shown as 32 lowercase hex digits.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A lease identifier: 128 random bits chosen by the leader that proposed the grant.
///
/// It is a bearer capability (whoever knows it may renew or release), so it is never shown by
/// read APIs. On the wire it is 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct LeaseId(pub u128);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl LeaseId {
    /// A short digest for logs and the audit trail, where the id itself (a bearer
    /// capability) must not appear: 64 bits folded from the 128, enough to match lines that
    /// concern one lease.
    pub fn digest(&self) -> String {
        format!("{:016x}", (self.0 >> 64) as u64 ^ self.0 as u64)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only a prefix: debug output ends up in logs, and the id is a capability.
        write!(f, "LeaseId({:08x}…)", (self.0 >> 96) as u32)
    }
}

impl From<LeaseId> for String {
    fn from(id: LeaseId) -> String {
        id.to_string()
    }
}

impl TryFrom<String> for LeaseId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl std::str::FromStr for LeaseId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("lease_id must be 32 hex digits".to_string());
        }
        u128::from_str_radix(s, 16)
            .map(LeaseId)
            .map_err(|e| e.to_string())
    }
}
