//! The lease guard: local validity, background renewal, release.
//!
//! Validity is judged only by this process's monotonic clock. Every deadline is measured from
//! the moment a request was *sent*: the leader stamps the lease after it received the
//! request, so the server's expiry is at least `sent + ttl` and our deadline
//! `sent + ttl - margin` comes first (see `docs/client.md` for what the margin covers).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::fenced::FencedRequest;
use super::schedule::renew_delay;
use super::state::{fence_headers, LeaseState};
use super::transport::{CallFailure, Transport};
use super::{Error, Lease, LostReason};
use crate::wire::{ErrorCode, LeaseId, LeaseRequest, ReleaseResponse, RenewResponse};

/// An acquired lease, kept alive by a background task until it is released, dropped, or can
/// no longer be proven.
///
/// **Stop work as soon as the guard is invalid** ([`is_valid`](Self::is_valid) is false,
/// [`lost`](Self::lost) fired, or a fenced request returns [`Error::LeaseInvalid`]). The guard
/// turns invalid at its local [`deadline`](Self::deadline) at the latest, which is before the
/// server can grant the lock to anyone else. Invalidity is final.
///
/// Dropping the guard stops renewal and releases the lease in the background, best effort:
/// if the release does not get through (no runtime, node down) the lease simply expires
/// after its TTL. Call [`release`](Self::release) to know the outcome.
pub struct LeaseGuard {
    state: Arc<LeaseState>,
    transport: Arc<Transport>,
    renewer: Option<JoinHandle<()>>,
    /// Set once released or detached, so `Drop` does nothing more.
    finished: bool,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the lease id: it is a bearer capability.
        f.debug_struct("LeaseGuard")
            .field("resource", &self.state.lease.resource)
            .field("token", &self.state.lease.fencing_token)
            .field("deadline", &self.state.deadline())
            .field("lost", &self.state.lost_reason())
            .finish()
    }
}

impl LeaseGuard {
    /// Wraps a granted lease whose local deadline is already established, and starts renewing.
    pub(crate) fn start(transport: Arc<Transport>, state: LeaseState) -> Self {
        let state = Arc::new(state);
        let renewer = tokio::spawn(renew_loop(state.clone(), transport.clone()));
        LeaseGuard {
            state,
            transport,
            renewer: Some(renewer),
            finished: false,
        }
    }

    /// The locked resource.
    pub fn resource(&self) -> &str {
        &self.state.lease.resource
    }

    /// The fencing token: send it with every write the lock protects (or use
    /// [`fenced_request`](Self::fenced_request)). It never changes over renewals.
    pub fn token(&self) -> u64 {
        self.state.lease.fencing_token
    }

    /// The lease id. **A secret**: whoever holds it can renew and release this lease. Never
    /// log it; send it only to the lock service.
    pub fn lease_id(&self) -> LeaseId {
        self.state.lease.lease_id
    }

    /// The TTL the server granted.
    pub fn ttl(&self) -> Duration {
        self.state.ttl
    }

    /// The safety margin applied to this lease's deadlines.
    pub fn safety_margin(&self) -> Duration {
        self.state.margin
    }

    /// The local deadline: when the last successful acquire or renewal was *sent*, plus the
    /// TTL, minus the safety margin. Measured on this process's monotonic clock, never on the
    /// server's wall clock. Moves forward with every renewal.
    pub fn deadline(&self) -> Instant {
        self.state.deadline()
    }

    /// Whether the lease is still provably held. Checks the clock on every call, so it is
    /// right even when the renewal task could not run (e.g. the process was paused).
    pub fn is_valid(&self) -> bool {
        self.state.status().is_ok()
    }

    /// `Ok(())` while valid, else [`Error::LeaseInvalid`]: handy as `guard.check()?` between
    /// steps of a job.
    pub fn check(&self) -> Result<(), Error> {
        self.state.check()
    }

    /// Why the guard is invalid, or `None` while it is valid.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.state.lost_reason()
    }

    /// How many renewals have succeeded so far.
    pub fn renewals(&self) -> u64 {
        self.state.renewals.load(Ordering::Relaxed)
    }

    /// Completes when the guard turns invalid, with the reason. Fires at the local deadline
    /// at the latest, even if the renewal task is stuck. Use it in `tokio::select!` to abort
    /// work when the lease goes.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.state.subscribe();
        loop {
            let deadline = match self.state.status() {
                Err(reason) => return reason,
                Ok(d) => d,
            };
            tokio::select! {
                // The sender lives in `self.state`, so `changed` cannot fail while we run.
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }

    /// A watch that holds `true` while the guard is valid and flips to `false` once, when it
    /// turns invalid (driven by the renewal task's deadline timer). For a check at a given
    /// moment prefer [`is_valid`](Self::is_valid), which also reads the clock.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.state.subscribe()
    }

    /// The `Fence-Token` and `Fence-Resource` headers, or [`Error::LeaseInvalid`].
    pub fn fence_headers(&self) -> Result<HeaderMap, Error> {
        self.check()?;
        fence_headers(&self.state)
    }

    /// A write through the fencing proxy carrying this lease's `Fence-Token` and
    /// `Fence-Resource` headers. Its [`send`](FencedRequest::send) checks the guard at the
    /// moment of sending and refuses with [`Error::LeaseInvalid`] once it is invalid.
    pub fn fenced_request(
        &self,
        http: &reqwest::Client,
        method: reqwest::Method,
        url: impl reqwest::IntoUrl,
    ) -> FencedRequest {
        FencedRequest::new(self.state.clone(), http.request(method, url))
    }

    /// Stops renewing and releases the lease. `Ok(true)` if this call ended it, `Ok(false)`
    /// if it was already gone (expired or replaced). The guard is invalid from the moment
    /// this is called.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.finish(LostReason::Released);
        let until = self.transport.until(self.transport.opts.call_timeout);
        let resource = &self.state.lease.resource;
        match self
            .transport
            .call_until::<_, ReleaseResponse>(resource, "release", &self.state.body(), until)
            .await
        {
            Ok((_, answer)) => Ok(answer.released),
            Err(f) => Err(f.into_error(resource)),
        }
    }

    /// Stops renewing *without* releasing and returns the lease data, e.g. to hand the lease
    /// to another process (which must then renew it by id). The returned lease expires after
    /// its TTL unless someone renews it.
    pub fn detach(mut self) -> Lease {
        self.finish(LostReason::Released);
        self.state.lease.clone()
    }

    fn finish(&mut self, reason: LostReason) {
        self.finished = true;
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
        self.state.invalidate(reason);
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let server_said_lost = self.state.lost_reason() == Some(LostReason::LeaseLost);
        self.finish(LostReason::Released);
        if server_said_lost {
            return;
        }
        // Best effort: one release per node at most, in the background. Without a runtime
        // (dropped during shutdown) the lease just expires after its TTL.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let transport = self.transport.clone();
        let state = self.state.clone();
        rt.spawn(async move {
            let until = transport.until(transport.opts.request_timeout);
            if let Err(e) = transport
                .call_until::<_, ReleaseResponse>(
                    &state.lease.resource,
                    "release",
                    &state.body(),
                    until,
                )
                .await
            {
                tracing::debug!(resource = %state.lease.resource, error = ?e, "background release failed; the lease will expire");
            }
        });
    }
}

/// Renews every ~ttl/3 (jittered) until the lease is lost or unprovable. Two timers race each
/// renewal: the local deadline wins ties, so the guard turns invalid *at* the deadline even
/// while a request hangs.
async fn renew_loop(state: Arc<LeaseState>, transport: Arc<Transport>) {
    let resource = state.lease.resource.clone();
    let body: LeaseRequest = state.body();
    loop {
        let Ok(deadline) = state.status() else {
            return;
        };
        let delay = renew_delay(state.ttl, &mut rand::rng());
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(deadline.into()) => {
                state.invalidate(LostReason::Unconfirmed);
                return;
            }
            _ = tokio::time::sleep(delay) => {}
        }
        let outcome = tokio::select! {
            biased;
            _ = tokio::time::sleep_until(deadline.into()) => None,
            r = transport.call_until::<_, RenewResponse>(&resource, "renew", &body, deadline) => Some(r),
        };
        match outcome {
            Some(Ok((sent, renewed))) => {
                let token = renewed.fencing_token;
                if token != state.lease.fencing_token {
                    tracing::warn!(%resource, token, "renewal answered with another token; treating the lease as lost");
                    state.invalidate(LostReason::LeaseLost);
                    return;
                }
                if !state.extend(sent) {
                    return;
                }
            }
            Some(Err(CallFailure::Api(reply))) if reply.body.error == ErrorCode::LeaseLost => {
                tracing::info!(%resource, "lease lost: the server no longer holds it");
                state.invalidate(LostReason::LeaseLost);
                return;
            }
            Some(Err(CallFailure::Api(reply))) => {
                tracing::warn!(%resource, code = %reply.body.error, message = %reply.body.message, "renewal rejected");
                state.invalidate(LostReason::Unconfirmed);
                return;
            }
            None | Some(Err(CallFailure::Exhausted { .. })) => {
                tracing::warn!(%resource, "no renewal succeeded before the local deadline; lease unconfirmed");
                state.invalidate(LostReason::Unconfirmed);
                return;
            }
        }
    }
}
