//! One logical acquire: a single request id, retried until granted, refused or out of time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::guard::LeaseGuard;
use super::schedule::new_request_id;
use super::state::LeaseState;
use super::transport::{AttemptError, CallFailure, Transport};
use super::{AcquireOptions, Error, Lease};
use crate::wire::{
    self, AcquireRequest, CancelRequest, CancelResponse, ErrorCode, LeaseRequest, RenewResponse,
};

/// How long the server keeps a long-poll open past its `wait_timeout_ms` before it cancels
/// the wait itself (`WAIT_SLACK` in the API). Our attempt must outlast it: if we hung up
/// first, the server would take the disconnect as "caller gone" and drop our place in line.
const SERVER_WAIT_SLACK: Duration = Duration::from_secs(2);

/// A `lock_held` that arrives while this much of our wait is still left cannot be the wait
/// running out: a stale cancel (from an earlier attempt's dropped connection) removed us.
/// Re-queue with the same request id instead of reporting the lock as held.
const EARLY_WAIT_END: Duration = Duration::from_millis(250);

pub(crate) async fn acquire(
    transport: &Arc<Transport>,
    resource: &str,
    opts: AcquireOptions,
) -> Result<LeaseGuard, Error> {
    validate_resource(resource)?;
    if let Some(ttl) = opts.ttl {
        check_margin(transport, ttl)?;
    }
    let request_id = opts.request_id.clone().unwrap_or_else(new_request_id);
    // Every grant this acquire can receive was stamped by the leader after this instant: the
    // first attempt is sent after it, and retries only replay or continue that attempt.
    let started = Instant::now();
    let wait = opts.wait_timeout;
    let wait_end = started + wait;
    let deadline = started
        + opts
            .deadline
            .unwrap_or(wait.saturating_add(transport.opts.call_timeout));
    let mut cancel = CancelOnDrop {
        transport: transport.clone(),
        resource: resource.to_string(),
        request_id: request_id.clone(),
        holder: opts.holder.clone(),
        ttl_ms: opts.ttl.map(millis),
        armed: true,
    };
    // Whether the server may hold state for this request id (a queued waiter, or a grant we
    // never saw). If not, a definite refusal needs no cancel.
    let mut maybe_pending = false;
    let mut attempts = 0u32;
    let mut last = String::from("no attempt made");
    let lease: Lease = loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                elapsed: started.elapsed(),
                attempts,
                last,
            });
        }
        attempts += 1;
        let left = deadline - now;
        let mut body = AcquireRequest {
            request_id: request_id.clone(),
            holder: opts.holder.clone(),
            ttl_ms: opts.ttl.map(millis),
            wait_timeout_ms: None,
        };
        let timeout = if wait.is_zero() {
            transport.opts.request_timeout
        } else {
            // Never send 0 on a retry of a waiting acquire: if we are still queued, a
            // try-once request cannot collect the grant.
            let wait_ms = millis(wait_end.saturating_duration_since(now).min(left)).max(1);
            body.wait_timeout_ms = Some(wait_ms);
            maybe_pending = true;
            Duration::from_millis(wait_ms) + SERVER_WAIT_SLACK + transport.opts.request_timeout
        };
        match transport
            .post(resource, "acquire", &body, timeout.min(left))
            .await
        {
            Ok(lease) => break lease,
            Err(AttemptError::Api(reply)) => {
                // Only this acquire's own earlier attempts cancel its request id (a dropped
                // connection makes the server withdraw the wait), so a cancelled wait with time
                // left is re-queued, like a wait that ended too early.
                let ended = matches!(
                    reply.body.error,
                    ErrorCode::LockHeld | ErrorCode::WaitCancelled
                );
                let early = ended
                    && !wait.is_zero()
                    && wait_end.saturating_duration_since(Instant::now()) > EARLY_WAIT_END;
                if !early {
                    cancel.armed = maybe_pending;
                    return Err(reply.into_error(resource));
                }
                last = format!("wait ended early: {}", reply.body.message);
            }
            Err(AttemptError::Uncertain(why)) => {
                tracing::debug!(resource, attempts, %why, "acquire outcome uncertain; retrying with the same request id");
                maybe_pending = true;
                last = why;
            }
        }
        let pause = transport.backoff(attempts);
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
    };

    let ttl = lease.ttl();
    check_margin(transport, ttl)?;
    let margin = transport.opts.margin_for(ttl);
    let usable = ttl.saturating_sub(margin);
    let provable = started + usable;
    // Renew at once if the answer could be a replay (a retry returns the original grant even
    // if that lease has since been released or expired — and a caller-chosen request id may
    // continue an acquire another process sent long ago), or if the conservative deadline is
    // mostly used up (a long wait: we only know the grant came after `started`). The renewal
    // both proves the lease still exists and measures a fresh deadline from its send time.
    let verify = attempts > 1
        || opts.request_id.is_some()
        || provable.saturating_duration_since(Instant::now()) < usable / 2;
    let local_deadline = if verify {
        let until = deadline.max(Instant::now() + transport.opts.request_timeout);
        let body = LeaseRequest {
            lease_id: Some(lease.lease_id),
        };
        match transport
            .call_until::<_, RenewResponse>(resource, "renew", &body, until)
            .await
        {
            Ok((sent, renewed)) if renewed.fencing_token == lease.fencing_token => sent + usable,
            Ok(_) => {
                return Err(Error::LeaseLost {
                    resource: resource.to_string(),
                })
            }
            Err(CallFailure::Api(reply)) => return Err(reply.into_error(resource)),
            Err(f) => return Err(f.into_error(resource)),
        }
    } else {
        provable
    };
    cancel.armed = false;
    Ok(LeaseGuard::start(
        transport.clone(),
        LeaseState::new(lease, margin, local_deadline),
    ))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn check_margin(transport: &Transport, ttl: Duration) -> Result<(), Error> {
    let margin = transport.opts.margin_for(ttl);
    if margin.saturating_mul(2) > ttl {
        return Err(Error::Invalid(format!(
            "a ttl of {ttl:?} is too short for the safety margin of {margin:?}; use a ttl of at \
             least twice the margin"
        )));
    }
    Ok(())
}

/// Checks a resource name like the server does (1–256 bytes of `[A-Za-z0-9._:/-]`, no `.` or
/// `..` segment), so a bad name fails before anything is sent and never needs escaping in a
/// URL.
pub(crate) fn validate_resource(resource: &str) -> Result<(), Error> {
    wire::validate_resource(resource)
        .map_err(|why| Error::Invalid(format!("resource '{resource}': {why}")))
}

/// Cancels the server-side side of an acquire that ends without handing a guard to the
/// caller: the future was dropped (caller gave up, `select!` lost, timeout), or it failed
/// after an attempt whose outcome we never learned. Cancel removes a queued waiter. If there
/// was none, the acquire may have been granted with the answer lost (or handed the lock while
/// we were going): the same request id, sent once more, returns that grant, which is then
/// released, so the lock does not sit idle for a whole TTL.
struct CancelOnDrop {
    transport: Arc<Transport>,
    resource: String,
    request_id: String,
    holder: Option<String>,
    ttl_ms: Option<u64>,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // No runtime (process shutting down): the server drops the waiter when our
        // connection closes, and its wait deadline bounds it anyway.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let transport = self.transport.clone();
        let resource = std::mem::take(&mut self.resource);
        let replay = AcquireRequest {
            request_id: std::mem::take(&mut self.request_id),
            holder: self.holder.take(),
            ttl_ms: self.ttl_ms,
            wait_timeout_ms: None,
        };
        rt.spawn(async move {
            let until = Instant::now() + transport.opts.call_timeout;
            let cancel = CancelRequest {
                request_id: replay.request_id.clone(),
            };
            match transport
                .call_until::<_, CancelResponse>(&resource, "cancel", &cancel, until)
                .await
            {
                Ok((_, answer)) if answer.cancelled => {
                    tracing::debug!(%resource, "abandoned acquire's wait cancelled");
                }
                Ok(_) => release_unseen(&transport, &resource, &replay, until).await,
                Err(e) => tracing::warn!(%resource, error = ?e, "cancel of an abandoned acquire failed; the server's wait deadline will remove it"),
            }
        });
    }
}

/// Releases the grant of an abandoned acquire that was not waiting any more, if it got one:
/// sent again, its request id returns the grant (a retry never makes a second one). Had the
/// acquire never reached the server, this try-once call may take the lock now, and it is
/// released at once as well.
async fn release_unseen(
    transport: &Transport,
    resource: &str,
    replay: &AcquireRequest,
    until: Instant,
) {
    let lease = match transport
        .call_until::<_, wire::AcquireResponse>(resource, "acquire", replay, until)
        .await
    {
        Ok((_, lease)) => lease,
        // Held by another lease (or refused): this acquire holds nothing.
        Err(CallFailure::Api(_)) => return,
        Err(e) => {
            tracing::warn!(%resource, error = ?e, "could not learn whether an abandoned acquire was granted; its TTL bounds it");
            return;
        }
    };
    let body = LeaseRequest {
        lease_id: Some(lease.lease_id),
    };
    match transport
        .call_until::<_, wire::ReleaseResponse>(resource, "release", &body, until)
        .await
    {
        Ok((_, r)) => {
            tracing::debug!(%resource, released = r.released, "abandoned acquire's grant released")
        }
        Err(e) => {
            tracing::warn!(%resource, error = ?e, "release of an abandoned acquire's grant failed; its TTL bounds it")
        }
    }
}
