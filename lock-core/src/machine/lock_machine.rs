//! The lock state machine: pure, synchronous, deterministic.
//!
//! `apply(proposal, term)` is the only way state changes. It never reads a clock, a random
//! source or node configuration: time, lease ids and policy limits come stamped in the
//! proposal by the leader that proposed it (STYLE.md §1–2). Every replica applying the same
//! log therefore reaches the same state and emits the same effects.
//!
//! Time. `now_ms` is *log time*: the maximum stamp applied so far, so it never goes
//! backwards even if leaders' clocks disagree. A lease is valid while `now_ms <
//! expires_at_ms`. Expiry is lazy (any command touching a resource settles it first) and also
//! swept by `Tick` commands the leader proposes when something is due.
//!
//! Failover (SPEC §3.7). The first stamped command of a new term shifts every live lease's
//! expiry by the time that passed between the previous leader's last stamp and the new
//! leader's first one (never negative) plus the stamped grace. A lease therefore keeps its
//! remaining time as of the last committed stamp, the election is not charged to it, and clock
//! offset between the two leaders cancels out. Never a reset to full TTL, never shorter.

use std::collections::VecDeque;

// Persistent (structurally shared) collections: cloning the whole machine is O(1), so a
// snapshot copies it under the lock in constant time and serialises outside the lock.
use imbl::{HashMap, OrdMap, OrdSet};

use serde::{Deserialize, Serialize};

use crate::wire::{LockStats, LockView};

use super::types::{
    Acquire, AdmitOutcome, Command, Effect, Grant, LeaseId, Proposal, Response, WaiterGone,
};

/// A granted lease as stored in the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub lease_id: LeaseId,
    pub fencing_token: u64,
    pub holder: Option<String>,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
    pub granted_at_ms: u64,
}

/// An acquire waiting in a resource's FIFO queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    pub request_id: String,
    pub holder: Option<String>,
    pub ttl_ms: u64,
    pub deadline_ms: u64,
    pub lease_id: LeaseId,
    pub retain_ms: u64,
}

/// Per-resource record. Kept while held or waited on, then for `retain_ms` after it went
/// idle so that reads (and the fencing proxy) still see its last token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceState {
    pub lease: Option<Lease>,
    pub waiters: VecDeque<Waiter>,
    /// Highest fencing token ever issued for this resource.
    pub last_token: u64,
    /// Highest token a fencing proxy was admitted to forward writes with.
    #[serde(default)]
    pub admitted: u64,
    /// Live proxy admission grants for the current token (see `Command::Admit`).
    #[serde(default)]
    pub grants: Vec<FenceGrant>,
    /// Set when the lease ended while proxy grants were live: no new token is issued for the
    /// resource before this time, so writes already admitted under the old token have
    /// completed or timed out before a newer token can exist (the epoch barrier).
    #[serde(default)]
    pub reissue_at_ms: Option<u64>,
    /// When the record became idle (no lease, no waiters) and when it may be dropped.
    pub idle_until_ms: Option<u64>,
}

/// A proxy's permission to forward writes with `fencing_token` until `until_ms` (log time).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceGrant {
    pub proxy: u64,
    pub fencing_token: u64,
    pub until_ms: u64,
}

/// What a retried acquire with the same `request_id` gets back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DedupState {
    Granted(Grant),
    Waiting,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    pub state: DedupState,
    pub expires_at_ms: u64,
}

type DedupKey = (String, String);

/// The replicated lock state.
#[derive(Clone, Debug, Default)]
pub struct LockMachine {
    now_ms: u64,
    /// Term of the last applied stamped command; a larger one triggers the failover shift.
    term: u64,
    /// The global fencing-token counter (SPEC §3.2). Only ever incremented.
    last_token: u64,
    resources: OrdMap<String, ResourceState>,
    dedup: HashMap<DedupKey, DedupRecord>,
    /// Highest token of any resource record dropped as idle: a token at or below it for a
    /// resource without a record is stale, above it was never issued for that resource.
    gc_floor: u64,

    // Indexes, derived from the above and rebuilt on restore. Kept in step by the helpers
    // below; `check_indexes` verifies them in tests.
    lease_expiry: OrdSet<(u64, String)>,
    waiter_deadlines: OrdSet<(u64, String, String)>,
    dedup_expiry: OrdSet<(u64, String, String)>,
    idle_expiry: OrdSet<(u64, String)>,
    reissue_index: OrdSet<(u64, String)>,
    total_waiters: u64,
}

/// The persistent part of the machine, as written into snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineImage {
    pub now_ms: u64,
    pub term: u64,
    pub last_token: u64,
    #[serde(default)]
    pub gc_floor: u64,
    pub resources: Vec<(String, ResourceState)>,
    pub dedup: Vec<(String, String, DedupRecord)>,
}

impl LockMachine {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one stamped command committed in `term`. Returns the proposer's response and
    /// the effects every replica should act on.
    pub fn apply(&mut self, proposal: &Proposal, term: u64) -> (Response, Vec<Effect>) {
        self.observe(proposal.now_ms, proposal.failover_grace_ms, term);
        let mut fx = Vec::new();
        let resp = match &proposal.cmd {
            Command::Acquire(a) => self.acquire(a, &mut fx),
            Command::Renew { resource, lease_id } => self.renew(resource, *lease_id, &mut fx),
            Command::Release { resource, lease_id } => self.release(resource, *lease_id, &mut fx),
            Command::Cancel {
                resource,
                request_id,
            } => self.cancel(resource, request_id, &mut fx),
            Command::Admit {
                resource,
                fencing_token,
                proxy,
                grant_ms,
            } => self.admit(resource, *fencing_token, *proxy, *grant_ms, &mut fx),
            Command::Tick { max_items } => self.tick(*max_items, &mut fx),
        };
        (resp, fx)
    }

    /// Advances log time and applies the failover shift on a term change.
    fn observe(&mut self, stamp_ms: u64, grace_ms: u64, term: u64) {
        let prev = self.now_ms;
        let now = stamp_ms.max(prev);
        if term > self.term {
            // Skip the shift on the very first command ever (term 0 -> n): nothing to honour.
            if self.term != 0 || prev != 0 {
                self.shift_live_deadlines(prev, (now - prev).saturating_add(grace_ms));
            }
            self.term = term;
        }
        self.now_ms = now;
    }

    /// Moves every deadline still in the future (as of `prev`) later by `by` ms.
    fn shift_live_deadlines(&mut self, prev: u64, by: u64) {
        if by == 0 {
            return;
        }
        for (res, exp) in shift_index(&mut self.lease_expiry, prev, by) {
            if let Some(lease) = self.resources.get_mut(&res).and_then(|r| r.lease.as_mut()) {
                lease.expires_at_ms = exp;
            }
        }
        // Touch only records with live grants: a write to a persistent map copies its path.
        let granted: Vec<String> = self
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
        let waiting: Vec<(u64, String, String)> = self
            .waiter_deadlines
            .range((prev.saturating_add(1), String::new(), String::new())..)
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

    fn acquire(&mut self, a: &Acquire, fx: &mut Vec<Effect>) -> Response {
        self.settle(&a.resource, fx);
        let key = (a.resource.clone(), a.request_id.clone());
        // A retry of an acquire we already answered returns the original result (SPEC §3.6).
        if let Some(rec) = self.dedup.get(&key) {
            return match &rec.state {
                DedupState::Granted(g) => Response::Granted(self.current_view_of(g)),
                DedupState::Waiting => Response::Queued {
                    position: self.queue_position(&a.resource, &a.request_id),
                },
            };
        }
        let now = self.now_ms;
        let res = self.resources.entry(a.resource.clone()).or_default();
        if res.lease.is_none() && res.reissue_at_ms.is_none() {
            debug_assert!(res.waiters.is_empty(), "settled free resource has waiters");
            let grant = self.grant(&a.resource, a.lease_id, a.holder.clone(), a.ttl_ms);
            self.remember(&key, DedupState::Granted(grant.clone()), a.retain_ms);
            return Response::Granted(grant);
        }
        let busy_until = res
            .lease
            .as_ref()
            .map(|l| l.expires_at_ms)
            .or(res.reissue_at_ms)
            .unwrap_or(now);
        if a.wait_timeout_ms == 0 {
            return Response::Held {
                retry_after_ms: busy_until.saturating_sub(now),
            };
        }
        if res.waiters.len() >= a.max_waiters as usize
            || self.total_waiters >= u64::from(a.max_total_waiters)
        {
            return Response::TooManyWaiters;
        }
        let deadline = now.saturating_add(a.wait_timeout_ms);
        res.waiters.push_back(Waiter {
            request_id: a.request_id.clone(),
            holder: a.holder.clone(),
            ttl_ms: a.ttl_ms,
            deadline_ms: deadline,
            lease_id: a.lease_id,
            retain_ms: a.retain_ms,
        });
        let position = res.waiters.len() as u32;
        self.total_waiters += 1;
        self.waiter_deadlines
            .insert((deadline, a.resource.clone(), a.request_id.clone()));
        self.remember(&key, DedupState::Waiting, a.retain_ms);
        Response::Queued { position }
    }

    fn renew(&mut self, resource: &str, lease_id: LeaseId, fx: &mut Vec<Effect>) -> Response {
        self.settle(resource, fx);
        let now = self.now_ms;
        let Some(res) = self.resources.get_mut(resource) else {
            return Response::LeaseLost;
        };
        match res.lease.as_mut() {
            Some(l) if l.lease_id == lease_id => {
                let old = l.expires_at_ms;
                // Never shorten: a renewal extends from now, but a lease that a failover shift
                // pushed further out keeps the later deadline.
                l.expires_at_ms = old.max(now.saturating_add(l.ttl_ms));
                let grant = Grant {
                    resource: resource.to_string(),
                    lease_id,
                    fencing_token: l.fencing_token,
                    ttl_ms: l.ttl_ms,
                    expires_at_ms: l.expires_at_ms,
                };
                self.lease_expiry.remove(&(old, resource.to_string()));
                self.lease_expiry
                    .insert((grant.expires_at_ms, resource.to_string()));
                Response::Renewed(grant)
            }
            _ => Response::LeaseLost,
        }
    }

    fn release(&mut self, resource: &str, lease_id: LeaseId, fx: &mut Vec<Effect>) -> Response {
        self.settle(resource, fx);
        let held_by_caller = self
            .resources
            .get(resource)
            .and_then(|r| r.lease.as_ref())
            .is_some_and(|l| l.lease_id == lease_id);
        if !held_by_caller {
            // Idempotent, and a stale release never touches the new holder (SPEC §3.4).
            return Response::Released(false);
        }
        self.free(resource, fx);
        Response::Released(true)
    }

    fn cancel(&mut self, resource: &str, request_id: &str, fx: &mut Vec<Effect>) -> Response {
        self.settle(resource, fx);
        let key = (resource.to_string(), request_id.to_string());
        let Some(rec) = self.dedup.get(&key) else {
            return Response::Cancelled(false);
        };
        match rec.state.clone() {
            DedupState::Waiting => {
                self.remove_waiter(resource, request_id);
                self.forget(&key);
                fx.push(Effect::WaiterRemoved {
                    resource: resource.to_string(),
                    request_id: request_id.to_string(),
                    reason: WaiterGone::Cancelled,
                });
                self.mark_idle_if_unused(resource);
                Response::Cancelled(true)
            }
            // Already granted: only the lease id may end a lease (SPEC §3.4), and a request id
            // is no secret. A node cancelling an abandoned long-poll follows up with a release
            // carrying the lease id it proposed for that waiter.
            DedupState::Granted(_) => Response::Cancelled(false),
        }
    }

    fn tick(&mut self, max_items: u32, fx: &mut Vec<Effect>) -> Response {
        let now = self.now_ms;
        let mut budget = max_items as usize;
        let mut expired = 0u32;
        let mut handed_off = 0u32;
        // Leases first: they gate other clients.
        while budget > 0 {
            let Some((exp, res)) = self.lease_expiry.get_min().cloned() else {
                break;
            };
            if exp > now {
                break;
            }
            budget -= 1;
            expired += 1;
            let before = fx.len();
            self.settle(&res, fx);
            handed_off += fx[before..]
                .iter()
                .filter(|e| matches!(e, Effect::HandedOff { .. }))
                .count() as u32;
        }
        while budget > 0 {
            let Some((at, res)) = self.reissue_index.get_min().cloned() else {
                break;
            };
            if at > now {
                break;
            }
            budget -= 1;
            let before = fx.len();
            self.settle(&res, fx);
            handed_off += fx[before..]
                .iter()
                .filter(|e| matches!(e, Effect::HandedOff { .. }))
                .count() as u32;
        }
        while budget > 0 {
            let Some((deadline, res, rid)) = self.waiter_deadlines.get_min().cloned() else {
                break;
            };
            if deadline > now {
                break;
            }
            budget -= 1;
            self.remove_waiter(&res, &rid);
            self.forget(&(res.clone(), rid.clone()));
            fx.push(Effect::WaiterRemoved {
                resource: res.clone(),
                request_id: rid,
                reason: WaiterGone::TimedOut,
            });
            self.mark_idle_if_unused(&res);
        }
        while budget > 0 {
            let Some((exp, res, rid)) = self.dedup_expiry.get_min().cloned() else {
                break;
            };
            if exp > now {
                break;
            }
            budget -= 1;
            let key = (res, rid);
            self.forget(&key);
        }
        while budget > 0 {
            let Some((until, res)) = self.idle_expiry.get_min().cloned() else {
                break;
            };
            if until > now {
                break;
            }
            budget -= 1;
            self.idle_expiry.remove(&(until, res.clone()));
            // The global counter keeps every token ever issued below `last_token`, so dropping
            // the record loses no monotonicity (SPEC §3.2).
            if let Some(gone) = self.resources.remove(&res) {
                self.gc_floor = self.gc_floor.max(gone.last_token).max(gone.admitted);
            }
        }
        Response::Ticked {
            expired,
            handed_off,
        }
    }

    /// Expires the resource's lease if its time is up and hands the lock to the next live
    /// waiter. Called before any command looks at a resource.
    fn settle(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        let now = self.now_ms;
        let Some(res) = self.resources.get_mut(resource) else {
            return;
        };
        match (&res.lease, res.reissue_at_ms) {
            (Some(lease), _) if lease.expires_at_ms <= now => {
                fx.push(Effect::Expired {
                    resource: resource.to_string(),
                    fencing_token: lease.fencing_token,
                });
                self.free(resource, fx);
            }
            (None, Some(at)) if at <= now => {
                res.reissue_at_ms = None;
                self.reissue_index.remove(&(at, resource.to_string()));
                self.hand_off(resource, fx);
            }
            _ => {}
        }
    }

    /// Ends the current lease and passes the lock on: to the next waiter now, or — if proxy
    /// grants for the ended token are still live — once they have run out.
    fn free(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        self.end_lease(resource);
        let now = self.now_ms;
        let hold = self.resources.get_mut(resource).and_then(|r| {
            r.grants.retain(|g| g.until_ms > now);
            r.grants.iter().map(|g| g.until_ms).max()
        });
        if let Some(until) = hold {
            if let Some(r) = self.resources.get_mut(resource) {
                r.reissue_at_ms = Some(until);
            }
            self.reissue_index.insert((until, resource.to_string()));
            return;
        }
        self.hand_off(resource, fx);
    }

    fn admit(
        &mut self,
        resource: &str,
        token: u64,
        proxy: u64,
        grant_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> Response {
        self.settle(resource, fx);
        let now = self.now_ms;
        let Some(res) = self.resources.get_mut(resource) else {
            return Response::Admit(if token <= self.gc_floor {
                AdmitOutcome::Stale {
                    highest: self.gc_floor,
                }
            } else {
                AdmitOutcome::Unknown
            });
        };
        let highest = res.last_token.max(res.admitted);
        if token < highest {
            return Response::Admit(AdmitOutcome::Stale { highest });
        }
        if token > res.last_token {
            return Response::Admit(AdmitOutcome::Unknown);
        }
        let Some(expires) = res
            .lease
            .as_ref()
            .filter(|l| l.fencing_token == token && l.expires_at_ms > now)
            .map(|l| l.expires_at_ms)
        else {
            return Response::Admit(AdmitOutcome::Ended);
        };
        // Capped at the lease's expiry, so an expiring lease never delays the next holder.
        let until = now.saturating_add(grant_ms).min(expires);
        res.grants.retain(|g| g.until_ms > now);
        match res
            .grants
            .iter_mut()
            .find(|g| g.proxy == proxy && g.fencing_token == token)
        {
            Some(g) => g.until_ms = g.until_ms.max(until),
            None => res.grants.push(FenceGrant {
                proxy,
                fencing_token: token,
                until_ms: until,
            }),
        }
        res.admitted = res.admitted.max(token);
        Response::Admit(AdmitOutcome::Admitted {
            grant_ms: until - now,
        })
    }

    fn end_lease(&mut self, resource: &str) {
        if let Some(res) = self.resources.get_mut(resource) {
            if let Some(l) = res.lease.take() {
                self.lease_expiry
                    .remove(&(l.expires_at_ms, resource.to_string()));
            }
        }
    }

    /// Grants the free lock to the head of the queue, skipping waiters whose wait already
    /// timed out. Exactly one waiter is woken (no thundering herd).
    fn hand_off(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        let now = self.now_ms;
        loop {
            let Some(res) = self.resources.get_mut(resource) else {
                return;
            };
            debug_assert!(res.lease.is_none());
            let Some(w) = res.waiters.pop_front() else {
                self.mark_idle_if_unused(resource);
                return;
            };
            self.total_waiters -= 1;
            self.waiter_deadlines.remove(&(
                w.deadline_ms,
                resource.to_string(),
                w.request_id.clone(),
            ));
            let key = (resource.to_string(), w.request_id.clone());
            if w.deadline_ms <= now {
                self.forget(&key);
                fx.push(Effect::WaiterRemoved {
                    resource: resource.to_string(),
                    request_id: w.request_id,
                    reason: WaiterGone::TimedOut,
                });
                continue;
            }
            let grant = self.grant(resource, w.lease_id, w.holder, w.ttl_ms);
            self.remember(&key, DedupState::Granted(grant.clone()), w.retain_ms);
            fx.push(Effect::HandedOff {
                request_id: w.request_id,
                grant,
            });
            return;
        }
    }

    /// Issues a new lease with the next global fencing token on a free resource.
    fn grant(
        &mut self,
        resource: &str,
        lease_id: LeaseId,
        holder: Option<String>,
        ttl_ms: u64,
    ) -> Grant {
        let now = self.now_ms;
        self.last_token += 1;
        let token = self.last_token;
        let expires = now.saturating_add(ttl_ms);
        let res = self.resources.entry(resource.to_string()).or_default();
        res.lease = Some(Lease {
            lease_id,
            fencing_token: token,
            holder,
            ttl_ms,
            expires_at_ms: expires,
            granted_at_ms: now,
        });
        res.last_token = token;
        if let Some(until) = res.idle_until_ms.take() {
            self.idle_expiry.remove(&(until, resource.to_string()));
        }
        self.lease_expiry.insert((expires, resource.to_string()));
        Grant {
            resource: resource.to_string(),
            lease_id,
            fencing_token: token,
            ttl_ms,
            expires_at_ms: expires,
        }
    }

    /// A remembered grant, with the current expiry if that lease is still the live one.
    fn current_view_of(&self, g: &Grant) -> Grant {
        let mut g = g.clone();
        if let Some(l) = self
            .resources
            .get(&g.resource)
            .and_then(|r| r.lease.as_ref())
            .filter(|l| l.lease_id == g.lease_id)
        {
            g.expires_at_ms = l.expires_at_ms;
        }
        g
    }

    fn queue_position(&self, resource: &str, request_id: &str) -> u32 {
        self.resources
            .get(resource)
            .and_then(|r| r.waiters.iter().position(|w| w.request_id == request_id))
            .map_or(0, |p| p as u32 + 1)
    }

    fn remove_waiter(&mut self, resource: &str, request_id: &str) {
        let Some(res) = self.resources.get_mut(resource) else {
            return;
        };
        if let Some(pos) = res.waiters.iter().position(|w| w.request_id == request_id) {
            if let Some(w) = res.waiters.remove(pos) {
                self.total_waiters -= 1;
                self.waiter_deadlines
                    .remove(&(w.deadline_ms, resource.to_string(), w.request_id));
            }
        }
    }

    fn mark_idle_if_unused(&mut self, resource: &str) {
        let Some(res) = self.resources.get_mut(resource) else {
            return;
        };
        if res.lease.is_some()
            || !res.waiters.is_empty()
            || res.idle_until_ms.is_some()
            || res.reissue_at_ms.is_some()
        {
            return;
        }
        // Idle records are kept as long as retries may still refer to them.
        let until = self.now_ms.saturating_add(DEFAULT_IDLE_RETAIN_MS);
        res.idle_until_ms = Some(until);
        self.idle_expiry.insert((until, resource.to_string()));
    }

    /// Records the outcome of an acquire for retries. A waiting acquire's record has no expiry
    /// (it lives exactly as long as the waiter); a granted one lives for `retain_ms`.
    fn remember(&mut self, key: &DedupKey, state: DedupState, retain_ms: u64) {
        let expires = match state {
            DedupState::Waiting => u64::MAX,
            DedupState::Granted(_) => self.now_ms.saturating_add(retain_ms),
        };
        if let Some(old) = self.dedup.insert(
            key.clone(),
            DedupRecord {
                state,
                expires_at_ms: expires,
            },
        ) {
            self.dedup_expiry
                .remove(&(old.expires_at_ms, key.0.clone(), key.1.clone()));
        }
        if expires != u64::MAX {
            self.dedup_expiry
                .insert((expires, key.0.clone(), key.1.clone()));
        }
    }

    fn forget(&mut self, key: &DedupKey) {
        if let Some(old) = self.dedup.remove(key) {
            self.dedup_expiry
                .remove(&(old.expires_at_ms, key.0.clone(), key.1.clone()));
        }
    }

    // ---- reads -------------------------------------------------------------------------

    /// Log time: the latest stamp applied.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    pub fn last_token(&self) -> u64 {
        self.last_token
    }

    /// The resource as a reader should see it at log time `now_ms` (a lease whose time is up
    /// but that no command has expired yet is shown as not held).
    pub fn view(&self, resource: &str, now_ms: u64) -> LockView {
        let res = self.resources.get(resource);
        let live = res
            .and_then(|r| r.lease.as_ref())
            .filter(|l| l.expires_at_ms > now_ms.max(self.now_ms));
        LockView {
            resource: resource.to_string(),
            held: live.is_some(),
            holder: live.and_then(|l| l.holder.clone()),
            fencing_token: res.map(|r| r.last_token).filter(|t| *t > 0),
            expires_at_ms: live.map(|l| l.expires_at_ms),
            waiters: res.map_or(0, |r| r.waiters.len() as u32),
        }
    }

    /// Resources whose name starts with `prefix`, in name order, that are held or waited on.
    pub fn list(&self, prefix: &str, limit: usize, now_ms: u64) -> Vec<LockView> {
        self.resources
            .range(prefix.to_string()..)
            .take_while(|(name, _)| name.starts_with(prefix))
            .filter(|(_, r)| {
                let live = r
                    .lease
                    .as_ref()
                    .is_some_and(|l| l.expires_at_ms > now_ms.max(self.now_ms));
                live || !r.waiters.is_empty()
            })
            .take(limit)
            .map(|(name, _)| self.view(name, now_ms))
            .collect()
    }

    /// The lease currently recorded for a resource (expired or not), for tests and checks.
    pub fn lease(&self, resource: &str) -> Option<&Lease> {
        self.resources.get(resource)?.lease.as_ref()
    }

    pub fn resource(&self, resource: &str) -> Option<&ResourceState> {
        self.resources.get(resource)
    }

    /// The earliest moment at which a `Tick` would change something, if any.
    pub fn next_deadline(&self) -> Option<u64> {
        [
            self.lease_expiry.get_min().map(|(t, _)| *t),
            self.waiter_deadlines.get_min().map(|(t, _, _)| *t),
            self.dedup_expiry.get_min().map(|(t, _, _)| *t),
            self.idle_expiry.get_min().map(|(t, _)| *t),
            self.reissue_index.get_min().map(|(t, _)| *t),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether any lease is recorded (the sweeper then keeps log time fresh).
    pub fn has_leases(&self) -> bool {
        !self.lease_expiry.is_empty()
    }

    pub fn stats(&self) -> LockStats {
        LockStats {
            now_ms: self.now_ms,
            term: self.term,
            last_token: self.last_token,
            resources: self.resources.len() as u64,
            active_locks: self.lease_expiry.len() as u64,
            waiters: self.total_waiters,
            dedup_records: self.dedup.len() as u64,
        }
    }

    // ---- snapshots ---------------------------------------------------------------------

    pub fn image(&self) -> MachineImage {
        let mut dedup: Vec<_> = self
            .dedup
            .iter()
            .map(|((r, q), rec)| (r.clone(), q.clone(), rec.clone()))
            .collect();
        // HashMap order differs between replicas; snapshots should be byte-identical.
        dedup.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        MachineImage {
            now_ms: self.now_ms,
            term: self.term,
            last_token: self.last_token,
            gc_floor: self.gc_floor,
            resources: self
                .resources
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            dedup,
        }
    }

    pub fn from_image(image: MachineImage) -> Self {
        let mut m = LockMachine {
            now_ms: image.now_ms,
            term: image.term,
            last_token: image.last_token,
            gc_floor: image.gc_floor,
            ..Default::default()
        };
        for (name, res) in image.resources {
            if let Some(l) = &res.lease {
                m.lease_expiry.insert((l.expires_at_ms, name.clone()));
            }
            for w in &res.waiters {
                m.waiter_deadlines
                    .insert((w.deadline_ms, name.clone(), w.request_id.clone()));
            }
            m.total_waiters += res.waiters.len() as u64;
            if let Some(until) = res.idle_until_ms {
                m.idle_expiry.insert((until, name.clone()));
            }
            if let Some(at) = res.reissue_at_ms {
                m.reissue_index.insert((at, name.clone()));
            }
            m.resources.insert(name, res);
        }
        for (r, q, rec) in image.dedup {
            if rec.expires_at_ms != u64::MAX {
                m.dedup_expiry
                    .insert((rec.expires_at_ms, r.clone(), q.clone()));
            }
            m.dedup.insert((r, q), rec);
        }
        m
    }

    /// Verifies that the derived indexes agree with the primary state. For tests.
    pub fn check_indexes(&self) -> Result<(), String> {
        let rebuilt = LockMachine::from_image(self.image());
        if rebuilt.lease_expiry != self.lease_expiry {
            return Err("lease_expiry index out of step".into());
        }
        if rebuilt.waiter_deadlines != self.waiter_deadlines {
            return Err("waiter_deadlines index out of step".into());
        }
        if rebuilt.dedup_expiry != self.dedup_expiry {
            return Err("dedup_expiry index out of step".into());
        }
        if rebuilt.idle_expiry != self.idle_expiry {
            return Err("idle_expiry index out of step".into());
        }
        if rebuilt.reissue_index != self.reissue_index {
            return Err("reissue_index out of step".into());
        }
        if rebuilt.total_waiters != self.total_waiters {
            return Err("total_waiters out of step".into());
        }
        Ok(())
    }
}

/// Moves the deadlines in `index` still in the future at `prev` later by `by`, and returns each
/// moved resource with its new deadline (for updating the record the index points at).
fn shift_index(index: &mut OrdSet<(u64, String)>, prev: u64, by: u64) -> Vec<(String, u64)> {
    let live: Vec<(u64, String)> = index
        .range((prev.saturating_add(1), String::new())..)
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

/// How long an idle resource record is kept (it carries the resource's last token).
pub const DEFAULT_IDLE_RETAIN_MS: u64 = 10 * 60 * 1000;
