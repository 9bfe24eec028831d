//! The driver of the random walk: the operations a history is made of, and the world that
//! applies each one to the machine and to the reference model, compares their answers and checks
//! the invariants after every step.

use std::collections::{HashMap, HashSet};

use lock_core::machine::{
    dedup_key, Acquire, AdmitOutcome, Command, DedupKey, Effect, Grant, LeaseId, LockMachine,
    Proposal, Response, WaiterGone,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::model::{MDedup, Model};
use crate::support::{restore, waiting, GRACE, T0};

pub const RESOURCE_NAMES: [&str; 4] = ["acct:1", "acct:2", "job/x", "q.z"];
pub const REQUEST_IDS: u8 = 6;
/// Lease ids the model never issues ("random" ids presented by a confused client).
const FOREIGN: u128 = 1 << 100;

#[derive(Clone, Debug)]
pub enum Pick {
    /// The resource's current lease according to the model (a foreign id if none).
    Current,
    /// Some lease id used before, on any resource.
    Stale(usize),
    /// A lease id nobody was ever given.
    Foreign(u64),
}

#[derive(Clone, Debug)]
pub enum Op {
    Acquire {
        res: usize,
        rid: u8,
        ttl_ms: u64,
        wait_ms: u64,
        retain_ms: u64,
    },
    Renew {
        res: usize,
        pick: Pick,
    },
    Release {
        res: usize,
        pick: Pick,
    },
    Cancel {
        res: usize,
        rid: u8,
    },
    /// An operator ends whatever lease the resource has.
    ForceRelease {
        res: usize,
    },
    /// A fencing proxy asks to forward writes with a token.
    Admit {
        res: usize,
        token: TokenPick,
        proxy: u64,
        grant_ms: u64,
    },
    /// A proxy confirms it stopped forwarding a token after a release revoked it.
    RevokeAck {
        res: usize,
        token: TokenPick,
        proxy: u64,
    },
    Tick {
        max_items: u32,
    },
    /// Real time passes on every clock.
    Advance {
        ms: u64,
    },
    /// A new leader takes over after `election_ms`, with its clock `offset_ms` off real time.
    LeaderChange {
        election_ms: u64,
        offset_ms: i64,
        grace_ms: u64,
    },
    /// The machine is replaced by one restored from its snapshot image.
    Restore,
}

#[derive(Clone, Debug)]
pub enum TokenPick {
    /// The token of the resource's current lease (or its last token if none).
    Current,
    /// Any token up to a little above the highest issued.
    Any(u64),
}

/// Everything the random walk needs besides the machine and the model: the clocks, the lease
/// ids handed out, and what the invariants remember across steps.
pub struct World {
    m: LockMachine,
    model: Model,
    /// Real time; leader stamps are this plus the leader's clock offset.
    real_ms: u64,
    offset_ms: i64,
    grace_ms: u64,
    term: u64,
    /// A leader change happened and its first command has not been applied yet.
    pending_failover: bool,
    next_lease: u128,
    used_leases: Vec<LeaseId>,
    /// Highest fencing token seen in any response or effect (invariant 2).
    max_token: u64,
}

/// The machine as it was before a step, for the invariants that compare before and after.
struct Before {
    now: u64,
    token: u64,
    /// resource -> (lease id, token, expiry)
    leases: HashMap<String, (LeaseId, u64, u64)>,
    model: Model,
}

fn sorted_debug(fx: &[Effect]) -> Vec<String> {
    let mut v: Vec<String> = fx.iter().map(|e| format!("{e:?}")).collect();
    v.sort();
    v
}

impl World {
    pub fn new() -> Self {
        World::with_machine(LockMachine::new())
    }

    /// A world around `m` (e.g. a machine with a small dedup chunk length).
    pub fn with_machine(m: LockMachine) -> Self {
        World {
            m,
            model: Model::default(),
            real_ms: T0,
            offset_ms: 0,
            grace_ms: GRACE,
            term: 1,
            pending_failover: false,
            next_lease: 1,
            used_leases: Vec::new(),
            max_token: 0,
        }
    }

    fn stamp(&self) -> u64 {
        self.real_ms.saturating_add_signed(self.offset_ms)
    }

    fn lease_for(&mut self, res: &str, pick: &Pick) -> LeaseId {
        match pick {
            Pick::Current => self
                .model
                .lease_id(res)
                .unwrap_or(LeaseId(FOREIGN | 0xdead)),
            Pick::Stale(i) if !self.used_leases.is_empty() => {
                self.used_leases[i % self.used_leases.len()]
            }
            Pick::Stale(_) => LeaseId(FOREIGN),
            Pick::Foreign(x) => LeaseId(FOREIGN | u128::from(*x)),
        }
    }

    pub fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let cmd = match op {
            Op::Advance { ms } => {
                self.real_ms += ms;
                return Ok(());
            }
            Op::LeaderChange {
                election_ms,
                offset_ms,
                grace_ms,
            } => {
                self.real_ms += election_ms;
                self.offset_ms = *offset_ms;
                self.grace_ms = *grace_ms;
                self.term += 1;
                self.pending_failover = true;
                return Ok(());
            }
            Op::Restore => {
                let image = self.m.image();
                self.m = restore(&self.m);
                prop_assert_eq!(self.m.image(), image, "restored image differs");
                return self.check();
            }
            Op::Acquire {
                res,
                rid,
                ttl_ms,
                wait_ms,
                retain_ms,
            } => {
                let id = LeaseId(self.next_lease);
                self.next_lease += 1;
                self.used_leases.push(id);
                Command::Acquire(Acquire {
                    resource: RESOURCE_NAMES[*res].to_string(),
                    request_id: format!("req-{rid}"),
                    holder: Some(format!("client-{rid}")),
                    ttl_ms: *ttl_ms,
                    wait_timeout_ms: *wait_ms,
                    lease_id: id,
                    retain_ms: *retain_ms,
                    max_waiters: 2,
                    max_total_waiters: 4,
                    tenant_limits: None,
                })
            }
            Op::Renew { res, pick } => Command::Renew {
                resource: RESOURCE_NAMES[*res].to_string(),
                lease_id: self.lease_for(RESOURCE_NAMES[*res], pick),
            },
            Op::Release { res, pick } => Command::Release {
                resource: RESOURCE_NAMES[*res].to_string(),
                lease_id: self.lease_for(RESOURCE_NAMES[*res], pick),
            },
            Op::Cancel { res, rid } => Command::Cancel {
                resource: RESOURCE_NAMES[*res].to_string(),
                request_id: format!("req-{rid}"),
            },
            Op::ForceRelease { res } => Command::ForceRelease {
                resource: RESOURCE_NAMES[*res].to_string(),
                operator: "ops".to_string(),
            },
            Op::Admit {
                res,
                token,
                proxy,
                grant_ms,
            } => {
                let name = RESOURCE_NAMES[*res];
                let r = self.model.res.get(name);
                let fencing_token = match token {
                    TokenPick::Current => r
                        .map(|r| r.lease.as_ref().map_or(r.last_token, |l| l.token))
                        .unwrap_or(1),
                    TokenPick::Any(x) => x % (self.model.last_token + 3),
                };
                Command::Admit {
                    resource: name.to_string(),
                    fencing_token,
                    proxy: *proxy,
                    grant_ms: *grant_ms,
                }
            }
            Op::RevokeAck { res, token, proxy } => {
                let name = RESOURCE_NAMES[*res];
                let fencing_token = match token {
                    TokenPick::Current => self.model.res.get(name).map_or(1, |r| r.last_token),
                    TokenPick::Any(x) => x % (self.model.last_token + 3),
                };
                Command::RevokeAck {
                    resource: name.to_string(),
                    fencing_token,
                    proxy: *proxy,
                }
            }
            Op::Tick { max_items } => Command::Tick {
                max_items: *max_items,
            },
        };
        let p = Proposal {
            now_ms: self.stamp(),
            failover_grace_ms: self.grace_ms,
            cmd,
        };

        let before = Before {
            now: self.m.now_ms(),
            token: self.m.last_token(),
            leases: RESOURCE_NAMES
                .iter()
                .filter_map(|r| {
                    let l = self.m.lease(r)?;
                    Some((
                        r.to_string(),
                        (l.lease_id, l.fencing_token, l.expires_at_ms),
                    ))
                })
                .collect(),
            model: self.model.clone(),
        };

        let (resp, fx) = self.m.apply(&p, self.term);
        let (want, want_fx) = self.model.apply(&p, self.term);
        prop_assert_eq!(&resp, &want, "response to {:?}", p.cmd);
        prop_assert_eq!(
            sorted_debug(&fx),
            sorted_debug(&want_fx),
            "effects of {:?}",
            p.cmd
        );
        let failover = std::mem::take(&mut self.pending_failover);
        self.check_step(&p, &resp, &fx, &before, failover)?;
        self.check()
    }

    /// Invariants about one step: what its response and effects may be given the state before.
    fn check_step(
        &mut self,
        p: &Proposal,
        resp: &Response,
        fx: &[Effect],
        before: &Before,
        failover: bool,
    ) -> Result<(), TestCaseError> {
        let now = self.m.now_ms();
        prop_assert!(now >= before.now, "log time went backwards");

        // Tokens only grow: every newly granted token is above every token before; the counter
        // never decreases and accounts for every grant.
        let mut fresh: Vec<&Grant> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::HandedOff { grant, .. } => Some(grant),
                _ => None,
            })
            .collect();
        if let (Command::Acquire(a), Response::Granted(g)) = (&p.cmd, resp) {
            if g.lease_id == a.lease_id {
                fresh.push(g);
            }
        }
        fresh.sort_by_key(|g| g.fencing_token);
        for g in fresh {
            prop_assert!(
                g.fencing_token > self.max_token,
                "token {} not above {}",
                g.fencing_token,
                self.max_token
            );
            self.max_token = g.fencing_token;
        }
        prop_assert!(self.m.last_token() >= before.token);
        prop_assert_eq!(self.m.last_token(), self.max_token);

        // Only the current lease id renews or releases; a renewal never shortens.
        let (resource, lease_id, succeeded) = match (&p.cmd, resp) {
            (Command::Renew { resource, lease_id }, r) => {
                (resource, lease_id, matches!(r, Response::Renewed(_)))
            }
            (Command::Release { resource, lease_id }, r) => {
                (resource, lease_id, *r == Response::Released(true))
            }
            _ => return self.check_retry_and_failover(p, resp, fx, before, failover),
        };
        let held = before.leases.get(resource);
        // The lock may have changed hands inside this very command (the holder's lease ran out
        // and a waiter got it); then the new lease is the current one.
        let handed_off_now = fx.iter().any(|e| {
            matches!(e, Effect::HandedOff { grant, .. }
                if grant.resource == *resource && grant.lease_id == *lease_id)
        });
        if succeeded && !handed_off_now {
            let (id, _, exp) =
                held.ok_or_else(|| TestCaseError::fail("renew/release without a lease"))?;
            prop_assert_eq!(
                id.0,
                lease_id.0,
                "renew/release with a lease id not current"
            );
            if !failover {
                prop_assert!(*exp > now, "renewed/released a lease that had run out");
            }
            if let Response::Renewed(g) = resp {
                prop_assert!(g.expires_at_ms >= (*exp).max(now + g.ttl_ms));
            }
        } else if let Some((id, token, _)) = held {
            // A stale release or renewal never removes the holder: its lease is still there,
            // or it ran out (and this command reported the expiry).
            let kept = self.m.lease(resource).map(|l| l.lease_id) == Some(*id);
            let expired = fx.contains(&Effect::Expired {
                resource: resource.clone(),
                fencing_token: *token,
            });
            prop_assert!(kept || expired, "stale renew/release removed the holder");
        }
        self.check_retry_and_failover(p, resp, fx, before, failover)
    }

    fn check_retry_and_failover(
        &self,
        p: &Proposal,
        resp: &Response,
        fx: &[Effect],
        before: &Before,
        failover: bool,
    ) -> Result<(), TestCaseError> {
        let now = self.m.now_ms();
        // No stale write is forwarded: a proxy is admitted only with the resource's current,
        // live token, which is the highest ever issued for it.
        if let (
            Command::Admit {
                resource,
                fencing_token,
                ..
            },
            Response::Admit(AdmitOutcome::Admitted { grant_ms }),
        ) = (&p.cmd, resp)
        {
            let r = self
                .m
                .resource(resource)
                .ok_or_else(|| TestCaseError::fail("admitted on a resource without record"))?;
            let l = r
                .lease
                .as_ref()
                .ok_or_else(|| TestCaseError::fail("admitted without a lease"))?;
            prop_assert_eq!(l.fencing_token, *fencing_token);
            prop_assert_eq!(r.last_token, *fencing_token);
            prop_assert!(
                now + grant_ms <= l.expires_at_ms,
                "grant outlives the lease"
            );
        }
        // A retry returns the original result and never adds a lease or a waiter.
        if let Command::Acquire(a) = &p.cmd {
            let key = (a.resource.clone(), a.request_id.clone());
            // Settling the resource may first find that this request's wait ran out: then the
            // original acquire is over (timed out) and this one is a new acquire.
            let timed_out = fx.contains(&Effect::WaiterRemoved {
                resource: a.resource.clone(),
                request_id: a.request_id.clone(),
                reason: WaiterGone::TimedOut,
            });
            let retry = before.model.dedup.get(&key).filter(|_| !timed_out);
            match retry {
                Some(MDedup::Granted { grant, .. }) => {
                    let Response::Granted(g) = resp else {
                        return Err(TestCaseError::fail(format!("retry got {resp:?}")));
                    };
                    prop_assert_eq!(
                        (g.lease_id, g.fencing_token),
                        (grant.lease_id, grant.fencing_token)
                    );
                }
                Some(MDedup::Waiting) => {
                    let ok = match resp {
                        Response::Queued { .. } => true,
                        // Settling the resource may hand it to this very waiter.
                        Response::Granted(g) => fx.iter().any(|e| {
                            matches!(e, Effect::HandedOff { request_id, grant }
                                if *request_id == a.request_id && grant == g)
                        }),
                        _ => false,
                    };
                    prop_assert!(ok, "retry of a queued acquire got {:?}", resp);
                }
                None => {}
            }
            if retry.is_some() {
                let queued_before = before
                    .model
                    .res
                    .get(&a.resource)
                    .map_or(0, |r| r.queue.len());
                prop_assert!(waiting(&self.m, &a.resource).len() <= queued_before);
                let used = self.m.lease(&a.resource).map(|l| l.lease_id) == Some(a.lease_id)
                    || self
                        .m
                        .resource(&a.resource)
                        .is_some_and(|r| r.waiters.iter().any(|w| w.lease_id == a.lease_id));
                prop_assert!(!used, "a retry created a second lease or waiter");
            }
        }

        // A leader change never shortens a lease: no lease's expiry ever moves earlier, and
        // across a leader change a live lease keeps at least its remaining time as of the
        // previous stamp plus the grace.
        for (resource, (id, _, exp_before)) in &before.leases {
            let Some(l) = self.m.lease(resource).filter(|l| l.lease_id == *id) else {
                continue;
            };
            prop_assert!(l.expires_at_ms >= *exp_before, "lease expiry moved earlier");
            if failover && *exp_before > before.now {
                prop_assert!(
                    l.expires_at_ms - now >= exp_before - before.now + p.failover_grace_ms,
                    "failover shortened the lease on {}: {} left, had {} + grace {}",
                    resource,
                    l.expires_at_ms - now,
                    exp_before - before.now,
                    p.failover_grace_ms
                );
            }
        }
        if failover {
            // Every lease live at the previous stamp survives the new leader's first command,
            // unless that command released it.
            for (resource, (id, _, exp_before)) in &before.leases {
                let released = matches!(&p.cmd,
                    Command::Release { resource: r, lease_id } if r == resource && lease_id == id)
                    || matches!(&p.cmd, Command::ForceRelease { resource: r, .. } if r == resource);
                if *exp_before > before.now && !released {
                    prop_assert_eq!(self.m.lease(resource).map(|l| l.lease_id), Some(*id));
                }
            }
        }
        Ok(())
    }

    /// Invariants about the state after any step.
    fn check(&self) -> Result<(), TestCaseError> {
        let m = &self.m;
        m.check_indexes().map_err(TestCaseError::fail)?;
        let image = m.image();
        prop_assert_eq!(&LockMachine::from_image(image.clone()).image(), &image);
        prop_assert_eq!(m.now_ms(), self.model.now);
        prop_assert_eq!(m.last_token(), self.model.last_token);

        // At most one lease per resource, the one the model says; lease ids are unique.
        let mut ids = HashSet::new();
        for name in RESOURCE_NAMES {
            let want = self.model.res.get(name);
            let got = m.resource(name);
            prop_assert_eq!(got.is_some(), want.is_some(), "record of {}", name);
            let (Some(got), Some(want)) = (got, want) else {
                continue;
            };
            let got_lease = got
                .lease
                .as_ref()
                .map(|l| (l.lease_id, l.fencing_token, l.ttl_ms, l.expires_at_ms));
            let want_lease = want.lease.as_ref().map(|l| (l.id, l.token, l.ttl, l.exp));
            prop_assert_eq!(got_lease, want_lease, "lease of {}", name);
            if let Some(l) = &got.lease {
                prop_assert!(ids.insert(l.lease_id), "lease id on two resources");
            }
            let got_q: Vec<(&str, LeaseId, u64)> = got
                .waiters
                .iter()
                .map(|w| (w.request_id.as_str(), w.lease_id, w.deadline_ms))
                .collect();
            let want_q: Vec<(&str, LeaseId, u64)> = want
                .queue
                .iter()
                .map(|w| (w.rid.as_str(), w.id, w.deadline))
                .collect();
            prop_assert_eq!(got_q, want_q, "queue of {}", name);
            let mut rids: Vec<&str> = got.waiters.iter().map(|w| w.request_id.as_str()).collect();
            rids.sort_unstable();
            rids.dedup();
            prop_assert_eq!(rids.len(), got.waiters.len(), "a request waits twice");
            prop_assert_eq!(got.last_token, want.last_token);
            prop_assert_eq!(got.idle_until_ms, want.idle_until);
            prop_assert_eq!(got.admitted, want.admitted);
            prop_assert_eq!(got.reissue_at_ms, want.reissue_at);
            let grants: Vec<(u64, u64, u64)> = got
                .grants
                .iter()
                .map(|g| (g.proxy, g.fencing_token, g.until_ms))
                .collect();
            prop_assert_eq!(&grants, &want.grants, "proxy grants of {}", name);
            // Epoch barrier: no token newer than one a proxy may still forward with.
            if let Some(l) = &got.lease {
                prop_assert!(
                    got.grants
                        .iter()
                        .all(|g| g.fencing_token >= l.fencing_token || g.until_ms <= m.now_ms()),
                    "token {} issued on {} while a grant for an older token lives",
                    l.fencing_token,
                    name
                );
            }
        }
        prop_assert_eq!(image.gc_floor, self.model.gc_floor);
        let stats = m.stats();
        prop_assert_eq!(stats.resources as usize, self.model.res.len());
        prop_assert_eq!(stats.waiters as usize, self.model.total_waiters());
        prop_assert_eq!(stats.dedup_records as usize, self.model.dedup.len());
        let mut dedup: Vec<DedupKey> = image.dedup_records.iter().map(|e| e.0).collect();
        dedup.sort_unstable();
        let mut want: Vec<DedupKey> = self
            .model
            .dedup
            .keys()
            .map(|(r, q)| dedup_key(r, q))
            .collect();
        want.sort_unstable();
        prop_assert_eq!(dedup, want);
        Ok(())
    }
}
