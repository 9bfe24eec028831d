//! The quota ledger: global rate limits split into leased shares, one per proxy.
//!
//! A quota gives every tenant a global refill rate R (requests per second) and burst B. The
//! ledger leases each fencing proxy a *rate share* and a *burst share* of one tenant's R and B
//! for a bounded time; the proxy enforces its shares locally with a token bucket, so no request
//! waits for a cross-node decision.
//!
//! **Conservation.** A lease counts over `[activates_at_ms, expires_at_ms)` of log time until it
//! is returned. At every log time, per (quota, tenant), the rate shares of the leases that count
//! sum to at most R and the burst shares to at most B. Every grant is sized against the peak
//! usage over its whole interval, so the invariant holds for all future log times, not only
//! now, and nothing but a return or an expiry ever frees capacity.
//!
//! **Renewal** appends a *successor* to a lease: the same or smaller shares, counting from the
//! moment the renewed lease expires. A successor never grows, so a proxy that switches to it a
//! little early (it judges time from when it sent the request) never uses more than the ledger
//! counts for it. Growth is a separate, fresh lease that counts from the stamped time; a proxy
//! starts using it only once the answer arrived, which is after the stamp.
//!
//! **Rebalancing.** With each request the proxy reports its demand. The ledger computes a
//! target per proxy (demand-proportional above a floor of one request's burst for every proxy
//! with demand; spare capacity split evenly) and moves capacity only
//! by shrinking a cold proxy's successor; the freed capacity is granted to a hot proxy once the
//! cold proxy's current lease has expired or been returned, since until then it still counts.
//!
//! Shares are in thousandths (of a request per second, and of a request) so that integer
//! arithmetic splits small quotas fairly and deterministically on every replica.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::wire::{
    LeaseId, MAX_QUOTA_BURST, MAX_QUOTA_LEASE_MS, MAX_QUOTA_NAME_LEN, MAX_QUOTA_RATE_PER_S,
    MIN_QUOTA_LEASE_MS,
};

/// Thousandths per unit: shares are kept in milli-requests (per second).
pub const MILLI: u64 = 1000;

/// A proxy holds at most this many lease chains per (quota, tenant): growth adds a chain, so
/// this bounds the ledger's size per proxy.
pub const MAX_CHAINS: usize = 3;

/// What a proxy does when it cannot renew.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum QuotaPolicy {
    /// Stop admitting when the lease expires: zero overshoot, temporary under-use.
    #[default]
    Strict,
    /// Keep admitting up to `allowance` requests per proxy while disconnected: the worst-case
    /// overshoot is the sum of the proxies' allowances.
    Emergency { allowance: u64 },
}

impl QuotaPolicy {
    /// The policy a config file or an operator names: `policy` (`strict` when absent) and the
    /// emergency allowance, which `emergency` requires (> 0) and `strict` refuses (an
    /// allowance of 0 counts as none). One check for both, so that they accept the same
    /// definitions.
    pub fn from_parts(policy: Option<&str>, allowance: Option<u64>) -> Result<Self, String> {
        match (policy.unwrap_or("strict"), allowance) {
            ("strict", None | Some(0)) => Ok(QuotaPolicy::Strict),
            ("emergency", Some(allowance)) if allowance > 0 => {
                Ok(QuotaPolicy::Emergency { allowance })
            }
            ("strict", Some(_)) => Err(
                "a strict quota has no allowance: drop 'allowance' or use policy 'emergency'"
                    .into(),
            ),
            ("emergency", _) => Err(
                "policy 'emergency' needs 'allowance' > 0 (requests per proxy while cut off)"
                    .into(),
            ),
            (other, _) => Err(format!(
                "unknown policy '{other}': use 'strict' or 'emergency'"
            )),
        }
    }
}

/// A quota definition: every tenant gets `rate_per_s` and `burst` globally.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaSpec {
    pub name: String,
    pub rate_per_s: u64,
    pub burst: u64,
    pub lease_ms: u64,
    #[serde(flatten)]
    pub policy: QuotaPolicy,
}

impl QuotaSpec {
    /// Checks a definition from a config file or an operator: a sentence saying what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let name_ok = self.name.len() <= MAX_QUOTA_NAME_LEN
            && !self.name.is_empty()
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(format!(
                "quota name '{}' must be 1–{MAX_QUOTA_NAME_LEN} letters, digits, '.', '_' or '-'",
                self.name
            ));
        }
        if self.rate_per_s == 0 || self.burst == 0 {
            return Err(format!(
                "quota {}: rate_per_s and burst must be > 0",
                self.name
            ));
        }
        // Shares are kept in thousandths and proxies' balances in millionths of a request:
        // above these bounds the sums would overflow.
        if self.rate_per_s > MAX_QUOTA_RATE_PER_S || self.burst > MAX_QUOTA_BURST {
            return Err(format!(
                "quota {}: rate_per_s ({}) must be at most {MAX_QUOTA_RATE_PER_S} and burst ({}) \
                 at most {MAX_QUOTA_BURST}",
                self.name, self.rate_per_s, self.burst
            ));
        }
        if self.policy == (QuotaPolicy::Emergency { allowance: 0 }) {
            return Err(format!(
                "quota {}: policy 'emergency' needs 'allowance' > 0 (requests per proxy while \
                 cut off)",
                self.name
            ));
        }
        if !(MIN_QUOTA_LEASE_MS..=MAX_QUOTA_LEASE_MS).contains(&self.lease_ms) {
            return Err(format!(
                "quota {}: lease_ms ({}) must be between {MIN_QUOTA_LEASE_MS} and \
                 {MAX_QUOTA_LEASE_MS}",
                self.name, self.lease_ms
            ));
        }
        Ok(())
    }

    fn rate_cap(&self) -> u64 {
        self.rate_per_s.saturating_mul(MILLI)
    }
    fn burst_cap(&self) -> u64 {
        self.burst.saturating_mul(MILLI)
    }
    /// The smallest rate share whose burst share ([`QuotaSpec::burst_for`]) holds one whole
    /// request, in milli-requests per second, even split over [`MAX_CHAINS`] leases (each
    /// rounds its burst share down by less than a thousandth).
    fn floor_rate(&self) -> u64 {
        if self.burst == 0 {
            return 0;
        }
        (u128::from(MILLI + MAX_CHAINS as u64) * u128::from(self.rate_per_s))
            .div_ceil(u128::from(self.burst))
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// The burst share that goes with a rate share: the same fraction of B as of R.
    fn burst_for(&self, rate_milli: u64) -> u64 {
        if self.rate_per_s == 0 {
            return 0;
        }
        (u128::from(rate_milli) * u128::from(self.burst) / u128::from(self.rate_per_s))
            .try_into()
            .unwrap_or(u64::MAX)
    }
}

/// One leased share of a (quota, tenant) pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaLease {
    pub lease_id: LeaseId,
    pub quota: String,
    pub tenant: String,
    pub proxy: u64,
    /// Milli-requests per second.
    pub rate_milli: u64,
    /// Milli-requests.
    pub burst_milli: u64,
    /// Monotonic across the ledger: a proxy ignores answers older than one it applied.
    pub epoch: u64,
    pub activates_at_ms: u64,
    pub expires_at_ms: u64,
    /// The lease this one succeeds (same chain), if it is a renewal.
    #[serde(default)]
    pub follows: Option<LeaseId>,
    /// The request that created it, so that a retried request gets the same answer.
    pub request_id: LeaseId,
    /// The proxy's demand reported with that request, in milli-requests per second.
    pub demand_milli: u64,
}

/// A proxy's lease request: renew its current chains and, if its target allows, grow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaRequest {
    pub quota: String,
    pub tenant: String,
    pub proxy: u64,
    /// Random, chosen by the proxy; new leases get ids derived from it.
    pub request_id: LeaseId,
    /// The proxy's current leases to renew (each gets at most one successor).
    pub renew: Vec<LeaseId>,
    /// Admission demand the proxy observed, in milli-requests per second.
    pub demand_milli: u64,
}

/// The answer to a lease request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaOutcome {
    Leased(QuotaGrant),
    /// No quota of that name is defined.
    UnknownQuota,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaGrant {
    pub spec: QuotaSpec,
    /// The leases this request created (successors and growth); empty when nothing fitted.
    pub leases: Vec<QuotaLease>,
    /// The rate share the proxy should hold, so it knows to ask again for growth.
    pub target_milli: u64,
    /// Log time at which the answer was decided (the stamp lease times are relative to).
    pub now_ms: u64,
    /// When the proxy holds less than its target after this request: the earliest log time
    /// from which the leases booked now leave capacity free for a fresh lease (when a
    /// rate-limited client may expect this proxy to have more). `None` when it is not short.
    #[serde(default)]
    pub free_at_ms: Option<u64>,
}

/// The replicated quota ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaLedger {
    #[serde(default)]
    specs: BTreeMap<String, QuotaSpec>,
    #[serde(default)]
    leases: BTreeMap<LeaseId, QuotaLease>,
    #[serde(default)]
    epoch: u64,
    /// How many successors were granted smaller than the lease they renew.
    #[serde(default)]
    rebalances: u64,
    /// The latest demand each proxy reported per pool, also from proxies that hold nothing
    /// (a hot proxy waiting for capacity must count when a cold one renews).
    #[serde(default)]
    demand: Vec<DemandReport>,
    /// Quotas an operator set at run time: the proxies' config files no longer redefine them.
    #[serde(default)]
    pinned: std::collections::BTreeSet<String>,
}

/// A proxy's demand report, remembered for two lease durations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemandReport {
    pub quota: String,
    pub tenant: String,
    pub proxy: u64,
    pub demand_milli: u64,
    pub until_ms: u64,
}

impl QuotaLedger {
    pub fn spec(&self, name: &str) -> Option<&QuotaSpec> {
        self.specs.get(name)
    }

    pub fn specs(&self) -> impl Iterator<Item = &QuotaSpec> {
        self.specs.values()
    }

    /// Every lease still on the ledger (expired ones linger until the next command on their
    /// pool or a sweep; they no longer count).
    pub fn leases(&self) -> impl Iterator<Item = &QuotaLease> {
        self.leases.values()
    }

    pub fn rebalances(&self) -> u64 {
        self.rebalances
    }

    /// Defines or redefines a quota from a proxy's config file, unless an operator set it at
    /// run time. Leases already granted keep their shares until they end.
    pub fn define(&mut self, spec: QuotaSpec) {
        if !self.pinned.contains(&spec.name) {
            self.specs.insert(spec.name.clone(), spec);
        }
    }

    /// Sets a quota at run time (an operator's change): it wins over every config file from
    /// now on. Conservation across the change: leases granted before keep their shares and
    /// count until they expire or are returned; every lease granted after is sized against
    /// the new limits *with the old leases counted* (capacity above the new limits is never
    /// free), and successors never grow. So at every log time the pool holds at most the
    /// larger of the new limits and what the old leases still hold, and once they are gone
    /// it is within the new R and B.
    pub fn set(&mut self, spec: QuotaSpec) {
        self.pinned.insert(spec.name.clone());
        self.specs.insert(spec.name.clone(), spec);
    }

    /// Whether an operator set this quota at run time.
    pub fn is_pinned(&self, name: &str) -> bool {
        self.pinned.contains(name)
    }

    /// The demand each proxy last reported per pool (for operators: utilisation).
    pub fn demand(&self) -> impl Iterator<Item = &DemandReport> {
        self.demand.iter()
    }

    /// Returns leases (any that exist); idempotent. Their capacity is free at once.
    pub fn give_back(&mut self, ids: &[LeaseId]) -> u32 {
        let gone: Vec<QuotaLease> = ids.iter().filter_map(|id| self.leases.remove(id)).collect();
        // A proxy that gave back all it held in a pool has left it (shutdown, route removed):
        // its demand no longer claims a share of the pool.
        for l in &gone {
            if !self.pool(&l.quota, &l.tenant).any(|x| x.proxy == l.proxy) {
                self.demand.retain(|d| {
                    !(d.proxy == l.proxy && d.quota == l.quota && d.tenant == l.tenant)
                });
            }
        }
        gone.len() as u32
    }

    /// Drops leases that ended at or before `now`.
    pub fn expire(&mut self, now: u64) -> u32 {
        let before = self.leases.len();
        self.leases.retain(|_, l| l.expires_at_ms > now);
        self.demand.retain(|d| d.until_ms > now);
        (before - self.leases.len()) as u32
    }

    /// Leader change: every deadline after `prev` moves `by` later, so a lease keeps its
    /// remaining time (as the lock leases do) and a chain stays contiguous. Shifting every
    /// future boundary by the same amount keeps the usage profile's shape, so conservation
    /// still holds.
    pub fn shift(&mut self, prev: u64, by: u64) {
        for l in self.leases.values_mut() {
            if l.expires_at_ms > prev {
                l.expires_at_ms = l.expires_at_ms.saturating_add(by);
                if l.activates_at_ms > prev {
                    l.activates_at_ms = l.activates_at_ms.saturating_add(by);
                }
            }
        }
    }

    /// Applies a lease request at log time `now`.
    pub fn request(&mut self, req: &QuotaRequest, now: u64) -> QuotaOutcome {
        let Some(spec) = self.specs.get(&req.quota).cloned() else {
            return QuotaOutcome::UnknownQuota;
        };
        self.expire(now);
        self.report(&spec, req, now);
        let target = self.target(&spec, req);
        // A retry of a request already applied answers what it created.
        let earlier: Vec<QuotaLease> = self
            .leases
            .values()
            .filter(|l| l.request_id == req.request_id)
            .cloned()
            .collect();
        if !earlier.is_empty() {
            let free_at_ms = self.free_at_if_short(&spec, req, target, now);
            return QuotaOutcome::Leased(QuotaGrant {
                spec,
                leases: earlier,
                target_milli: target,
                now_ms: now,
                free_at_ms,
            });
        }
        self.epoch += 1;
        let mut remaining = target;
        let mut created = Vec::new();
        let mut next_id = req.request_id.0;
        let lapse = self.chain_to_lapse(req, target, now);
        for id in &req.renew {
            if Some(*id) == lapse {
                continue;
            }
            let Some(old) = self.leases.get(id).cloned() else {
                continue;
            };
            let has_successor = self.leases.values().any(|l| l.follows == Some(*id));
            // Only a lease that counts now is renewed: renewing a successor that has not
            // started yet would book capacity ever further ahead at today's share.
            if old.proxy != req.proxy
                || old.quota != req.quota
                || old.tenant != req.tenant
                || old.activates_at_ms > now
                || has_successor
            {
                continue;
            }
            let from = old.expires_at_ms;
            let until = from.saturating_add(spec.lease_ms);
            let (free_rate, free_burst) = self.free(&spec, &req.tenant, from, until);
            let rate = old.rate_milli.min(remaining).min(free_rate);
            let burst = old.burst_milli.min(spec.burst_for(rate)).min(free_burst);
            if rate < old.rate_milli {
                self.rebalances += 1;
            }
            if rate == 0 && burst == 0 {
                continue;
            }
            remaining -= rate;
            let lease = self.new_lease(req, &mut next_id, rate, burst, from, until, Some(*id));
            created.push(lease);
        }
        let chains = self
            .leases
            .values()
            .filter(|l| {
                l.proxy == req.proxy
                    && l.quota == req.quota
                    && l.tenant == req.tenant
                    && l.activates_at_ms <= now
                    && !created.iter().any(|c| c.follows == Some(l.lease_id))
            })
            .count()
            + created.len();
        if remaining > 0 && chains < MAX_CHAINS {
            let until = now.saturating_add(spec.lease_ms);
            let (free_rate, free_burst) = self.free(&spec, &req.tenant, now, until);
            let rate = remaining.min(free_rate);
            let burst = spec.burst_for(rate).min(free_burst);
            if rate > 0 || burst > 0 {
                let lease = self.new_lease(req, &mut next_id, rate, burst, now, until, None);
                created.push(lease);
            }
        }
        let free_at_ms = self.free_at_if_short(&spec, req, target, now);
        QuotaOutcome::Leased(QuotaGrant {
            spec,
            leases: created,
            target_milli: target,
            now_ms: now,
            free_at_ms,
        })
    }

    /// If the requester holds less than `target` at `now`: the earliest log time from which
    /// a fresh lease would find rate and burst free over its whole interval, under the leases
    /// booked now. Usage only falls where a lease ends, so those are the candidates.
    fn free_at_if_short(
        &self,
        spec: &QuotaSpec,
        req: &QuotaRequest,
        target: u64,
        now: u64,
    ) -> Option<u64> {
        let held: u64 = self
            .pool(&req.quota, &req.tenant)
            .filter(|l| l.proxy == req.proxy && l.activates_at_ms <= now && now < l.expires_at_ms)
            .map(|l| l.rate_milli)
            .fold(0, u64::saturating_add);
        if held >= target {
            return None;
        }
        let mut points: Vec<u64> = self
            .pool(&req.quota, &req.tenant)
            .map(|l| l.expires_at_ms)
            .filter(|&t| t > now)
            .collect();
        points.push(now);
        points.sort_unstable();
        points.dedup();
        points.into_iter().find(|&t| {
            let (rate, burst) = self.free(spec, &req.tenant, t, t.saturating_add(spec.lease_ms));
            rate > 0 && burst > 0
        })
    }

    /// A proxy holding its maximum of chains but less than its target lets its smallest chain
    /// lapse instead of renewing it, so that a later request can grow by one larger lease
    /// once it has expired. Without this a proxy holding several small chains could never
    /// reach its target, since a chain never grows.
    fn chain_to_lapse(&self, req: &QuotaRequest, target: u64, now: u64) -> Option<LeaseId> {
        let current: Vec<&QuotaLease> = self
            .pool(&req.quota, &req.tenant)
            .filter(|l| l.proxy == req.proxy && l.activates_at_ms <= now && now < l.expires_at_ms)
            .collect();
        let held: u64 = current.iter().map(|l| l.rate_milli).sum();
        if current.len() < MAX_CHAINS || held >= target {
            return None;
        }
        current
            .iter()
            .filter(|l| req.renew.contains(&l.lease_id))
            .filter(|l| !self.leases.values().any(|x| x.follows == Some(l.lease_id)))
            .min_by_key(|l| (l.rate_milli, l.lease_id))
            .map(|l| l.lease_id)
    }

    #[allow(clippy::too_many_arguments)]
    fn new_lease(
        &mut self,
        req: &QuotaRequest,
        next_id: &mut u128,
        rate_milli: u64,
        burst_milli: u64,
        activates_at_ms: u64,
        expires_at_ms: u64,
        follows: Option<LeaseId>,
    ) -> QuotaLease {
        // Ids derive from the proxy's random request id; skip any (astronomically unlikely)
        // collision rather than overwrite a lease that still counts.
        while self.leases.contains_key(&LeaseId(*next_id)) {
            *next_id = next_id.wrapping_add(1);
        }
        let lease = QuotaLease {
            lease_id: LeaseId(*next_id),
            quota: req.quota.clone(),
            tenant: req.tenant.clone(),
            proxy: req.proxy,
            rate_milli,
            burst_milli,
            epoch: self.epoch,
            activates_at_ms,
            expires_at_ms,
            follows,
            request_id: req.request_id,
            demand_milli: req.demand_milli,
        };
        *next_id = next_id.wrapping_add(1);
        self.leases.insert(lease.lease_id, lease.clone());
        lease
    }

    /// The requester's fair rate share: proportional to demand when the pool is
    /// oversubscribed, otherwise its demand plus an even split of the spare capacity (so a
    /// quiet proxy keeps headroom for a sudden burst of its own). The spare is split one way
    /// more than there are proxies reporting: the extra part stays free for a proxy that has
    /// not asked yet, so a tenant's first requests at a second proxy find capacity at once
    /// instead of waiting for the first proxy's lease to end.
    ///
    /// Every proxy with demand is owed at least [`QuotaSpec::floor_rate`], the rate whose burst
    /// share holds one whole request, when the pool has room for that much per proxy: below it
    /// a share can never admit a request (its bucket never holds one), so a proxy with little
    /// demand next to a hot one was refused forever. Only what exceeds the floors is split in
    /// proportion to demand.
    fn target(&self, spec: &QuotaSpec, req: &QuotaRequest) -> u64 {
        let cap = u128::from(spec.rate_cap());
        let reports = || {
            self.demand
                .iter()
                .filter(|d| d.quota == req.quota && d.tenant == req.tenant)
                .map(|d| u128::from(d.demand_milli))
        };
        let proxies = reports().count() as u128;
        let demanding = reports().filter(|&d| d > 0).count() as u128;
        let floor = u128::from(spec.floor_rate());
        let floor = if floor * demanding <= cap { floor } else { 0 };
        // Demand as it counts: at least the floor for a proxy that has any.
        let wanted = |d: u128| if d > 0 { d.max(floor) } else { 0 };
        let total: u128 = reports().map(wanted).sum();
        let mine = wanted(u128::from(req.demand_milli));
        let share = if total > cap {
            // Each demanding proxy keeps its floor; the rest goes by demand above it.
            let above = total - floor * demanding;
            if mine == 0 || above == 0 {
                mine.min(cap / demanding.max(1))
            } else {
                floor + (cap - floor * demanding) * (mine - floor) / above
            }
        } else {
            mine + (cap - total) / (proxies + 1)
        };
        share.try_into().unwrap_or(u64::MAX)
    }

    fn report(&mut self, spec: &QuotaSpec, req: &QuotaRequest, now: u64) {
        let until_ms = now.saturating_add(spec.lease_ms.saturating_mul(2));
        let report = DemandReport {
            quota: req.quota.clone(),
            tenant: req.tenant.clone(),
            proxy: req.proxy,
            demand_milli: req.demand_milli,
            until_ms,
        };
        match self
            .demand
            .iter_mut()
            .find(|d| d.proxy == req.proxy && d.quota == req.quota && d.tenant == req.tenant)
        {
            Some(d) => *d = report,
            None => self.demand.push(report),
        }
    }

    fn pool<'a>(&'a self, quota: &'a str, tenant: &'a str) -> impl Iterator<Item = &'a QuotaLease> {
        self.leases
            .values()
            .filter(move |l| l.quota == quota && l.tenant == tenant)
    }

    /// Capacity free over all of `[from, until)`: the caps minus the peak usage in it.
    fn free(&self, spec: &QuotaSpec, tenant: &str, from: u64, until: u64) -> (u64, u64) {
        let (rate, burst) = self.peak_usage(&spec.name, tenant, from, until);
        (
            spec.rate_cap().saturating_sub(rate),
            spec.burst_cap().saturating_sub(burst),
        )
    }

    /// The highest (rate, burst) sums of the pool's leases at any log time in `[from, until)`.
    /// Usage only changes where a lease starts, so checking `from` and every activation inside
    /// the interval suffices.
    pub fn peak_usage(&self, quota: &str, tenant: &str, from: u64, until: u64) -> (u64, u64) {
        let pool: Vec<&QuotaLease> = self.pool(quota, tenant).collect();
        let mut points = vec![from];
        points.extend(
            pool.iter()
                .map(|l| l.activates_at_ms)
                .filter(|&t| t > from && t < until),
        );
        let mut peak = (0u64, 0u64);
        for t in points {
            let (mut r, mut b) = (0u64, 0u64);
            for l in pool
                .iter()
                .filter(|l| l.activates_at_ms <= t && t < l.expires_at_ms)
            {
                r = r.saturating_add(l.rate_milli);
                b = b.saturating_add(l.burst_milli);
            }
            peak = (peak.0.max(r), peak.1.max(b));
        }
        peak
    }

    /// Checks conservation at every log time from `now` on, for every pool. For tests and
    /// metrics.
    pub fn check_conservation(&self, now: u64) -> Result<(), String> {
        let pools: std::collections::BTreeSet<(&str, &str)> = self
            .leases
            .values()
            .map(|l| (l.quota.as_str(), l.tenant.as_str()))
            .collect();
        for (quota, tenant) in pools {
            let Some(spec) = self.specs.get(quota) else {
                return Err(format!("lease of undefined quota {quota}"));
            };
            let (r, b) = self.peak_usage(quota, tenant, now, u64::MAX);
            if r > spec.rate_cap() || b > spec.burst_cap() {
                return Err(format!(
                    "{quota}/{tenant}: peak rate {r} of {} milli/s, burst {b} of {} milli",
                    spec.rate_cap(),
                    spec.burst_cap()
                ));
            }
        }
        Ok(())
    }
}
