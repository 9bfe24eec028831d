//! The client-side safety checker: every lease the harness was granted, checked against the
//! service's safety promises as far as a client can see them.
//!
//! - fencing tokens: every grant carries a token no other grant had (duplicates are
//!   reported), and the tokens of successive grants on one resource increase;
//! - lease ids are unique per grant;
//! - a *lost lease*: the server says a lease is gone (`lease_lost` on renew, `released: false`
//!   on release) although, by the client's conservative clock (the send time of the last
//!   successful acquire/renew plus the TTL), it was still valid. That is a committed lease
//!   the service forgot: a leader change must never shorten a lease.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use serde::Serialize;

#[derive(Default, Clone, Debug, Serialize)]
pub struct LedgerReport {
    pub grants: u64,
    pub duplicate_tokens: u64,
    pub duplicate_leases: u64,
    pub non_monotonic_tokens: u64,
    pub lost_leases: u64,
    /// Leases the server reported gone after our own deadline had passed (late renewals,
    /// e.g. while no quorum): expected under faults, not a violation.
    pub expired_leases: u64,
    /// Releases answered `released: false` while the lease was still valid by the client's
    /// clock. Not judged: a release retried after a lost answer (by the client, or by a
    /// follower re-forwarding to a new leader) gets this answer although it did release.
    pub releases_not_current: u64,
    /// The first few of those, with the lease's history.
    pub releases_not_current_examples: Vec<String>,
    pub max_token: u64,
    /// `lock_held` on a resource that, as far as the harness knows, nobody held (not a
    /// safety violation; a liveness anomaly worth a look).
    pub unexpected_lock_held: u64,
    /// The first violations and anomalies, for the report.
    pub violations: Vec<String>,
}

impl LedgerReport {
    pub fn violations_total(&self) -> u64 {
        self.duplicate_tokens + self.duplicate_leases + self.non_monotonic_tokens + self.lost_leases
    }
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<u64, u32>,
    leases: HashSet<u128>,
    last_token: HashMap<u32, u64>,
    report: LedgerReport,
}

#[derive(Default)]
pub struct Ledger {
    inner: Mutex<Inner>,
    /// Tokens are compared per resource only, not across resources (see
    /// [`Ledger::per_resource_tokens`]).
    per_resource_only: bool,
}

const MAX_VIOLATIONS_KEPT: usize = 50;

impl Ledger {
    /// A ledger for tokens that are unique per resource but may repeat across resources:
    /// etcd's lock answers with the store revision at which its wait for the key ended, and a
    /// write to another key may carry that same revision.
    pub fn per_resource_tokens() -> Self {
        Ledger {
            per_resource_only: true,
            ..Ledger::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a grant. `sequential` says the harness never had two acquires in flight on
    /// this resource, so response order is grant order and tokens must increase.
    pub fn grant(&self, resource: u32, lease: u128, token: u64, sequential: bool) {
        let mut g = self.lock();
        let g = &mut *g;
        g.report.grants += 1;
        g.report.max_token = g.report.max_token.max(token);
        let mut violation = None;
        if self.per_resource_only {
            // Checked below, against the resource's previous token.
        } else if let Some(prev) = g.tokens.insert(token, resource) {
            g.report.duplicate_tokens += 1;
            violation = Some(format!(
                "token {token} granted twice (resources {prev} and {resource})"
            ));
        }
        if !g.leases.insert(lease) {
            g.report.duplicate_leases += 1;
            violation = Some(format!("lease id {lease:032x} granted twice"));
        }
        if sequential {
            let last = g.last_token.entry(resource).or_insert(0);
            if token <= *last {
                g.report.non_monotonic_tokens += 1;
                violation = Some(format!(
                    "resource {resource}: token {token} after token {}",
                    *last
                ));
            }
            *last = (*last).max(token);
        }
        if let Some(v) = violation {
            if g.report.violations.len() < MAX_VIOLATIONS_KEPT {
                g.report.violations.push(v);
            }
        }
    }

    /// The server said the lease is gone. `still_valid` is the client's conservative view.
    pub fn lease_gone(
        &self,
        resource: u32,
        token: u64,
        still_valid_ms: Option<u64>,
        trail: &[String],
    ) {
        let mut g = self.lock();
        match still_valid_ms {
            Some(left) => {
                g.report.lost_leases += 1;
                if g.report.violations.len() < MAX_VIOLATIONS_KEPT {
                    g.report.violations.push(format!(
                        "resource {resource}: lease with token {token} reported gone with {left} ms left; history: {}",
                        trail.join(" | ")
                    ));
                }
            }
            None => g.report.expired_leases += 1,
        }
    }

    pub fn release_not_current(
        &self,
        resource: u32,
        token: u64,
        still_valid_ms: Option<u64>,
        trail: &[String],
    ) {
        let mut g = self.lock();
        match still_valid_ms {
            Some(left) => {
                g.report.releases_not_current += 1;
                if g.report.releases_not_current_examples.len() < 5 {
                    g.report.releases_not_current_examples.push(format!(
                        "resource {resource}: token {token}, {left} ms left; history: {}",
                        trail.join(" | ")
                    ));
                }
            }
            None => g.report.expired_leases += 1,
        }
    }

    pub fn unexpected_conflict(&self, resource: u32, code: &str) {
        let mut g = self.lock();
        g.report.unexpected_lock_held += 1;
        if g.report.violations.len() < MAX_VIOLATIONS_KEPT {
            g.report.violations.push(format!(
                "(anomaly) resource {resource}: {code} although the harness held no lease on it"
            ));
        }
    }

    pub fn report(&self) -> LedgerReport {
        self.lock().report.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_duplicates_and_regressions() {
        let l = Ledger::default();
        l.grant(1, 10, 5, true);
        l.grant(2, 11, 6, true);
        l.grant(1, 12, 7, true);
        assert_eq!(l.report().violations_total(), 0);
        l.grant(3, 13, 6, true); // token 6 again
        l.grant(1, 14, 4, true); // goes backwards on resource 1
        l.grant(4, 10, 9, true); // lease id 10 again
        let r = l.report();
        assert_eq!(r.duplicate_tokens, 1);
        assert_eq!(r.non_monotonic_tokens, 1);
        assert_eq!(r.duplicate_leases, 1);
        l.lease_gone(1, 7, Some(100), &[]);
        l.lease_gone(1, 7, None, &[]);
        let r = l.report();
        assert_eq!((r.lost_leases, r.expired_leases), (1, 1));
        assert_eq!(r.violations_total(), 4);
    }

    #[test]
    fn per_resource_tokens_may_repeat_across_resources_only() {
        let l = Ledger::per_resource_tokens();
        l.grant(1, 10, 5, true);
        l.grant(2, 11, 5, true); // another resource: allowed
        assert_eq!(l.report().violations_total(), 0);
        l.grant(1, 12, 5, true); // the same resource again: not increasing
        let r = l.report();
        assert_eq!((r.duplicate_tokens, r.non_monotonic_tokens), (0, 1));
    }
}
