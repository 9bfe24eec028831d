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
//!   expiry needs no wait (grants end with the lease), a release defers the next grant until
//!   the grants ran out. So when a newer token exists, every T-write forwarded under a grant
//!   has completed or hit the upstream timeout: the epoch barrier.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::machine::{AdmitOutcome, Command, Response};
use lock_core::node::{Node, ProposeError};

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

pub struct FenceGate {
    node: Arc<Node>,
    grant_ms: u64,
    grants: parking_lot::Mutex<HashMap<String, LocalGrant>>,
    /// Resources with a background grant refresh in flight.
    refreshing: parking_lot::Mutex<std::collections::HashSet<String>>,
    stripes: Vec<tokio::sync::Mutex<()>>,
}

/// How a request was admitted, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    FastPath,
    Consensus,
}

/// A write the gate lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    pub how: Admission,
    /// The whole request (headers and every body byte) must have been sent to the upstream
    /// by then: the grant's end minus the upstream timeout. Past it, the proxy abandons the
    /// request rather than complete it (a trickling body would otherwise reach the store after
    /// the grant, and so possibly after a newer token's writes).
    pub send_by: Instant,
}

impl Admitted {
    /// `Forward` from `fast_verdict` implies a local grant.
    fn fast(local: Option<LocalGrant>, upstream_timeout: Duration) -> Self {
        match local {
            Some(g) => Admitted::under(Admission::FastPath, &g, upstream_timeout),
            None => Admitted {
                how: Admission::FastPath,
                send_by: Instant::now(),
            },
        }
    }

    fn under(how: Admission, grant: &LocalGrant, upstream_timeout: Duration) -> Self {
        Admitted {
            how,
            send_by: grant
                .deadline
                .checked_sub(upstream_timeout)
                .unwrap_or_else(Instant::now),
        }
    }
}

impl FenceGate {
    pub fn new(node: Arc<Node>, grant_ms: u64) -> Self {
        FenceGate {
            node,
            grant_ms,
            grants: parking_lot::Mutex::new(HashMap::new()),
            refreshing: parking_lot::Mutex::new(std::collections::HashSet::new()),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    fn local(&self, resource: &str) -> Option<LocalGrant> {
        self.grants.lock().get(resource).copied()
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
        let local = self.local(resource);
        match fast_verdict(local.as_ref(), token, Instant::now(), need) {
            FastVerdict::Forward => {
                // Renew the grant in the background before it runs low, so a steady stream of
                // writes never waits for a commit.
                if fast_verdict(local.as_ref(), token, Instant::now(), need + REFRESH_AHEAD)
                    == FastVerdict::Consult
                {
                    self.refresh_in_background(resource, token, upstream_timeout);
                }
                return Ok(Admitted::fast(local, upstream_timeout));
            }
            FastVerdict::Reject(r) => return Err(r),
            FastVerdict::Consult => {}
        }
        self.consult(resource, token, upstream_timeout, need).await
    }

    fn refresh_in_background(self: &Arc<Self>, resource: &str, token: u64, timeout: Duration) {
        if !self.refreshing.lock().insert(resource.to_string()) {
            return;
        }
        let gate = self.clone();
        let resource = resource.to_string();
        tokio::spawn(async move {
            let fresh = timeout + SEND_SLACK + REFRESH_AHEAD;
            if let Err(e) = gate.consult(&resource, token, timeout, fresh).await {
                tracing::debug!(resource, ?e, "background grant refresh failed");
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
            return Err(Rejection::NoQuorum);
        };
        // Someone may have refreshed the grant while we queued for the stripe.
        let local = self.local(resource);
        match fast_verdict(local.as_ref(), token, Instant::now(), need) {
            FastVerdict::Forward => return Ok(Admitted::fast(local, upstream_timeout)),
            FastVerdict::Reject(r) => return Err(r),
            FastVerdict::Consult => {}
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
            self.remember(resource, grant);
            if Instant::now() + need <= grant.deadline {
                return Ok(Admitted::under(
                    Admission::Consensus,
                    &grant,
                    upstream_timeout,
                ));
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
                return Err(Rejection::Ended { presented: token });
            }
        }
        // Every admission took longer than its grant could spare: the cluster is too slow to
        // verify the token in time. Nothing was forwarded; the client may retry.
        Err(Rejection::NoQuorum)
    }

    fn remember(&self, resource: &str, grant: LocalGrant) {
        let mut grants = self.grants.lock();
        if grants.len() >= SWEEP_AT {
            let now = Instant::now();
            grants.retain(|_, g| g.deadline > now);
        }
        match grants.get_mut(resource) {
            Some(g) if g.token > grant.token => {}
            Some(g) => *g = grant,
            None => {
                grants.insert(resource.to_string(), grant);
            }
        }
    }

    /// Records that `highest` was admitted, so lower tokens are refused locally from now on.
    fn remember_floor(&self, resource: &str, highest: u64) {
        let floor = LocalGrant {
            token: highest,
            deadline: Instant::now(),
        };
        self.remember(resource, floor);
    }
}

fn stripe(resource: &str) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    resource.hash(&mut h);
    (h.finish() as usize) % STRIPES
}
