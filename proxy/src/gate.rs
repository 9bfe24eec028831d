//! The fence gate: decides whether a protected write may be forwarded, against linearizable
//! state, paying a consensus round trip only for the first write of an epoch.
//!
//! How (docs/fencing.md has the full argument):
//! - The first write with token T for resource R commits `Admit{R, T, proxy}` through raft.
//!   The state machine admits only R's current, live lease token and answers with a grant:
//!   this proxy may forward T-writes for R for `grant_ms` (capped at the lease's expiry).
//! - While the grant has at least the upstream timeout (plus `SEND_SLACK`) left, further
//!   T-writes are forwarded with no round trip (the fast path). A lower token is rejected
//!   locally.
//! - A forwarded write must reach the upstream in full by `send_by` = grant end − upstream
//!   timeout; the service abandons it unfinished otherwise (a trickling body), so no T-write
//!   is still being delivered, or waited on, after the grant.
//! - The state machine never issues a token newer than T for R while a grant for T lives:
//!   expiry needs no wait (grants end with the lease); a release revokes the grants. Each proxy
//!   holding one learns it from the committed log (`Effect::Revoke`), stops forwarding T at
//!   once, waits until its T-writes in flight to the upstream have completed, and confirms
//!   with `RevokeAck`; the next lease is granted when every proxy confirmed (one or two
//!   commits), or at the latest when the grants run out (a proxy that cannot answer). So when
//!   a newer token exists, every T-write forwarded under a grant has completed or hit the
//!   upstream timeout: the epoch barrier.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::machine::{AdmitOutcome, Command, Response};
use lock_core::node::{Node, ProposeError, Revocation};
use tokio::sync::{broadcast, Notify};

use crate::verdict::{fast_verdict, grant_from_outcome, FastVerdict, LocalGrant, Rejection};

/// Slack subtracted from every grant for clock-rate differences between this node and the
/// leader that stamped the grant.
pub const CLOCK_MARGIN: Duration = Duration::from_millis(100);
/// Lock stripes serialising admissions per resource (so a burst of first writes makes one
/// consensus round trip, not many).
const STRIPES: usize = 256;
/// Time a forwarded write gets at least to reach the upstream in full (connect, headers,
/// body) before its `send_by`: a write is forwarded only while its grant has the upstream
/// timeout plus this left.
pub const SEND_SLACK: Duration = Duration::from_millis(50);
/// Admissions tried for one write when each round trip is too slow to leave a usable grant.
const ADMIT_ATTEMPTS: usize = 3;
/// How long before a grant runs low a background refresh starts.
const REFRESH_AHEAD: Duration = Duration::from_millis(300);
/// Grants kept before expired ones are swept.
const SWEEP_AT: usize = 100_000;
/// How long a revoked token is remembered so that an admission racing the revocation cannot
/// store a grant for it again (far longer than any admission round trip).
const REVOKED_MEMORY: Duration = Duration::from_secs(30);

pub struct FenceGate {
    node: Arc<Node>,
    grant_ms: u64,
    /// Grants, revoked tokens and in-flight counts under one lock: a write is counted in
    /// flight only while a grant is checked valid under it, and a revocation removes the
    /// grant under it, so once a revocation saw the count it can only go down.
    state: parking_lot::Mutex<GateState>,
    /// Resources with a background grant refresh in flight.
    refreshing: parking_lot::Mutex<std::collections::HashSet<String>>,
    stripes: Vec<tokio::sync::Mutex<()>>,
}

#[derive(Default)]
struct GateState {
    grants: HashMap<String, LocalGrant>,
    /// Per resource, the highest token revoked here and when.
    revoked: HashMap<String, (u64, Instant)>,
    inflight: HashMap<String, Arc<InFlight>>,
}

impl GateState {
    fn inflight(&mut self, resource: &str) -> InFlightGuard {
        // The hot path: look up before allocating a key.
        let counter = match self.inflight.get(resource) {
            Some(c) => c.clone(),
            None => {
                let c = Arc::new(InFlight::default());
                self.inflight.insert(resource.to_string(), c.clone());
                c
            }
        };
        counter.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(counter)
    }

    fn is_revoked(&self, resource: &str, token: u64) -> bool {
        self.revoked.get(resource).is_some_and(|(t, _)| token <= *t)
    }

    fn sweep(&mut self) {
        let now = Instant::now();
        self.grants.retain(|_, g| g.deadline > now);
        self.revoked
            .retain(|_, (_, at)| now.duration_since(*at) < REVOKED_MEMORY);
        self.inflight
            .retain(|_, c| c.count.load(Ordering::Acquire) > 0);
    }
}

/// Writes forwarded for one resource and not finished yet.
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

impl InFlight {
    async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Held by a forwarded write until it has finished (answered, failed or abandoned): a
/// revocation confirms only after every such write for the resource is gone.
pub struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// How a request was admitted, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    FastPath,
    Consensus,
}

/// A write the gate lets through.
pub struct Admitted {
    pub how: Admission,
    /// The whole request (headers and every body byte) must have been sent to the upstream
    /// by then: the grant's end minus the upstream timeout. Past it, the proxy abandons the
    /// request rather than complete it (a trickling body would otherwise reach the store after
    /// the grant, and so possibly after a newer token's writes).
    pub send_by: Instant,
    /// Keep until the write has finished.
    pub in_flight: InFlightGuard,
}

impl Admitted {
    fn under(
        how: Admission,
        grant: &LocalGrant,
        upstream_timeout: Duration,
        in_flight: InFlightGuard,
    ) -> Self {
        Admitted {
            how,
            send_by: grant
                .deadline
                .checked_sub(upstream_timeout)
                .unwrap_or_else(Instant::now),
            in_flight,
        }
    }
}

/// The fast-path decision under the state lock; a `Forward` is counted in flight at once.
enum Local {
    Forward(Admitted),
    Reject(Rejection),
    Consult,
}

impl FenceGate {
    pub fn new(node: Arc<Node>, grant_ms: u64) -> Self {
        FenceGate {
            node,
            grant_ms,
            state: parking_lot::Mutex::new(GateState::default()),
            refreshing: parking_lot::Mutex::new(std::collections::HashSet::new()),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    /// Decides on the local grant alone, counting a forwarded write in flight under the same
    /// lock a revocation takes.
    fn decide_locally(
        &self,
        resource: &str,
        token: u64,
        need: Duration,
        upstream_timeout: Duration,
    ) -> Local {
        let mut st = self.state.lock();
        let grant = st.grants.get(resource).copied();
        match fast_verdict(grant.as_ref(), token, Instant::now(), need) {
            FastVerdict::Forward => match grant {
                Some(g) => {
                    let guard = st.inflight(resource);
                    Local::Forward(Admitted::under(
                        Admission::FastPath,
                        &g,
                        upstream_timeout,
                        guard,
                    ))
                }
                None => Local::Consult,
            },
            FastVerdict::Reject(r) => Local::Reject(r),
            FastVerdict::Consult => Local::Consult,
        }
    }

    /// Serves the revocations of this node's grants, from the committed log, until the node
    /// goes away. Each one: forget the grant (new writes with the token are refused from now
    /// on), wait for the token's writes in flight to finish, then confirm to the cluster.
    pub async fn serve_revocations(self: Arc<Self>) {
        let mut revocations = self.node.revocations.subscribe();
        loop {
            match revocations.recv().await {
                Ok(r) if r.proxies.contains(&self.node.id) => {
                    let gate = self.clone();
                    tokio::spawn(async move { gate.revoke(r).await });
                }
                Ok(_) => {}
                // Missed some: those grants simply run out; the next lease waits for that.
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "fencing proxy fell behind on revocations");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    async fn revoke(&self, r: Revocation) {
        let in_flight = {
            let mut st = self.state.lock();
            let at = Instant::now();
            let seen = st.revoked.entry(r.resource.clone()).or_insert((0, at));
            *seen = (seen.0.max(r.fencing_token), at);
            // Keep the token as a floor (lower tokens stay refused locally); its deadline has
            // passed, so the token itself must ask the cluster, which answers that it ended.
            let floor = LocalGrant {
                token: r.fencing_token,
                deadline: at,
            };
            match st.grants.get_mut(&r.resource) {
                Some(g) if g.token > r.fencing_token => {}
                Some(g) => *g = floor,
                None => {
                    st.grants.insert(r.resource.clone(), floor);
                }
            }
            st.inflight.get(&r.resource).cloned()
        };
        if let Some(writes) = in_flight {
            // Bounded anyway: each write is abandoned at its send-by and answered by its
            // upstream timeout; this is a backstop against a stuck connection.
            let bound = Duration::from_millis(self.grant_ms) * 2;
            if tokio::time::timeout(bound, writes.drained()).await.is_err() {
                tracing::warn!(resource = %r.resource, "writes still in flight after a revocation; its grant will run out instead");
                return;
            }
        }
        let ack = Command::RevokeAck {
            resource: r.resource.clone(),
            fencing_token: r.fencing_token,
            proxy: self.node.id,
        };
        if let Err(e) = self.node.propose(ack).await {
            tracing::debug!(resource = %r.resource, error = %e, "revocation not confirmed; the grant will run out instead");
        }
    }

    /// Decides whether a write with `token` for `resource` may be forwarded now.
    pub async fn admit(
        self: &Arc<Self>,
        resource: &str,
        token: u64,
        upstream_timeout: Duration,
    ) -> Result<Admitted, Rejection> {
        // Forward only with the upstream timeout plus some time to send the request left.
        let need = upstream_timeout + SEND_SLACK;
        match self.decide_locally(resource, token, need, upstream_timeout) {
            Local::Forward(admitted) => {
                // Renew the grant in the background before it runs low, so a steady stream of
                // writes never waits for a commit.
                let left = admitted.send_by.saturating_duration_since(Instant::now());
                if left < SEND_SLACK + REFRESH_AHEAD {
                    self.refresh_in_background(resource, token, upstream_timeout);
                }
                Ok(admitted)
            }
            Local::Reject(r) => Err(self.refused_here(resource, token, r)),
            Local::Consult => self.consult(resource, token, upstream_timeout, need).await,
        }
    }

    /// A refusal decided from this proxy's own grant, without a commit: counted for the
    /// operators' hot-resources view as the cluster counts the ones it decides.
    fn refused_here(&self, resource: &str, token: u64, r: Rejection) -> Rejection {
        let outcome = match &r {
            Rejection::Stale { .. } => Some("stale"),
            Rejection::Ended { .. } => Some("ended"),
            Rejection::Unknown { .. } => Some("unknown"),
            _ => None,
        };
        if let Some(outcome) = outcome {
            self.node.record_fence_refusal(resource, token, outcome);
        }
        r
    }

    fn refresh_in_background(self: &Arc<Self>, resource: &str, token: u64, timeout: Duration) {
        if !self.refreshing.lock().insert(resource.to_string()) {
            return;
        }
        let gate = self.clone();
        let resource = resource.to_string();
        tokio::spawn(async move {
            let fresh = timeout + SEND_SLACK + REFRESH_AHEAD;
            match gate.consult(&resource, token, timeout, fresh).await {
                // Nothing is forwarded by a refresh; its in-flight count ends here.
                Ok(refreshed) => drop(refreshed.in_flight),
                Err(e) => tracing::debug!(resource, ?e, "background grant refresh failed"),
            }
            gate.refreshing.lock().remove(&resource);
        });
    }

    /// The slow path: commit an admission, unless (after queueing for the resource's stripe)
    /// the local grant already covers `need`.
    async fn consult(
        &self,
        resource: &str,
        token: u64,
        upstream_timeout: Duration,
        need: Duration,
    ) -> Result<Admitted, Rejection> {
        // Bounded: without a quorum, admissions queued on one stripe would otherwise each
        // wait a full write timeout in turn before answering 503.
        let wait = Duration::from_millis(self.node.config.policy.write_timeout_ms);
        let Ok(_serial) = tokio::time::timeout(wait, self.stripes[stripe(resource)].lock()).await
        else {
            // Local contention (admissions queued ahead of this one on the resource's
            // stripe), not a verdict of the cluster.
            return Err(Rejection::Busy);
        };
        // Someone may have refreshed the grant while we queued for the stripe.
        match self.decide_locally(resource, token, need, upstream_timeout) {
            Local::Forward(admitted) => return Ok(admitted),
            Local::Reject(r) => return Err(self.refused_here(resource, token, r)),
            Local::Consult => {}
        }
        let cmd = Command::Admit {
            resource: resource.to_string(),
            fencing_token: token,
            proxy: self.node.id,
            grant_ms: self.grant_ms,
        };
        for _ in 0..ADMIT_ATTEMPTS {
            let sent = Instant::now();
            let outcome = match self.node.propose(cmd.clone()).await {
                Ok(Response::Admit(outcome)) => outcome,
                Ok(other) => {
                    tracing::error!(?other, "unexpected answer to an admission");
                    return Err(Rejection::NoQuorum);
                }
                Err(ProposeError::NoQuorum | ProposeError::NotLeader(_)) => {
                    return Err(Rejection::NoQuorum)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "admission failed");
                    return Err(Rejection::NoQuorum);
                }
            };
            let grant = grant_from_outcome(&outcome, token, sent, CLOCK_MARGIN);
            if let Err(Rejection::Stale { highest, .. }) = &grant {
                self.remember_floor(resource, *highest);
            }
            let grant = grant?;
            {
                let mut st = self.state.lock();
                // A revocation applied on this node while the admission was committed wins:
                // the cluster ended the lease after admitting it.
                if st.is_revoked(resource, token) {
                    return Err(Rejection::Ended {
                        presented: token,
                        short_of: None,
                    });
                }
                remember(&mut st, resource, grant);
                if Instant::now() + need <= grant.deadline {
                    let guard = st.inflight(resource);
                    return Ok(Admitted::under(
                        Admission::Consensus,
                        &grant,
                        upstream_timeout,
                        guard,
                    ));
                }
            }
            // The grant cannot cover a forwarded request until its upstream timeout. If even an
            // instant round trip could not have (the cluster capped the grant at the lease's
            // expiry), the lease ends too soon: the write could land after the next holder's.
            // Otherwise the round trip itself ate the grant (a slow commit, an election): the
            // lease is fine, so ask again rather than tell a live holder its lease ended.
            let granted = match outcome {
                AdmitOutcome::Admitted { grant_ms } => Duration::from_millis(grant_ms),
                _ => Duration::ZERO,
            };
            if granted < need + CLOCK_MARGIN {
                let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                return Err(Rejection::Ended {
                    presented: token,
                    short_of: Some((ms(granted), ms(need + CLOCK_MARGIN))),
                });
            }
        }
        // Every admission took longer than its grant could spare: the cluster is too slow to
        // verify the token in time. Nothing was forwarded; the client may retry.
        Err(Rejection::NoQuorum)
    }

    /// Records that `highest` was admitted, so lower tokens are refused locally from now on.
    fn remember_floor(&self, resource: &str, highest: u64) {
        let floor = LocalGrant {
            token: highest,
            deadline: Instant::now(),
        };
        remember(&mut self.state.lock(), resource, floor);
    }
}

/// Stores a grant unless a newer token's is already known.
fn remember(st: &mut GateState, resource: &str, grant: LocalGrant) {
    if st.grants.len() >= SWEEP_AT {
        st.sweep();
    }
    match st.grants.get_mut(resource) {
        Some(g) if g.token > grant.token => {}
        Some(g) => *g = grant,
        None => {
            st.grants.insert(resource.to_string(), grant);
        }
    }
}

fn stripe(resource: &str) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    resource.hash(&mut h);
    (h.finish() as usize) % STRIPES
}
