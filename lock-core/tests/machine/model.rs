//! The reference model: the lock rules written as plainly as possible (linear scans, no
//! indexes), with the same lazy expiry the machine documents: a lease, waiter or dedup record
//! whose time is up stays until a command touches it or a Tick sweeps it.

use std::collections::{BTreeMap, VecDeque};

use lock_core::machine::{
    dedup_key, Acquire, AdmitOutcome, Command, Effect, Grant, LeaseId, Proposal, Response,
    WaiterGone, DEFAULT_IDLE_RETAIN_MS,
};

#[derive(Clone, Debug)]
pub struct MLease {
    pub id: LeaseId,
    pub token: u64,
    pub ttl: u64,
    pub exp: u64,
}

#[derive(Clone, Debug)]
pub struct MWaiter {
    pub rid: String,
    pub id: LeaseId,
    pub ttl: u64,
    pub deadline: u64,
    pub retain: u64,
}

#[derive(Clone, Debug, Default)]
pub struct MRes {
    pub lease: Option<MLease>,
    pub queue: VecDeque<MWaiter>,
    pub last_token: u64,
    /// Highest token a proxy was admitted with.
    pub admitted: u64,
    /// Proxy admission grants: (proxy, token, until).
    pub grants: Vec<(u64, u64, u64)>,
    /// After a lease ended under live grants: no new token before this time.
    pub reissue_at: Option<u64>,
    pub idle_until: Option<u64>,
}

#[derive(Clone, Debug)]
pub enum MDedup {
    Granted { grant: Grant, expires: u64 },
    Waiting,
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub now: u64,
    pub term: u64,
    pub last_token: u64,
    pub res: BTreeMap<String, MRes>,
    pub dedup: BTreeMap<(String, String), MDedup>,
    /// Highest token of any dropped idle record.
    pub gc_floor: u64,
}

impl Model {
    pub fn apply(&mut self, p: &Proposal, term: u64) -> (Response, Vec<Effect>) {
        let prev = self.now;
        let now = p.now_ms.max(prev);
        if term > self.term {
            if self.term != 0 || prev != 0 {
                // A leader change never shortens a lease: whatever is still live at the
                // previous stamp keeps its remaining time, plus the time the new leader's clock
                // is ahead, plus the grace.
                let by = now - prev + p.failover_grace_ms;
                for r in self.res.values_mut() {
                    if let Some(l) = r.lease.as_mut().filter(|l| l.exp > prev) {
                        l.exp += by;
                    }
                    for w in r.queue.iter_mut().filter(|w| w.deadline > prev) {
                        w.deadline += by;
                    }
                    for g in r.grants.iter_mut().filter(|g| g.2 > prev) {
                        g.2 += by;
                    }
                    if let Some(at) = r.reissue_at.as_mut().filter(|at| **at > prev) {
                        *at += by;
                    }
                    // Retention (idle records, dedup records) is moved by the jump only.
                    if let Some(u) = r.idle_until.as_mut().filter(|u| **u > prev) {
                        *u += now - prev;
                    }
                }
                for d in self.dedup.values_mut() {
                    if let MDedup::Granted { expires, .. } = d {
                        if *expires > prev {
                            *expires += now - prev;
                        }
                    }
                }
            }
            self.term = term;
        }
        self.now = now;
        let mut fx = Vec::new();
        let resp = match &p.cmd {
            Command::Acquire(a) => self.acquire(a, &mut fx),
            Command::Renew { resource, lease_id } => {
                self.settle(resource, &mut fx);
                let now = self.now;
                match self
                    .res
                    .get_mut(resource)
                    .and_then(|r| r.lease.as_mut())
                    .filter(|l| l.id == *lease_id)
                {
                    Some(l) => {
                        l.exp = l.exp.max(now + l.ttl);
                        Response::Renewed(Grant {
                            resource: resource.clone(),
                            lease_id: l.id,
                            fencing_token: l.token,
                            ttl_ms: l.ttl,
                            expires_at_ms: l.exp,
                        })
                    }
                    None => Response::LeaseLost,
                }
            }
            Command::Release { resource, lease_id } => {
                self.settle(resource, &mut fx);
                if self.lease_id(resource) == Some(*lease_id) {
                    self.free(resource, &mut fx);
                    Response::Released(true)
                } else {
                    Response::Released(false)
                }
            }
            Command::Cancel {
                resource,
                request_id,
            } => {
                self.settle(resource, &mut fx);
                let key = (resource.clone(), request_id.clone());
                match self.dedup.get(&key).cloned() {
                    None => Response::Cancelled(false),
                    Some(MDedup::Waiting) => {
                        let r = self.res.get_mut(resource).expect("waiter's resource");
                        r.queue.retain(|w| &w.rid != request_id);
                        self.dedup.remove(&key);
                        fx.push(Effect::WaiterRemoved {
                            resource: resource.clone(),
                            request_id: request_id.clone(),
                            reason: WaiterGone::Cancelled,
                        });
                        self.mark_idle(resource);
                        Response::Cancelled(true)
                    }
                    // Granted: only the lease id ends a lease.
                    Some(MDedup::Granted { .. }) => Response::Cancelled(false),
                }
            }
            Command::Admit {
                resource,
                fencing_token,
                proxy,
                grant_ms,
            } => Response::Admit(self.admit(resource, *fencing_token, *proxy, *grant_ms, &mut fx)),
            Command::RevokeAck {
                resource,
                fencing_token,
                proxy,
            } => self.revoke_ack(resource, *fencing_token, *proxy, &mut fx),
            // An operator's forced release ends whatever lease is live, like its holder's release.
            Command::ForceRelease { resource, .. } => {
                self.settle(resource, &mut fx);
                let token = self
                    .res
                    .get(resource)
                    .and_then(|r| r.lease.as_ref())
                    .map(|l| l.token);
                if token.is_some() {
                    self.free(resource, &mut fx);
                }
                Response::ForceReleased {
                    fencing_token: token,
                }
            }
            Command::Tick { max_items } => self.tick(*max_items as usize, &mut fx),
            // Idempotency records are applied by the storage layer, not the lock machine.
            Command::Idem(_) => Response::Noop,
            // Lock histories never issue quota commands; `quota.rs` checks the ledger.
            Command::QuotaDefine(_)
            | Command::QuotaSet(_)
            | Command::QuotaLease(_)
            | Command::QuotaReturn { .. } => Response::Noop,
            // Nor key commands (with tenant bounds off); `tenants.rs` checks those.
            Command::KeyCreate(_) | Command::KeyRevoke { .. } | Command::AsKey { .. } => {
                Response::Noop
            }
        };
        (resp, fx)
    }

    pub fn lease_id(&self, resource: &str) -> Option<LeaseId> {
        self.res.get(resource)?.lease.as_ref().map(|l| l.id)
    }

    pub fn total_waiters(&self) -> usize {
        self.res.values().map(|r| r.queue.len()).sum()
    }

    fn acquire(&mut self, a: &Acquire, fx: &mut Vec<Effect>) -> Response {
        self.settle(&a.resource, fx);
        let key = (a.resource.clone(), a.request_id.clone());
        match self.dedup.get(&key) {
            Some(MDedup::Granted { grant, .. }) => {
                let mut g = grant.clone();
                let live = self
                    .res
                    .get(&a.resource)
                    .and_then(|r| r.lease.as_ref())
                    .filter(|l| l.id == g.lease_id);
                g.expires_at_ms = match live {
                    Some(l) => l.exp,
                    None => g.expires_at_ms.min(self.now),
                };
                return Response::Granted(g);
            }
            Some(MDedup::Waiting) => {
                let pos = self.res[&a.resource]
                    .queue
                    .iter()
                    .position(|w| w.rid == a.request_id)
                    .expect("waiting record has a waiter");
                return Response::Queued {
                    position: pos as u32 + 1,
                };
            }
            None => {}
        }
        // Busy while held, or while the previous token's proxy grants run out.
        let busy_until = self
            .res
            .get(&a.resource)
            .and_then(|r| r.lease.as_ref().map(|l| l.exp).or(r.reissue_at));
        let Some(busy_until) = busy_until else {
            let g = self.grant(&a.resource, a.lease_id, a.ttl_ms);
            self.remember_grant(&a.resource, &a.request_id, g.clone(), a.retain_ms);
            return Response::Granted(g);
        };
        if a.wait_timeout_ms == 0 {
            let retry_after_ms = busy_until - self.now;
            let revoking = self.res[&a.resource].lease.is_none();
            return if revoking {
                Response::Revoking { retry_after_ms }
            } else {
                Response::Held { retry_after_ms }
            };
        }
        let total = self.total_waiters();
        let r = self.res.get_mut(&a.resource).expect("held resource");
        if r.queue.len() >= a.max_waiters as usize || total >= a.max_total_waiters as usize {
            return Response::TooManyWaiters;
        }
        r.queue.push_back(MWaiter {
            rid: a.request_id.clone(),
            id: a.lease_id,
            ttl: a.ttl_ms,
            deadline: self.now + a.wait_timeout_ms,
            retain: a.retain_ms,
        });
        let position = r.queue.len() as u32;
        self.dedup.insert(key, MDedup::Waiting);
        Response::Queued { position }
    }

    fn settle(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        let now = self.now;
        let Some(r) = self.res.get_mut(resource) else {
            return;
        };
        if let Some(l) = r.lease.clone().filter(|l| l.exp <= now) {
            fx.push(Effect::Expired {
                resource: resource.to_string(),
                fencing_token: l.token,
            });
            self.free(resource, fx);
        } else if r.lease.is_none() && r.reissue_at.is_some_and(|at| at <= now) {
            r.reissue_at = None;
            self.hand_off(resource, fx);
        }
    }

    /// Ends the lease; the next holder gets the lock now, or once every proxy holding a grant
    /// for the ended token confirmed (revocation), at the latest when the grants run out.
    fn free(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        let now = self.now;
        let r = self.res.get_mut(resource).expect("resource");
        let ended = r.lease.take().map(|l| l.token);
        r.grants.retain(|g| g.2 > now);
        if let Some(until) = r.grants.iter().map(|g| g.2).max() {
            r.reissue_at = Some(until);
            let mut proxies: Vec<u64> = r.grants.iter().map(|g| g.0).collect();
            proxies.sort_unstable();
            proxies.dedup();
            if let Some(token) = ended {
                fx.push(Effect::Revoke {
                    resource: resource.to_string(),
                    fencing_token: token,
                    proxies,
                });
            }
            return;
        }
        self.hand_off(resource, fx);
    }

    /// A proxy confirmed it stopped forwarding `token`: its grant goes; the last one frees the
    /// lock for the next holder.
    fn revoke_ack(
        &mut self,
        resource: &str,
        token: u64,
        proxy: u64,
        fx: &mut Vec<Effect>,
    ) -> Response {
        self.settle(resource, fx);
        let now = self.now;
        let Some(r) = self.res.get_mut(resource) else {
            return Response::RevokeAcked(false);
        };
        let before = r.grants.len();
        r.grants
            .retain(|g| g.2 > now && !(g.0 == proxy && g.1 == token));
        let removed = r.grants.len() < before;
        if r.lease.is_none() && r.grants.is_empty() && r.reissue_at.take().is_some() {
            fx.push(Effect::Revoked {
                resource: resource.to_string(),
            });
            self.hand_off(resource, fx);
        }
        Response::RevokeAcked(removed)
    }

    fn hand_off(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        let now = self.now;
        let r = self.res.get_mut(resource).expect("resource");
        while let Some(w) = r.queue.pop_front() {
            if w.deadline <= now {
                self.dedup.remove(&(resource.to_string(), w.rid.clone()));
                fx.push(Effect::WaiterRemoved {
                    resource: resource.to_string(),
                    request_id: w.rid,
                    reason: WaiterGone::TimedOut,
                });
                continue;
            }
            let g = self.grant(resource, w.id, w.ttl);
            self.remember_grant(resource, &w.rid, g.clone(), w.retain);
            fx.push(Effect::HandedOff {
                request_id: w.rid,
                grant: g,
            });
            return;
        }
        self.mark_idle(resource);
    }

    /// No stale write is forwarded: a proxy may forward writes only with the resource's
    /// current, live token, never one below the highest issued or admitted, never one not
    /// issued for it.
    fn admit(
        &mut self,
        resource: &str,
        token: u64,
        proxy: u64,
        grant_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> AdmitOutcome {
        self.settle(resource, fx);
        let now = self.now;
        // Tokens start at 1: 0 was never issued for anything; below a token it is stale, as
        // any lower token.
        if token == 0 {
            let highest = self
                .res
                .get(resource)
                .map_or(self.gc_floor, |r| r.last_token.max(r.admitted));
            return match highest {
                0 => AdmitOutcome::Unknown,
                highest => AdmitOutcome::Stale { highest },
            };
        }
        let Some(r) = self.res.get_mut(resource) else {
            return if token <= self.gc_floor {
                AdmitOutcome::Stale {
                    highest: self.gc_floor,
                }
            } else {
                AdmitOutcome::Unknown
            };
        };
        let highest = r.last_token.max(r.admitted);
        if token < highest {
            return AdmitOutcome::Stale { highest };
        }
        if token > r.last_token {
            return AdmitOutcome::Unknown;
        }
        let Some(exp) = r.lease.as_ref().filter(|l| l.token == token).map(|l| l.exp) else {
            return AdmitOutcome::Ended;
        };
        let until = (now + grant_ms).min(exp);
        r.grants.retain(|g| g.2 > now);
        match r.grants.iter_mut().find(|g| g.0 == proxy && g.1 == token) {
            Some(g) => g.2 = g.2.max(until),
            None => r.grants.push((proxy, token, until)),
        }
        r.admitted = r.admitted.max(token);
        AdmitOutcome::Admitted {
            grant_ms: until - now,
        }
    }

    fn grant(&mut self, resource: &str, id: LeaseId, ttl: u64) -> Grant {
        self.last_token += 1;
        let r = self.res.entry(resource.to_string()).or_default();
        r.lease = Some(MLease {
            id,
            token: self.last_token,
            ttl,
            exp: self.now + ttl,
        });
        r.last_token = self.last_token;
        r.idle_until = None;
        Grant {
            resource: resource.to_string(),
            lease_id: id,
            fencing_token: self.last_token,
            ttl_ms: ttl,
            expires_at_ms: self.now + ttl,
        }
    }

    fn remember_grant(&mut self, resource: &str, rid: &str, grant: Grant, retain: u64) {
        self.dedup.insert(
            (resource.to_string(), rid.to_string()),
            MDedup::Granted {
                grant,
                expires: self.now + retain,
            },
        );
    }

    fn mark_idle(&mut self, resource: &str) {
        let now = self.now;
        if let Some(r) = self.res.get_mut(resource) {
            if r.lease.is_none()
                && r.queue.is_empty()
                && r.idle_until.is_none()
                && r.reissue_at.is_none()
            {
                r.idle_until = Some(now + DEFAULT_IDLE_RETAIN_MS);
            }
        }
    }

    /// Expired leases first (earliest first), then timed-out waiters, then dedup records,
    /// then idle records, `budget` items in all.
    fn tick(&mut self, mut budget: usize, fx: &mut Vec<Effect>) -> Response {
        let now = self.now;
        let mut expired = 0;
        let mut handed_off = 0;
        let mut due: Vec<(u64, String)> = self
            .res
            .iter()
            .filter_map(|(n, r)| r.lease.as_ref().map(|l| (l.exp, n.clone())))
            .filter(|(exp, _)| *exp <= now)
            .collect();
        due.sort();
        for (_, name) in due.into_iter().take(budget) {
            budget -= 1;
            expired += 1;
            let before = fx.len();
            self.settle(&name, fx);
            handed_off += fx[before..]
                .iter()
                .filter(|e| matches!(e, Effect::HandedOff { .. }))
                .count() as u32;
        }
        let mut due: Vec<(u64, String)> = self
            .res
            .iter()
            .filter_map(|(n, r)| r.reissue_at.map(|at| (at, n.clone())))
            .filter(|(at, _)| *at <= now)
            .collect();
        due.sort();
        for (_, name) in due.into_iter().take(budget) {
            budget -= 1;
            let before = fx.len();
            self.settle(&name, fx);
            handed_off += fx[before..]
                .iter()
                .filter(|e| matches!(e, Effect::HandedOff { .. }))
                .count() as u32;
        }
        let mut due: Vec<(u64, String, String)> = self
            .res
            .iter()
            .flat_map(|(n, r)| {
                r.queue
                    .iter()
                    .map(|w| (w.deadline, n.clone(), w.rid.clone()))
            })
            .filter(|(d, _, _)| *d <= now)
            .collect();
        // The machine sweeps records due at the same time in the order of their keys, which
        // are digests of (resource, request id).
        due.sort_by_key(|(expires, name, rid)| (*expires, dedup_key(name, rid)));
        for (_, name, rid) in due.into_iter().take(budget) {
            budget -= 1;
            self.res
                .get_mut(&name)
                .expect("resource")
                .queue
                .retain(|w| w.rid != rid);
            self.dedup.remove(&(name.clone(), rid.clone()));
            fx.push(Effect::WaiterRemoved {
                resource: name.clone(),
                request_id: rid,
                reason: WaiterGone::TimedOut,
            });
            self.mark_idle(&name);
        }
        let mut due: Vec<(u64, String, String)> = self
            .dedup
            .iter()
            .filter_map(|((n, q), d)| match d {
                MDedup::Granted { expires, .. } if *expires <= now => {
                    Some((*expires, n.clone(), q.clone()))
                }
                _ => None,
            })
            .collect();
        // The machine sweeps records due at the same time in the order of their keys, which
        // are digests of (resource, request id).
        due.sort_by_key(|(expires, name, rid)| (*expires, dedup_key(name, rid)));
        for (_, name, rid) in due.into_iter().take(budget) {
            budget -= 1;
            self.dedup.remove(&(name, rid));
        }
        let mut due: Vec<(u64, String)> = self
            .res
            .iter()
            .filter_map(|(n, r)| r.idle_until.map(|u| (u, n.clone())))
            .filter(|(u, _)| *u <= now)
            .collect();
        due.sort();
        for (_, name) in due.into_iter().take(budget) {
            let gone = self.res.remove(&name).expect("idle record");
            self.gc_floor = self.gc_floor.max(gone.last_token).max(gone.admitted);
        }
        Response::Ticked {
            expired,
            handed_off,
        }
    }
}
