//! The closed loop's safety checks, as far as a client can see them: every grant's token and
//! lease id are new (etcd: its token only per resource) and tokens increase per resource (the
//! open loop's [`Ledger`]), and no two clients ever hold one resource at the same time.
//!
//! A client's hold is known to cover the span from the acquire's answer to the moment it
//! sends the release: the server granted before it answered and cannot have released before
//! it was asked. Each resource has one slot holding the token of the client inside that span.
//! A grant that finds the slot taken overlaps a hold that surely still runs: two holders. The
//! slot is freed *before* the release goes out, so a slow release answer never makes the next
//! holder look like a second one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::backend::Grant;
use crate::ledger::{Ledger, LedgerReport};

/// No client holds the resource (tokens start above 0 on both systems).
const FREE: u64 = 0;
const MAX_EXAMPLES: usize = 10;

pub struct Check {
    ledger: Ledger,
    holders: Vec<AtomicU64>,
    overlaps: AtomicU64,
    examples: Mutex<Vec<String>>,
}

/// What the checks found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CheckReport {
    /// Tokens and lease ids: duplicates, tokens not increasing per resource, lost leases.
    pub invariants: LedgerReport,
    /// Grants answered while another client's hold on the resource surely still ran.
    pub overlapping_holders: u64,
    pub overlap_examples: Vec<String>,
}

impl CheckReport {
    pub fn violations(&self) -> u64 {
        self.invariants.violations_total() + self.overlapping_holders
    }
}

impl Check {
    /// `unique_tokens`: the system promises a token no other grant had, on any resource
    /// (fencegate); etcd's stand-in token only increases per resource.
    pub fn new(resources: u32, unique_tokens: bool) -> Self {
        Check {
            ledger: if unique_tokens {
                Ledger::default()
            } else {
                Ledger::per_resource_tokens()
            },
            holders: (0..resources).map(|_| AtomicU64::new(FREE)).collect(),
            overlaps: AtomicU64::new(0),
            examples: Mutex::new(Vec::new()),
        }
    }

    /// The acquire of `resource` was answered with `grant`. Every acquire waits its turn
    /// (the harness never has two acquires racing for one resource without queueing), so
    /// answers arrive in grant order and tokens must increase.
    pub fn granted(&self, resource: u32, grant: &Grant) {
        self.ledger
            .grant(resource, grant.lease_num(), grant.token, true);
        let slot = &self.holders[resource as usize];
        if let Err(other) =
            slot.compare_exchange(FREE, grant.token, Ordering::AcqRel, Ordering::Acquire)
        {
            self.overlaps.fetch_add(1, Ordering::Relaxed);
            let mut ex = self.examples.lock().unwrap_or_else(|e| e.into_inner());
            if ex.len() < MAX_EXAMPLES {
                ex.push(format!(
                    "resource {resource}: token {} granted while the holder of token {other} had not released",
                    grant.token
                ));
            }
        }
    }

    /// The holder of `grant` is about to send its release.
    pub fn releasing(&self, resource: u32, grant: &Grant) {
        // Fails only when the grant overlapped another hold (already counted): that slot
        // belongs to the other holder.
        let _ = self.holders[resource as usize].compare_exchange(
            grant.token,
            FREE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// The server said a lease is gone although its client renewed it `left_ms` before the
    /// TTL ran out.
    pub fn lost(&self, resource: u32, grant: &Grant, left_ms: Option<u64>) {
        self.ledger.lease_gone(resource, grant.token, left_ms, &[]);
    }

    pub fn report(&self) -> CheckReport {
        CheckReport {
            invariants: self.ledger.report(),
            overlapping_holders: self.overlaps.load(Ordering::Relaxed),
            overlap_examples: self
                .examples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Lease;
    use lock_core::wire::LeaseId;

    fn grant(lease: u128, token: u64) -> Grant {
        Grant {
            lease: Lease::Fencegate(LeaseId(lease)),
            token,
        }
    }

    #[test]
    fn holds_in_turn_are_clean() {
        let c = Check::new(4, true);
        let a = grant(1, 10);
        c.granted(2, &a);
        c.releasing(2, &a);
        let b = grant(2, 11);
        c.granted(2, &b);
        c.granted(3, &grant(3, 12));
        c.releasing(2, &b);
        let r = c.report();
        assert_eq!(r.violations(), 0, "{r:?}");
    }

    #[test]
    fn a_grant_inside_another_hold_is_two_holders() {
        let c = Check::new(4, true);
        let a = grant(1, 10);
        c.granted(1, &a);
        let b = grant(2, 11);
        c.granted(1, &b);
        // The second holder's release must not free the first one's slot.
        c.releasing(1, &b);
        c.granted(1, &grant(3, 12));
        let r = c.report();
        assert_eq!(r.overlapping_holders, 2, "{r:?}");
        assert_eq!(r.overlap_examples.len(), 2);
    }

    #[test]
    fn a_token_going_backwards_on_a_resource_is_caught() {
        let c = Check::new(4, true);
        let a = grant(1, 10);
        c.granted(0, &a);
        c.releasing(0, &a);
        c.granted(0, &grant(2, 9));
        let r = c.report();
        assert_eq!(r.invariants.non_monotonic_tokens, 1, "{r:?}");
        assert_eq!(r.violations(), 1);
    }
}
