//! Per-proxy enforcement of global rate limits: one token bucket per (quota, tenant) pool,
//! kept supplied with leased shares by a background lessor task.
//!
//! A request never waits for the cluster: [`QuotaLimiter::admit`] only looks at the local
//! bucket. The first request of a tenant creates its pool and starts its lessor (that request
//! is refused: the pool holds nothing yet). The lessor reports the demand it saw (requests
//! offered per second, admitted or not) with every lease request, renews the leases it holds
//! before they run out, asks again sooner while it holds less than the ledger's target for it,
//! and gives everything back once the tenant has been quiet for two lease durations.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::machine::{
    Command, LeaseId, QuotaGrant, QuotaOutcome, QuotaPolicy, QuotaRequest, QuotaSpec, Response,
};
use lock_core::node::Node;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::sync::Notify;

use super::bucket::{Bucket, Expected, Refusal, Share};
use super::demand::DemandMeter;

/// Pools one proxy keeps at most (tenants are client-chosen header values).
pub const MAX_POOLS: usize = 4_096;

/// Why [`QuotaLimiter::admit`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limited {
    /// When a retry may succeed, if that is known.
    pub retry_after: Option<Duration>,
}

pub struct QuotaLimiter {
    node: Arc<Node>,
    specs: HashMap<String, QuotaSpec>,
    pools: parking_lot::Mutex<HashMap<(String, String), Arc<Pool>>>,
    /// Local time is milliseconds since this instant (monotonic).
    base: Instant,
    metrics: QuotaMetrics,
    /// Set (and notified) when the proxy stops: lessors give their leases back and end.
    stopped: AtomicBool,
    stop: Notify,
    /// Demonstrations only: a renewal refills the bucket (see `ProxyConfig`).
    unsafe_refill_on_renew: bool,
}

struct Pool {
    state: parking_lot::Mutex<PoolState>,
    /// Woken each time the lessor applies an answer of the ledger.
    answered: Notify,
}

/// How long a tenant's first request at a proxy may wait for what a new pool lacks — its first
/// lease (one raft commit) and a first request's worth of refill (a share starts empty) —
/// before it is refused like any request over the limit.
const FIRST_REQUEST_WAIT: Duration = Duration::from_secs(1);

struct PoolState {
    bucket: Bucket,
    /// Weighted requests offered (admitted or not), for the demand the lessor reports.
    demand: DemandMeter,
    /// Weighted requests admitted since the lessor's last report.
    admitted: u64,
    last_request_ms: u64,
    /// Leases held, by id: local end and whether a successor is held.
    held: HashMap<LeaseId, Held>,
    /// Highest ledger epoch applied: older answers are ignored.
    epoch: u64,
    /// Whether this pool has admitted a request yet.
    admitted_any: bool,
}

#[derive(Clone, Copy)]
struct Held {
    until_ms: u64,
    rate_milli: u64,
    renewed: bool,
}

impl QuotaLimiter {
    pub fn new(node: Arc<Node>, specs: &[QuotaSpec], registry: &Registry) -> Self {
        QuotaLimiter {
            node,
            specs: specs.iter().map(|s| (s.name.clone(), s.clone())).collect(),
            pools: parking_lot::Mutex::new(HashMap::new()),
            base: Instant::now(),
            metrics: QuotaMetrics::new(registry),
            stopped: AtomicBool::new(false),
            stop: Notify::new(),
            unsafe_refill_on_renew: false,
        }
    }

    /// DEMONSTRATIONS ONLY: refill each bucket to its burst share whenever a lease of its pool
    /// is renewed — the mistake the "a renewal never refills" rule exists to prevent; the
    /// chaos harness turns it on to prove its quota check catches the overshoot.
    pub fn with_unsafe_refill_on_renew(mut self, on: bool) -> Self {
        self.unsafe_refill_on_renew = on;
        self
    }

    /// Stops every lessor; each gives its leases back (best effort) before it ends.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.stop.notify_waiters();
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// Admits a request of weight `cost` for `tenant` under `quota`, from the local bucket.
    /// A pool that has admitted nothing yet (the tenant's first requests at this proxy, or the
    /// first since its quiet pool gave its shares back) has no share, or an empty one: its
    /// requests wait up to [`FIRST_REQUEST_WAIT`] for the lease and the refill instead of
    /// being refused at once. Every other request is decided at once.
    pub async fn admit(
        self: &Arc<Self>,
        quota: &str,
        tenant: &str,
        cost: u64,
    ) -> Result<(), Limited> {
        let now = self.now_ms();
        let Some(pool) = self.pool(quota, tenant, now) else {
            self.count(quota, tenant, "rejected");
            return Err(Limited { retry_after: None });
        };
        let give_up = now + FIRST_REQUEST_WAIT.as_millis() as u64;
        let mut taken = Self::take(&pool, cost, now, true);
        while let Err(refusal) = taken {
            let answered = pool.answered.notified();
            if pool.state.lock().admitted_any {
                break;
            }
            let now = self.now_ms();
            if now >= give_up {
                break;
            }
            // Until the refill the bucket names, or else the ledger's next answer (a share
            // expected now is one still being leased).
            let until = match refusal.retry_at_ms {
                Some(at) if at > now => at.min(give_up),
                _ => give_up,
            };
            let _ = tokio::time::timeout(Duration::from_millis(until - now), answered).await;
            taken = Self::take(&pool, cost, self.now_ms(), false);
        }
        match taken {
            Ok(()) => {
                self.count(quota, tenant, "admitted");
                Ok(())
            }
            Err(refusal) => {
                self.count(quota, tenant, "rejected");
                let now = self.now_ms();
                // The share is leased again within a lease's duration, and may be larger then
                // (after a leader change or another proxy's exit, a share is small for a
                // moment): a hint past that would keep clients away for nothing.
                let lease = self.specs.get(quota).map_or(u64::MAX, |s| s.lease_ms);
                Err(Limited {
                    retry_after: refusal
                        .retry_at_ms
                        .map(|at| Duration::from_millis(at.saturating_sub(now).min(lease))),
                })
            }
        }
    }

    /// One try at `pool`'s bucket; `offered` counts the request toward the tenant's demand
    /// (once per request, not per try).
    fn take(pool: &Pool, cost: u64, now: u64, offered: bool) -> Result<(), Refusal> {
        let mut st = pool.state.lock();
        if offered {
            st.demand.offer(cost);
        }
        st.last_request_ms = now;
        let taken = st.bucket.try_take(cost, now);
        if taken.is_ok() {
            st.admitted = st.admitted.saturating_add(cost);
            st.admitted_any = true;
        }
        taken
    }

    fn count(&self, quota: &str, tenant: &str, outcome: &str) {
        let tenant = self.metrics.label(tenant);
        self.metrics
            .decisions
            .with_label_values(&[quota, tenant, outcome])
            .inc();
    }

    /// The tenant's pool, created (with its lessor) on first use.
    fn pool(self: &Arc<Self>, quota: &str, tenant: &str, now: u64) -> Option<Arc<Pool>> {
        let spec = self.specs.get(quota)?;
        let key = (quota.to_string(), tenant.to_string());
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get(&key) {
            return Some(p.clone());
        }
        if pools.len() >= MAX_POOLS {
            return None;
        }
        // The tenant's counts start at 0, so its first rejection shows as an increase.
        let label = self.metrics.label(tenant);
        for outcome in ["admitted", "rejected"] {
            self.metrics
                .decisions
                .with_label_values(&[quota, label, outcome]);
        }
        let mut bucket = Bucket::new(now, allowance_of(spec));
        // The first lease is being asked for right now.
        bucket.set_expected(Some(Expected {
            at_ms: now,
            rate_milli: 0,
        }));
        let pool = Arc::new(Pool {
            state: parking_lot::Mutex::new(PoolState {
                bucket,
                demand: DemandMeter::new(now),
                admitted: 0,
                last_request_ms: now,
                held: HashMap::new(),
                epoch: 0,
                admitted_any: false,
            }),
            answered: Notify::new(),
        });
        pools.insert(key.clone(), pool.clone());
        tokio::spawn(self.clone().lessor(spec.clone(), key.1, pool.clone()));
        Some(pool)
    }

    /// Keeps one pool supplied with leases until its tenant has been quiet for two lease
    /// durations, then gives them back.
    async fn lessor(self: Arc<Self>, mut spec: QuotaSpec, tenant: String, pool: Arc<Pool>) {
        let mut reported_at = self.now_ms();
        // This proxy's config is the definition it enforces: write it to the ledger if the
        // ledger's differs (a changed config file takes effect when its proxy next leases) —
        // unless an operator set the quota at run time, which wins over config files.
        let (known, pinned) = self.node.machine.read(|m| {
            let q = m.quotas();
            (q.spec(&spec.name).cloned(), q.is_pinned(&spec.name))
        });
        if known.as_ref() != Some(&spec) && !pinned {
            if let Err(e) = self.node.propose(Command::QuotaDefine(spec.clone())).await {
                tracing::warn!(quota = %spec.name, error = %e, "quota define failed");
            }
        }
        loop {
            let lease_ms = spec.lease_ms;
            let now = self.now_ms();
            let (renew, demand_milli, quiet) = {
                let mut st = pool.state.lock();
                st.held.retain(|_, h| h.until_ms > now);
                let renew: Vec<LeaseId> = st
                    .held
                    .iter()
                    .filter(|(_, h)| !h.renewed)
                    .map(|(id, _)| *id)
                    .collect();
                let elapsed = now.saturating_sub(reported_at).max(1);
                let demand = st.demand.report(now, lease_ms);
                // Utilisation: what was admitted against the rate share held now (a share
                // that changed during the interval makes this approximate).
                let used = st.admitted.saturating_mul(1_000_000) / elapsed;
                let held = st.bucket.rate_at(now);
                let utilisation = if held > 0 {
                    used as f64 / held as f64
                } else {
                    0.0
                };
                if let Some(g) = self.metrics.share_gauges(&spec.name, &tenant) {
                    g.utilisation.set(utilisation);
                }
                st.admitted = 0;
                let quiet = now.saturating_sub(st.last_request_ms) > 2 * lease_ms;
                (renew, demand, quiet)
            };
            reported_at = now;
            if quiet || self.stopped.load(Ordering::SeqCst) {
                self.retire(&spec.name, &tenant, &pool).await;
                return;
            }
            let req = QuotaRequest {
                quota: spec.name.clone(),
                tenant: tenant.clone(),
                proxy: self.node.id,
                request_id: LeaseId(rand::random()),
                renew,
                demand_milli,
            };
            let sent = self.now_ms();
            let answer = self.node.propose(Command::QuotaLease(req)).await;
            let received = self.now_ms();
            let next = match answer {
                Ok(Response::Quota(QuotaOutcome::Leased(grant))) => {
                    if grant.spec != spec {
                        // Changed at run time (or by another proxy's config): the ledger's
                        // definition is the one in force.
                        spec = grant.spec.clone();
                        pool.state.lock().bucket.set_allowance(allowance_of(&spec));
                    }
                    self.apply_grant(&spec, &tenant, &pool, &grant, sent, received)
                }
                Ok(Response::Quota(QuotaOutcome::UnknownQuota)) => {
                    // The cluster has not heard of this quota yet: define it and ask again.
                    if let Err(e) = self.node.propose(Command::QuotaDefine(spec.clone())).await {
                        tracing::warn!(quota = %spec.name, error = %e, "quota define failed");
                    }
                    continue;
                }
                other => {
                    if let Err(e) = &other {
                        tracing::debug!(quota = %spec.name, %tenant, error = %e, "quota lease failed");
                    }
                    let mut st = pool.state.lock();
                    st.bucket.set_connected(false);
                    let retry = received + (lease_ms / 10).max(50);
                    st.bucket.set_expected(None);
                    retry
                }
            };
            pool.answered.notify_waiters();
            let wait = next.saturating_sub(self.now_ms());
            let stop = self.stop.notified();
            if self.stopped.load(Ordering::SeqCst) {
                continue;
            }
            let _ = tokio::time::timeout(Duration::from_millis(wait), stop).await;
        }
    }

    /// Turns a grant into local shares; returns when to ask next.
    fn apply_grant(
        &self,
        spec: &QuotaSpec,
        tenant: &str,
        pool: &Pool,
        grant: &QuotaGrant,
        sent: u64,
        received: u64,
    ) -> u64 {
        let lease_ms = spec.lease_ms;
        let mut st = pool.state.lock();
        st.bucket.set_connected(true);
        let newest = grant.leases.iter().map(|l| l.epoch).max().unwrap_or(0);
        if newest != 0 && newest < st.epoch {
            // An answer overtaken by a newer one (a retried proposal): ignore it.
            return received;
        }
        st.epoch = st.epoch.max(newest);
        for l in &grant.leases {
            // The end counts from when the request was sent: the ledger's clock had started
            // this lease no earlier, so the proxy stops no later than the ledger stops counting.
            let until = sent.saturating_add(l.expires_at_ms.saturating_sub(grant.now_ms));
            let from = match l.follows.and_then(|p| st.held.get(&p).copied()) {
                // A successor continues its chain: never a larger share, so starting exactly
                // where the renewed lease ends locally is safe.
                Some(prev) => prev.until_ms,
                // A fresh lease counts from its stamp, which came before the answer arrived.
                None => received.saturating_add(l.activates_at_ms.saturating_sub(grant.now_ms)),
            };
            if let Some(prev) = l.follows.and_then(|p| st.held.get_mut(&p)) {
                prev.renewed = true;
                if l.rate_milli < prev.rate_milli {
                    self.metrics
                        .shrinks
                        .with_label_values(&[&spec.name, self.metrics.label(tenant)])
                        .inc();
                }
            }
            st.bucket.add(
                Share {
                    from_ms: from,
                    until_ms: until,
                    rate_milli: l.rate_milli,
                    burst_milli: l.burst_milli,
                },
                received,
            );
            st.held.insert(
                l.lease_id,
                Held {
                    until_ms: until,
                    rate_milli: l.rate_milli,
                    renewed: false,
                },
            );
        }
        let now = received;
        if self.unsafe_refill_on_renew && grant.leases.iter().any(|l| l.follows.is_some()) {
            st.bucket.unsafe_refill(now);
        }
        let rate_now = st.bucket.rate_at(now);
        if let Some(g) = self.metrics.share_gauges(&spec.name, tenant) {
            g.share.set((rate_now / 1_000) as i64);
            g.target.set((grant.target_milli / 1_000) as i64);
            g.burst.set((st.bucket.burst_at(now) / 1_000) as i64);
        }
        let (next, expected) = next_request(
            lease_ms,
            now,
            !st.held.is_empty(),
            st.held.values().filter(|h| !h.renewed).map(|h| h.until_ms),
            rate_now,
            grant.target_milli,
            grant
                .free_at_ms
                .map(|t| received.saturating_add(t.saturating_sub(grant.now_ms))),
        );
        st.bucket.set_expected(expected);
        next
    }

    /// Gives back a quiet pool's leases and forgets it.
    async fn retire(&self, quota: &str, tenant: &str, pool: &Arc<Pool>) {
        let key = (quota.to_string(), tenant.to_string());
        self.pools.lock().remove(&key);
        let ids: Vec<LeaseId> = pool.state.lock().held.keys().copied().collect();
        if !ids.is_empty() {
            // Best effort: an unreturned lease simply expires.
            let _ = self
                .node
                .propose(Command::QuotaReturn { lease_ids: ids })
                .await;
        }
        self.metrics.retire(quota, tenant);
    }
}

/// When the lessor asks next (local time), and what a rate-limited client may expect meanwhile.
///
/// Each chain is renewed half a lease before it ends (`unrenewed` are the local ends of the
/// chains without a successor; `holds_any`: the pool holds any lease). A proxy holding less
/// than its target (or nothing) asks every quarter lease instead, when capacity freed by other
/// proxies may have come back. Never sooner than a quarter lease after this answer, though: a
/// renewal the ledger refused (or a chain it lets lapse) is due at once again, and a pool
/// holding nothing has nothing to renew — asking at once would flood the cluster with
/// commands, and measure nothing new.
///
/// While short, the capacity is expected at the next request, or when the ledger said its
/// booked leases leave capacity free (`free_at`, local), whichever is later: a client told to
/// retry then has a real chance.
fn next_request(
    lease_ms: u64,
    now: u64,
    holds_any: bool,
    unrenewed: impl Iterator<Item = u64>,
    rate_now: u64,
    target_milli: u64,
    free_at: Option<u64>,
) -> (u64, Option<Expected>) {
    let every = (lease_ms / 4).max(50);
    let quarter = now.saturating_add(every);
    let short = rate_now < target_milli || !holds_any;
    let next = if short {
        quarter
    } else {
        unrenewed
            .map(|until| until.saturating_sub(lease_ms / 2))
            .min()
            .map_or(quarter, |renew_at| renew_at.max(quarter))
    };
    // The request that finds the freed capacity: the first one at or after `free_at`.
    let at_ms = match free_at {
        Some(f) if f > next => next.saturating_add((f - next).div_ceil(every) * every),
        _ => next,
    };
    let expected = short.then(|| Expected {
        at_ms,
        rate_milli: target_milli.saturating_sub(rate_now),
    });
    (next, expected)
}

/// The emergency allowance E of a quota (0 under `strict`).
fn allowance_of(spec: &QuotaSpec) -> u64 {
    match spec.policy {
        QuotaPolicy::Strict => 0,
        QuotaPolicy::Emergency { allowance } => allowance,
    }
}

/// Tenants the quota metrics name one by one, per proxy; the ones after are counted together
/// as [`OTHER_TENANTS`]. Without API keys a tenant is whatever a client's header says, and every
/// name would otherwise add series to `/metrics` for good.
const MAX_TENANT_LABELS: usize = 256;

/// The `tenant` label of the tenants beyond [`MAX_TENANT_LABELS`].
const OTHER_TENANTS: &str = "_other";

#[derive(Clone)]
struct QuotaMetrics {
    /// The tenants with labels of their own.
    named: Arc<parking_lot::RwLock<HashSet<String>>>,
    decisions: IntCounterVec,
    share: IntGaugeVec,
    target: IntGaugeVec,
    burst: IntGaugeVec,
    utilisation: GaugeVec,
    shrinks: IntCounterVec,
}

impl QuotaMetrics {
    fn new(registry: &Registry) -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
                .unwrap_or_else(|e| panic!("metric: {e}"))
        };
        let gauge = |name: &str, help: &str| {
            IntGaugeVec::new(Opts::new(name, help), &["quota", "tenant"])
                .unwrap_or_else(|e| panic!("metric: {e}"))
        };
        let m = QuotaMetrics {
            named: Arc::default(),
            decisions: counter(
                "proxy_quota_requests_total",
                "Rate-limited requests by quota, tenant and outcome (admitted, rejected)",
                &["quota", "tenant", "outcome"],
            ),
            share: gauge(
                "proxy_quota_rate_share",
                "Rate share (requests/s) this proxy holds now",
            ),
            target: gauge(
                "proxy_quota_rate_target",
                "Rate share (requests/s) the ledger aims to give this proxy",
            ),
            burst: gauge(
                "proxy_quota_burst_share",
                "Burst share (requests) this proxy holds now",
            ),
            utilisation: GaugeVec::new(
                Opts::new(
                    "proxy_quota_utilisation",
                    "Requests admitted per second over the rate share held, over the last lease \
                     request interval (1 = the share fully used)",
                ),
                &["quota", "tenant"],
            )
            .unwrap_or_else(|e| panic!("metric: {e}")),
            shrinks: counter(
                "proxy_quota_rebalances_total",
                "Renewals whose successor lease was smaller (capacity moved to other proxies)",
                &["quota", "tenant"],
            ),
        };
        // Registering twice (a second proxy in one process) is harmless: keep the first.
        let _ = registry.register(Box::new(m.decisions.clone()));
        let _ = registry.register(Box::new(m.share.clone()));
        let _ = registry.register(Box::new(m.target.clone()));
        let _ = registry.register(Box::new(m.shrinks.clone()));
        let _ = registry.register(Box::new(m.burst.clone()));
        let _ = registry.register(Box::new(m.utilisation.clone()));
        m
    }

    /// `tenant`'s label: its name while fewer than [`MAX_TENANT_LABELS`] tenants have one,
    /// [`OTHER_TENANTS`] after.
    fn label<'a>(&self, tenant: &'a str) -> &'a str {
        if self.named.read().contains(tenant) {
            return tenant;
        }
        let mut named = self.named.write();
        if named.len() < MAX_TENANT_LABELS {
            named.insert(tenant.to_string());
            return tenant;
        }
        OTHER_TENANTS
    }

    /// The gauges of `tenant`'s share, if it has a label of its own: the tenants counted
    /// together have no share of one tenant to show.
    fn share_gauges(&self, quota: &str, tenant: &str) -> Option<ShareGauges> {
        let tenant = self.label(tenant);
        if tenant == OTHER_TENANTS {
            return None;
        }
        let labels = [quota, tenant];
        Some(ShareGauges {
            share: self.share.with_label_values(&labels),
            target: self.target.with_label_values(&labels),
            burst: self.burst.with_label_values(&labels),
            utilisation: self.utilisation.with_label_values(&labels),
        })
    }

    /// Removes the share gauges of a tenant whose pool retired; its counters stay.
    fn retire(&self, quota: &str, tenant: &str) {
        if self.label(tenant) == OTHER_TENANTS {
            return;
        }
        let labels = [quota, tenant];
        let _ = self.share.remove_label_values(&labels);
        let _ = self.target.remove_label_values(&labels);
        let _ = self.burst.remove_label_values(&labels);
        let _ = self.utilisation.remove_label_values(&labels);
    }
}

/// One tenant's share gauges.
struct ShareGauges {
    share: prometheus::IntGauge,
    target: prometheus::IntGauge,
    burst: prometheus::IntGauge,
    utilisation: prometheus::Gauge,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: u64 = 1_000;

    /// A pool holding nothing (a proxy that joins a pool another proxy holds in full) asks
    /// every quarter lease — not every 10 ms, a raft command each — and tells clients to come
    /// back once the share it waits for may have arrived and refilled.
    #[test]
    fn a_pool_holding_nothing_asks_every_quarter_lease() {
        let (next, expected) = next_request(LEASE, 5_000, false, std::iter::empty(), 0, 0, None);
        assert_eq!(next, 5_250);
        assert_eq!(
            expected,
            Some(Expected {
                at_ms: 5_250,
                rate_milli: 0
            })
        );
        let (next, expected) = next_request(
            LEASE,
            5_000,
            false,
            std::iter::empty(),
            0,
            3_600,
            Some(5_600),
        );
        assert_eq!(next, 5_250);
        assert_eq!(
            expected,
            Some(Expected {
                at_ms: 5_750,
                rate_milli: 3_600
            }),
            "the first request at or after the capacity comes free"
        );
    }

    /// A renewal the ledger refused (or a chain it lets lapse) stays due; it is asked for again
    /// a quarter lease later, not at once.
    #[test]
    fn a_refused_renewal_is_retried_a_quarter_lease_later() {
        let (next, _) = next_request(LEASE, 5_000, true, [5_300].into_iter(), 9_000, 9_000, None);
        assert_eq!(next, 5_250);
    }

    /// At its target, a proxy asks only to renew, half a lease before its chain ends.
    #[test]
    fn at_its_target_a_proxy_only_renews() {
        let (next, expected) = next_request(
            LEASE,
            5_000,
            true,
            [6_000].into_iter(),
            9_000,
            9_000,
            Some(7_000),
        );
        assert_eq!(next, 5_500);
        assert_eq!(expected, None);
    }

    /// The series of `family` in `registry`, as `tenant` labels.
    fn tenants(registry: &Registry, family: &str) -> Vec<String> {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == family)
            .flat_map(|f| f.get_metric().iter())
            .filter_map(|m| {
                let label = m.get_label().iter().find(|l| l.name() == "tenant")?;
                Some(label.value().to_string())
            })
            .collect()
    }

    #[test]
    fn tenants_invented_by_clients_cannot_grow_the_metrics_without_bound() {
        let registry = Registry::new();
        let m = QuotaMetrics::new(&registry);
        let many = MAX_TENANT_LABELS + 500;
        for i in 0..many {
            let tenant = format!("t{i}");
            let label = m.label(&tenant);
            m.decisions
                .with_label_values(&["q", label, "admitted"])
                .inc();
            if let Some(g) = m.share_gauges("q", &tenant) {
                g.share.set(10);
            }
        }
        let counted = tenants(&registry, "proxy_quota_requests_total");
        assert_eq!(
            counted.len(),
            MAX_TENANT_LABELS + 1,
            "each named tenant and _other"
        );
        let other = registry
            .gather()
            .iter()
            .find(|f| f.name() == "proxy_quota_requests_total")
            .and_then(|f| {
                f.get_metric()
                    .iter()
                    .find(|s| s.get_label().iter().any(|l| l.value() == OTHER_TENANTS))
            })
            .map(|s| s.get_counter().get_value());
        assert_eq!(other, Some(500.0), "the rest are counted together");
        let shares = tenants(&registry, "proxy_quota_rate_share");
        assert_eq!(shares.len(), MAX_TENANT_LABELS, "no share gauge for _other");
        assert_eq!(m.label("t0"), "t0", "a named tenant keeps its name");

        m.retire("q", "t0");
        m.retire("q", &format!("t{}", many - 1));
        let shares = tenants(&registry, "proxy_quota_rate_share");
        assert_eq!(
            shares.len(),
            MAX_TENANT_LABELS - 1,
            "a retired pool's gauges go"
        );
        assert!(!shares.contains(&"t0".to_string()));
        assert_eq!(
            tenants(&registry, "proxy_quota_requests_total").len(),
            MAX_TENANT_LABELS + 1,
            "counters stay"
        );
    }
}
