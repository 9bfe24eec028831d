//! The lock state machine: pure, synchronous, deterministic.
//!
//! `apply(proposal, term)` is the only way state changes. It never reads a clock, a random
//! source or node configuration: time, lease ids and policy limits come stamped in the
//! proposal by the leader that proposed it. Every replica applying the same
//! log therefore reaches the same state and emits the same effects.
//!
//! Time. `now_ms` is *log time*: the maximum stamp applied so far, so it never goes
//! backwards even if leaders' clocks disagree. A lease is valid while `now_ms <
//! expires_at_ms`. Expiry is lazy (any command touching a resource settles it first) and also
//! swept by `Tick` commands the leader proposes when something is due.
//!
//! Failover. The first stamped command of a new term shifts every live lease's
//! expiry by the time that passed between the previous leader's last stamp and the new
//! leader's first one (never negative) plus the stamped grace. A lease therefore keeps its
//! remaining time as of the last committed stamp, the election is not charged to it, and clock
//! offset between the two leaders cancels out. Never a reset to full TTL, never shorter.
//! Dedup records and idle resource records are moved by the same jump (without the grace),
//! so a jump of log time at a leader change never eats into the retry window either.

// Persistent (structurally shared) collections: cloning the whole machine is O(1), so a
// snapshot copies it under the lock in constant time and serialises outside the lock.
use imbl::{HashMap, OrdMap, OrdSet};

use super::dedup::DedupTable;
use super::keys::ApiKeyRecord;
use super::name::ResName;
use super::quota::QuotaLedger;
use super::state::{
    dedup_key, DedupGrant, DedupState, FenceGrant, Lease, ResourceState, Waiter,
    DEFAULT_IDLE_RETAIN_MS,
};
use super::types::{
    Acquire, AdmitOutcome, Batch, Command, Effect, Grant, LeaseId, Proposal, Response,
    TenantLimitHit, WaiterGone,
};
use crate::wire::split_scoped;

/// The replicated lock state.
#[derive(Clone, Debug, Default)]
pub struct LockMachine {
    pub(super) now_ms: u64,
    /// Term of the last applied stamped command; a larger one triggers the failover shift.
    pub(super) term: u64,
    /// The global fencing-token counter: tokens are globally monotonic. Only ever incremented.
    pub(super) last_token: u64,
    /// Commands applied since the log began (a batch counts each of its commands): the same on
    /// every replica at the same index, so nodes can space their snapshots by it.
    pub(super) commands: u64,
    pub(super) resources: OrdMap<ResName, ResourceState>,
    pub(super) dedup: DedupTable,
    /// Highest token of any resource record dropped as idle: a token at or below it for a
    /// resource without a record is stale, above it was never issued for that resource.
    pub(super) gc_floor: u64,
    /// Global rate-limit quotas and the shares leased to proxies.
    pub(super) quotas: QuotaLedger,
    /// The API keys by id (digests only).
    pub(super) keys: OrdMap<String, ApiKeyRecord>,

    // Indexes, derived from the above and rebuilt on restore. Kept in step by the helpers
    // below; `check_indexes` verifies them in tests.
    pub(super) lease_expiry: OrdSet<(u64, ResName)>,
    pub(super) waiter_deadlines: OrdSet<(u64, ResName, String)>,
    pub(super) idle_expiry: OrdSet<(u64, ResName)>,
    pub(super) reissue_index: OrdSet<(u64, ResName)>,
    pub(super) total_waiters: u64,
    /// Leases and waiters per tenant (the namespace of the resource name), for the tenants'
    /// bounds. Tenants without any are absent.
    pub(super) tenant_leases: HashMap<String, u64>,
    pub(super) tenant_waiters: HashMap<String, u64>,
}

impl LockMachine {
    pub fn new() -> Self {
        Self::default()
    }

    /// A machine whose dedup table freezes `chunk_len` records at a time instead of the
    /// default, so that tests cross its chunk boundaries with a few records.
    #[doc(hidden)]
    pub fn with_dedup_chunk_len(chunk_len: usize) -> Self {
        LockMachine {
            dedup: DedupTable::with_chunk_len(chunk_len),
            ..Self::default()
        }
    }

    /// Applies one stamped command committed in `term`. Returns the proposer's response and
    /// the effects every replica should act on.
    pub fn apply(&mut self, proposal: &Proposal, term: u64) -> (Response, Vec<Effect>) {
        self.commands += 1;
        self.apply_command(
            proposal.now_ms,
            proposal.failover_grace_ms,
            &proposal.cmd,
            term,
        )
    }

    /// Applies a batch committed in `term`: its commands in order, each under the batch's
    /// stamp. Returns one response per command, in order, and all their effects.
    pub fn apply_batch(&mut self, batch: &Batch, term: u64) -> (Vec<Response>, Vec<Effect>) {
        let mut responses = Vec::with_capacity(batch.cmds.len() + 1);
        let mut effects = Vec::new();
        for cmd in batch.commands() {
            self.commands += 1;
            let (resp, fx) = self.apply_command(batch.now_ms, batch.failover_grace_ms, cmd, term);
            responses.push(resp);
            effects.extend(fx);
        }
        (responses, effects)
    }

    /// [`apply`](Self::apply), with the stamp and the command apart (a batch's commands share
    /// one stamp and are applied where they lie in the entry).
    fn apply_command(
        &mut self,
        now_ms: u64,
        grace_ms: u64,
        cmd: &Command,
        term: u64,
    ) -> (Response, Vec<Effect>) {
        self.observe(now_ms, grace_ms, term);
        let mut fx = Vec::new();
        let resp = match cmd {
            Command::Acquire(a) => self.acquire(a, &mut fx),
            Command::Renew { resource, lease_id } => {
                self.renew(&ResName::new(resource), *lease_id, &mut fx)
            }
            Command::Release { resource, lease_id } => {
                self.release(&ResName::new(resource), *lease_id, &mut fx)
            }
            Command::Cancel {
                resource,
                request_id,
            } => self.cancel(&ResName::new(resource), request_id, &mut fx),
            Command::Admit {
                resource,
                fencing_token,
                proxy,
                grant_ms,
            } => self.admit(
                &ResName::new(resource),
                *fencing_token,
                *proxy,
                *grant_ms,
                &mut fx,
            ),
            Command::ForceRelease { resource, .. } => {
                self.force_release(&ResName::new(resource), &mut fx)
            }
            Command::RevokeAck {
                resource,
                fencing_token,
                proxy,
            } => self.revoke_ack(&ResName::new(resource), *fencing_token, *proxy, &mut fx),
            Command::Tick { max_items } => self.tick(*max_items, &mut fx),
            // Idempotency records live on disk, not in this machine: the storage layer applies
            // the command; the stamp above still advances log time.
            Command::Idem(_) => Response::Noop,
            Command::QuotaDefine(spec) => {
                self.quotas.define(spec.clone());
                Response::QuotaDefined
            }
            Command::QuotaLease(req) => Response::Quota(self.quotas.request(req, self.now_ms)),
            Command::QuotaReturn { lease_ids } => {
                Response::QuotaReturned(self.quotas.give_back(lease_ids))
            }
            Command::QuotaSet(spec) => {
                self.quotas.set(spec.clone());
                Response::QuotaDefined
            }
            Command::KeyCreate(record) => self.create_key(record),
            Command::KeyRevoke { id } => self.revoke_key(id),
            Command::AsKey { key_id, cmd } => {
                if !self.keys.contains_key(key_id) {
                    Response::KeyRefused
                } else {
                    // The stamp was observed above; the inner call applies under it.
                    let (resp, inner_fx) = self.apply_command(now_ms, grace_ms, cmd, term);
                    fx.extend(inner_fx);
                    resp
                }
            }
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
                let jump = now - prev;
                self.shift_live_deadlines(prev, jump.saturating_add(grace_ms));
                // Retention is not charged with the jump either: a record kept for the retry
                // window keeps it in log time that actually elapsed within terms. No grace:
                // the election pause already runs in the record's favour.
                self.shift_retention(prev, jump);
            }
            self.term = term;
        }
        self.now_ms = now;
    }

    fn acquire(&mut self, a: &Acquire, fx: &mut Vec<Effect>) -> Response {
        let name = ResName::new(&a.resource);
        let settled = self.settle(&name, fx);
        let key = dedup_key(&a.resource, &a.request_id);
        // A retry of an acquire we already answered returns the original result.
        if let Some(rec) = self.dedup.get(&key) {
            return match &rec.state {
                DedupState::Granted(g) => {
                    Response::Granted(self.current_view_of(g.to_grant(&a.resource)))
                }
                DedupState::Waiting => Response::Queued {
                    position: self.queue_position(&name, &a.request_id),
                },
            };
        }
        let now = self.now_ms;
        let tenant = split_scoped(&a.resource).0;
        let free = settled.free;
        if let Some(limits) = a.tenant_limits {
            let (count, bound, hit) = if free {
                (
                    &self.tenant_leases,
                    limits.max_leases,
                    TenantLimitHit::Leases,
                )
            } else {
                (
                    &self.tenant_waiters,
                    limits.max_waiters,
                    TenantLimitHit::Waiters,
                )
            };
            // A try-once acquire of a busy resource adds no waiter: it is answered below.
            let adds = free || a.wait_timeout_ms > 0;
            if adds && count.get(tenant).copied().unwrap_or(0) >= u64::from(bound) {
                return Response::TenantLimit(hit);
            }
        }
        if free {
            debug_assert!(
                self.resources
                    .get(&name)
                    .is_none_or(|r| r.waiters.is_empty()),
                "settled free resource has waiters"
            );
            let grant = self.grant(&name, a.lease_id, a.holder.clone(), a.ttl_ms);
            self.remember_new(
                key,
                DedupState::Granted(DedupGrant::of(&grant)),
                a.retain_ms,
            );
            return Response::Granted(grant);
        }
        // Not free, so the record exists.
        let res = self.resources.entry(name.clone()).or_default();
        let busy_until = res
            .lease
            .as_ref()
            .map(|l| l.expires_at_ms)
            .or(res.reissue_at_ms)
            .unwrap_or(now);
        if a.wait_timeout_ms == 0 {
            let retry_after_ms = busy_until.saturating_sub(now);
            return if res.lease.is_none() {
                Response::Revoking { retry_after_ms }
            } else {
                Response::Held { retry_after_ms }
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
        count_up(&mut self.tenant_waiters, &a.resource);
        self.waiter_deadlines
            .insert((deadline, name, a.request_id.clone()));
        self.remember_new(key, DedupState::Waiting, a.retain_ms);
        Response::Queued { position }
    }

    fn renew(&mut self, resource: &ResName, lease_id: LeaseId, fx: &mut Vec<Effect>) -> Response {
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
                self.lease_expiry.remove(&(old, resource.clone()));
                self.lease_expiry
                    .insert((grant.expires_at_ms, resource.clone()));
                Response::Renewed(grant)
            }
            _ => Response::LeaseLost,
        }
    }

    fn release(&mut self, resource: &ResName, lease_id: LeaseId, fx: &mut Vec<Effect>) -> Response {
        let held_by_caller = self.settle(resource, fx).lease == Some(lease_id);
        if !held_by_caller {
            // Idempotent, and a stale release never touches the new holder.
            return Response::Released(false);
        }
        self.free(resource, fx);
        Response::Released(true)
    }

    /// Ends the live lease through the same path as a holder's release (`free`), so the
    /// fencing consequences cannot differ: reissue is deferred while proxy grants live.
    fn force_release(&mut self, resource: &ResName, fx: &mut Vec<Effect>) -> Response {
        self.settle(resource, fx);
        let token = self
            .resources
            .get(resource)
            .and_then(|r| r.lease.as_ref())
            .map(|l| l.fencing_token);
        if token.is_some() {
            self.free(resource, fx);
        }
        Response::ForceReleased {
            fencing_token: token,
        }
    }

    fn cancel(&mut self, resource: &ResName, request_id: &str, fx: &mut Vec<Effect>) -> Response {
        self.settle(resource, fx);
        let key = dedup_key(resource, request_id);
        let Some(rec) = self.dedup.get(&key) else {
            return Response::Cancelled(false);
        };
        match rec.state.clone() {
            DedupState::Waiting => {
                self.remove_waiter(resource, request_id);
                self.forget(key);
                fx.push(Effect::WaiterRemoved {
                    resource: resource.to_string(),
                    request_id: request_id.to_string(),
                    reason: WaiterGone::Cancelled,
                });
                self.mark_idle_if_unused(resource);
                Response::Cancelled(true)
            }
            // Already granted: only the lease id may end a lease, and a request id
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
        // The quota ledger is small (a few leases per proxy and pool): sweep it whole.
        self.quotas.expire(now);
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
            self.forget(dedup_key(&res, &rid));
            fx.push(Effect::WaiterRemoved {
                resource: res.to_string(),
                request_id: rid,
                reason: WaiterGone::TimedOut,
            });
            self.mark_idle_if_unused(&res);
        }
        budget -= self.dedup.expire(now, budget);
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
            // the record loses no monotonicity.
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
    /// waiter. Called before any command looks at a resource; returns what the command needs to
    /// know of the record, from the same lookup when nothing was due.
    fn settle(&mut self, resource: &ResName, fx: &mut Vec<Effect>) -> Settled {
        let now = self.now_ms;
        // Read first: most commands find nothing due, and a write to a persistent map copies
        // the path a snapshot still shares.
        let Some(res) = self.resources.get(resource) else {
            return Settled::ABSENT;
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
                if let Some(res) = self.resources.get_mut(resource) {
                    res.reissue_at_ms = None;
                }
                self.reissue_index.remove(&(at, resource.clone()));
                self.hand_off(resource, fx);
            }
            _ => return Settled::of(res),
        }
        self.resources
            .get(resource)
            .map_or(Settled::ABSENT, Settled::of)
    }

    /// Ends the current lease and passes the lock on: to the next waiter now, or — if proxy
    /// grants for the ended token are still live — once every proxy holding one confirmed it
    /// stopped (`RevokeAck`), or at the latest when the grants run out. Without waiters or
    /// grants the record goes idle. One lookup of the record in the common cases.
    fn free(&mut self, resource: &ResName, fx: &mut Vec<Effect>) {
        let now = self.now_ms;
        let idle_until = now.saturating_add(DEFAULT_IDLE_RETAIN_MS);
        let Some(res) = self.resources.get_mut(resource) else {
            return;
        };
        let ended = res.lease.take();
        res.grants.retain(|g| g.until_ms > now);
        let hold = res.grants.iter().map(|g| g.until_ms).max().map(|until| {
            let mut proxies: Vec<u64> = res.grants.iter().map(|g| g.proxy).collect();
            proxies.sort_unstable();
            proxies.dedup();
            res.reissue_at_ms = Some(until);
            (until, proxies)
        });
        let next = if hold.is_some() {
            Next::Wait
        } else if !res.waiters.is_empty() {
            Next::HandOff
        } else if res.mark_idle(idle_until) {
            Next::Idle
        } else {
            Next::Wait
        };
        if let Some(l) = &ended {
            self.lease_expiry
                .remove(&(l.expires_at_ms, resource.clone()));
            count_down(&mut self.tenant_leases, resource);
        }
        if let Some((until, proxies)) = hold {
            self.reissue_index.insert((until, resource.clone()));
            // An expired lease has no live grants (they are capped at its expiry), so this
            // is a release: tell the proxies to stop forwarding the ended token now.
            if let Some(l) = ended {
                fx.push(Effect::Revoke {
                    resource: resource.to_string(),
                    fencing_token: l.fencing_token,
                    proxies,
                });
            }
        }
        match next {
            Next::HandOff => self.hand_off(resource, fx),
            Next::Idle => {
                self.idle_expiry.insert((idle_until, resource.clone()));
            }
            Next::Wait => {}
        }
    }

    /// A proxy confirmed it stopped forwarding `token`'s writes. When the last live grant is
    /// confirmed, the lock passes on at once.
    fn revoke_ack(
        &mut self,
        resource: &ResName,
        token: u64,
        proxy: u64,
        fx: &mut Vec<Effect>,
    ) -> Response {
        self.settle(resource, fx);
        let now = self.now_ms;
        let Some(res) = self.resources.get_mut(resource) else {
            return Response::RevokeAcked(false);
        };
        let before = res.grants.len();
        res.grants
            .retain(|g| g.until_ms > now && !(g.proxy == proxy && g.fencing_token == token));
        let removed = res.grants.len() < before;
        if res.lease.is_none() && res.grants.is_empty() {
            if let Some(at) = res.reissue_at_ms.take() {
                self.reissue_index.remove(&(at, resource.clone()));
                fx.push(Effect::Revoked {
                    resource: resource.to_string(),
                });
                self.hand_off(resource, fx);
            }
        }
        Response::RevokeAcked(removed)
    }

    fn admit(
        &mut self,
        resource: &ResName,
        token: u64,
        proxy: u64,
        grant_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> Response {
        self.settle(resource, fx);
        let now = self.now_ms;
        // Tokens start at 1: 0 was never issued for anything. Where a token was, 0 is below
        // it and stale, as any lower token (and as the proxy's own floor answers it).
        if token == 0 {
            let highest = self
                .resources
                .get(resource)
                .map_or(self.gc_floor, |r| r.last_token.max(r.admitted));
            return Response::Admit(if highest > 0 {
                AdmitOutcome::Stale { highest }
            } else {
                AdmitOutcome::Unknown
            });
        }
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
        let same = res
            .grants
            .iter_mut()
            .find(|g| g.proxy == proxy && g.fencing_token == token);
        match same {
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

    /// Grants the free lock to the head of the queue, skipping waiters whose wait already
    /// timed out. Exactly one waiter is woken (no thundering herd).
    fn hand_off(&mut self, resource: &ResName, fx: &mut Vec<Effect>) {
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
            count_down(&mut self.tenant_waiters, resource);
            self.waiter_deadlines
                .remove(&(w.deadline_ms, resource.clone(), w.request_id.clone()));
            let key = dedup_key(resource, &w.request_id);
            if w.deadline_ms <= now {
                self.forget(key);
                fx.push(Effect::WaiterRemoved {
                    resource: resource.to_string(),
                    request_id: w.request_id,
                    reason: WaiterGone::TimedOut,
                });
                continue;
            }
            let grant = self.grant(resource, w.lease_id, w.holder, w.ttl_ms);
            self.remember(
                key,
                DedupState::Granted(DedupGrant::of(&grant)),
                w.retain_ms,
            );
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
        resource: &ResName,
        lease_id: LeaseId,
        holder: Option<String>,
        ttl_ms: u64,
    ) -> Grant {
        let now = self.now_ms;
        self.last_token += 1;
        let token = self.last_token;
        let expires = now.saturating_add(ttl_ms);
        let lease = Some(Box::new(Lease {
            lease_id,
            fencing_token: token,
            holder,
            ttl_ms,
            expires_at_ms: expires,
            granted_at_ms: now,
        }));
        // One lookup for a known resource (the map's `entry` would look it up twice).
        let was_idle = match self.resources.get_mut(resource) {
            Some(res) => {
                res.lease = lease;
                res.last_token = token;
                res.idle_until_ms.take()
            }
            None => {
                let res = ResourceState {
                    lease,
                    last_token: token,
                    ..ResourceState::default()
                };
                self.resources.insert(resource.clone(), res);
                None
            }
        };
        if let Some(until) = was_idle {
            self.idle_expiry.remove(&(until, resource.clone()));
        }
        self.lease_expiry.insert((expires, resource.clone()));
        count_up(&mut self.tenant_leases, resource);
        Grant {
            resource: resource.to_string(),
            lease_id,
            fencing_token: token,
            ttl_ms,
            expires_at_ms: expires,
        }
    }

    /// A remembered grant, with the current expiry if that lease is still the live one.
    fn current_view_of(&self, mut g: Grant) -> Grant {
        let live = self
            .resources
            .get(g.resource.as_str())
            .and_then(|r| r.lease.as_ref())
            .filter(|l| l.lease_id == g.lease_id);
        g.expires_at_ms = match live {
            Some(l) => l.expires_at_ms,
            // Released, expired or handed on: it ended by now, whatever its TTL promised.
            None => g.expires_at_ms.min(self.now_ms),
        };
        g
    }

    fn queue_position(&self, resource: &ResName, request_id: &str) -> u32 {
        self.resources
            .get(resource)
            .and_then(|r| r.waiters.iter().position(|w| w.request_id == request_id))
            .map_or(0, |p| p as u32 + 1)
    }
}

/// A resource's record as [`LockMachine::settle`] left it: what acquire and release decide on.
#[derive(Clone, Copy, Debug)]
struct Settled {
    /// The live lease's id.
    lease: Option<LeaseId>,
    /// Neither a lease nor a wait for proxies to stop: a new token may be issued now.
    free: bool,
}

impl Settled {
    /// No record: free, nothing held.
    const ABSENT: Settled = Settled {
        lease: None,
        free: true,
    };

    fn of(res: &ResourceState) -> Settled {
        Settled {
            lease: res.lease.as_ref().map(|l| l.lease_id),
            free: res.lease.is_none() && res.reissue_at_ms.is_none(),
        }
    }
}

/// What [`LockMachine::free`] does once the lease is off the record.
enum Next {
    /// Grant the lock to the head of the queue.
    HandOff,
    /// The record just went idle: index it for dropping.
    Idle,
    /// Nothing now: proxies are still to stop, or the record is already accounted for.
    Wait,
}

/// One more lease or waiter for the tenant of `resource`.
pub(super) fn count_up(counts: &mut HashMap<String, u64>, resource: &str) {
    let tenant = split_scoped(resource).0;
    match counts.get_mut(tenant) {
        Some(n) => *n += 1,
        None => {
            counts.insert(tenant.to_string(), 1);
        }
    }
}

/// One fewer; a tenant at zero is dropped, so the map holds only tenants with something.
pub(super) fn count_down(counts: &mut HashMap<String, u64>, resource: &str) {
    let tenant = split_scoped(resource).0;
    if let Some(n) = counts.get_mut(tenant) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(tenant);
        }
    }
}
