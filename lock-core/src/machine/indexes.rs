//! Upkeep of the derived indexes (expiry orders, waiter deadlines, dedup expiry, idle
//! records): every change to the primary state goes through these helpers so the indexes stay
//! in step; `check_indexes` verifies them in tests.

use imbl::OrdSet;

use super::lock_machine::LockMachine;
use super::name::ResName;
use super::state::{DedupKey, DedupRecord, DedupState, DEFAULT_IDLE_RETAIN_MS};

impl LockMachine {
    /// Moves every deadline still in the future (as of `prev`) later by `by` ms.
    pub(super) fn shift_live_deadlines(&mut self, prev: u64, by: u64) {
        if by == 0 {
            return;
        }
        self.quotas.shift(prev, by);
        for (res, exp) in shift_index(&mut self.lease_expiry, prev, by) {
            if let Some(lease) = self.resources.get_mut(&res).and_then(|r| r.lease.as_mut()) {
                lease.expires_at_ms = exp;
            }
        }
        // Touch only records with live grants: a write to a persistent map copies its path.
        let granted: Vec<ResName> = self
            .resources
            .iter()
            .filter(|(_, r)| r.grants.iter().any(|g| g.until_ms > prev))
            .map(|(name, _)| name.clone())
            .collect();
        for name in granted {
            if let Some(res) = self.resources.get_mut(&name) {
                for g in res.grants.iter_mut().filter(|g| g.until_ms > prev) {
                    g.until_ms = g.until_ms.saturating_add(by);
                }
            }
        }
        for (res, at) in shift_index(&mut self.reissue_index, prev, by) {
            if let Some(r) = self.resources.get_mut(&res) {
                r.reissue_at_ms = Some(at);
            }
        }
        let waiting: Vec<(u64, ResName, String)> = self
            .waiter_deadlines
            .range((prev.saturating_add(1), ResName::new(""), String::new())..)
            .cloned()
            .collect();
        for (deadline, res, rid) in waiting {
            self.waiter_deadlines
                .remove(&(deadline, res.clone(), rid.clone()));
            self.waiter_deadlines
                .insert((deadline.saturating_add(by), res.clone(), rid.clone()));
            if let Some(w) = self
                .resources
                .get_mut(&res)
                .and_then(|r| r.waiters.iter_mut().find(|w| w.request_id == rid))
            {
                w.deadline_ms = deadline.saturating_add(by);
            }
        }
    }

    /// Moves every dedup record and idle resource record still kept at `prev` later by `by`
    /// ms. Only a forward jump of log time at a leader change calls for it (with stamps
    /// anchored to the log, a new leader's first stamp is the log time itself, so `by` is
    /// normally 0 and this costs nothing).
    pub(super) fn shift_retention(&mut self, prev: u64, by: u64) {
        if by == 0 {
            return;
        }
        self.dedup.shift(prev, by);
        for (res, until) in shift_index(&mut self.idle_expiry, prev, by) {
            if let Some(r) = self.resources.get_mut(&res) {
                r.idle_until_ms = Some(until);
            }
        }
    }

    pub(super) fn remove_waiter(&mut self, resource: &ResName, request_id: &str) {
        let Some(res) = self.resources.get_mut(resource) else {
            return;
        };
        if let Some(pos) = res.waiters.iter().position(|w| w.request_id == request_id) {
            if let Some(w) = res.waiters.remove(pos) {
                self.total_waiters -= 1;
                super::lock_machine::count_down(&mut self.tenant_waiters, resource);
                self.waiter_deadlines
                    .remove(&(w.deadline_ms, resource.clone(), w.request_id));
            }
        }
    }

    pub(super) fn mark_idle_if_unused(&mut self, resource: &ResName) {
        let until = self.now_ms.saturating_add(DEFAULT_IDLE_RETAIN_MS);
        let Some(res) = self.resources.get_mut(resource) else {
            return;
        };
        if res.mark_idle(until) {
            self.idle_expiry.insert((until, resource.clone()));
        }
    }

    /// Records the outcome of an acquire for retries. A waiting acquire's record has no expiry
    /// (it lives exactly as long as the waiter); a granted one lives for `retain_ms`.
    pub(super) fn remember(&mut self, key: DedupKey, state: DedupState, retain_ms: u64) {
        let record = self.dedup_record(state, retain_ms);
        self.dedup.insert(key, record);
    }

    /// [`remember`](Self::remember) for a key that has no record: a new acquire, which has
    /// just looked its key up.
    pub(super) fn remember_new(&mut self, key: DedupKey, state: DedupState, retain_ms: u64) {
        let record = self.dedup_record(state, retain_ms);
        self.dedup.insert_new(key, record);
    }

    fn dedup_record(&self, state: DedupState, retain_ms: u64) -> DedupRecord {
        let expires_at_ms = match state {
            DedupState::Waiting => u64::MAX,
            DedupState::Granted(_) => self.now_ms.saturating_add(retain_ms),
        };
        DedupRecord {
            state,
            expires_at_ms,
        }
    }

    pub(super) fn forget(&mut self, key: DedupKey) {
        self.dedup.remove(&key);
    }
}

/// Moves the deadlines in `index` still in the future at `prev` later by `by`, and returns each
/// moved resource with its new deadline (for updating the record the index points at).
fn shift_index(index: &mut OrdSet<(u64, ResName)>, prev: u64, by: u64) -> Vec<(ResName, u64)> {
    let live: Vec<(u64, ResName)> = index
        .range((prev.saturating_add(1), ResName::new(""))..)
        .cloned()
        .collect();
    live.into_iter()
        .map(|(at, res)| {
            index.remove(&(at, res.clone()));
            let moved = at.saturating_add(by);
            index.insert((moved, res.clone()));
            (res, moved)
        })
        .collect()
}
