//! One logical acquire: a single request id, retried until granted, refused or out of time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::guard::LeaseGuard;
use super::schedule::{instant_after, new_request_id};
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
    if opts.deadline == Some(Duration::ZERO) {
        return Err(Error::Invalid(
            "deadline must be positive: it bounds the whole acquire, waiting included (leave it \
             unset for wait_timeout + call_timeout)"
                .into(),
        ));
    }
    if let Some(ttl) = opts.ttl {
        check_margin(transport, ttl)?;
    }
    let request_id = opts.request_id.clone().unwrap_or_else(new_request_id);
    // Every grant this acquire can receive was stamped by the leader after this instant: the
    // first attempt is sent after it, and retries only replay or continue that attempt.
    let started = Instant::now();
    let wait = opts.wait_timeout;
    let wait_end = instant_after(started, wait);
    let deadline = instant_after(
        started,
        opts.deadline
            .unwrap_or(wait.saturating_add(transport.opts.call_timeout)),
    );
    let mut cancel = CancelOnDrop {
        transport: transport.clone(),
        resource: resource.to_string(),
        request_id: request_id.clone(),
        holder: opts.holder.clone(),
        ttl_ms: opts.ttl.map(millis),
        waits: !wait.is_zero(),
        leftover: Leftover::Nothing,
    };
    // Whether the server may hold state for this request id (a queued waiter, or a grant we
    // never saw). If not, a definite refusal needs no cancel.
    let mut maybe_pending = false;
    // Whether an attempt of ours ended without an answer (its connection may have dropped).
    let mut dropped_earlier = false;
    let mut attempts = 0u32;
    // How many nodes refused this wait as full: a node holds only so many waits at once
    // (its connections), so a waiting acquire tries each of the others before giving up.
    let mut full_nodes = 0usize;
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
            Duration::from_millis(wait_ms)
                .saturating_add(SERVER_WAIT_SLACK)
                .saturating_add(transport.opts.request_timeout)
        };
        // From here until a definite answer, this request id may hold a grant we have not
        // seen.
        cancel.leftover = Leftover::Unknown;
        match transport
            .post(resource, "acquire", &body, timeout.min(left))
            .await
        {
            Ok(lease) => break lease,
            Err(AttemptError::Api(reply))
                if reply.body.error == ErrorCode::TooManyWaiters
                    && !wait.is_zero()
                    && full_nodes + 1 < transport.nodes().len() =>
            {
                // Refused before it was queued: the next node may have room (if the
                // resource's own queue is full, every node says so, and the last answer is
                // returned).
                full_nodes += 1;
                transport.move_on();
                last = reply.body.message;
                continue;
            }
            Err(AttemptError::Api(reply)) => {
                // A wait that ended too early is re-queued. So is a cancelled one after an
                // attempt of ours whose connection dropped (the server withdraws the wait of a
                // closed connection, and that may end the wait of the retry). Otherwise the
                // cancel came from someone else (`cancel` with this request id, an operator's
                // `fencegate lock cancel`): an answer, returned.
                let ended = match reply.body.error {
                    ErrorCode::LockHeld => true,
                    ErrorCode::WaitCancelled => dropped_earlier,
                    _ => false,
                };
                let early = ended
                    && !wait.is_zero()
                    && wait_end.saturating_duration_since(Instant::now()) > EARLY_WAIT_END;
                if !early {
                    cancel.leftover = Leftover::after_refusal(maybe_pending);
                    return Err(reply.into_error(resource));
                }
                last = format!("wait ended early: {}", reply.body.message);
            }
            Err(AttemptError::Uncertain(why)) => {
                tracing::debug!(resource, attempts, %why, "acquire outcome uncertain; retrying with the same request id");
                maybe_pending = true;
                dropped_earlier = true;
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
    let provable = instant_after(started, usable);
    // Renew at once if the answer could be a replay (a retry returns the original grant even
    // if that lease has since been released or expired — and a caller-chosen request id may
    // continue an acquire another process sent long ago), or if the conservative deadline is
    // mostly used up (a long wait: we only know the grant came after `started`). The renewal
    // both proves the lease still exists and measures a fresh deadline from its send time.
    let verify = attempts > 1
        || opts.request_id.is_some()
        || provable.saturating_duration_since(Instant::now()) < usable / 2;
    let local_deadline = if verify {
        let until = deadline.max(transport.until(transport.opts.request_timeout));
        let body = LeaseRequest {
            lease_id: Some(lease.lease_id),
        };
        match transport
            .call_until::<_, RenewResponse>(resource, "renew", &body, until)
            .await
        {
            Ok((sent, renewed)) if renewed.fencing_token == lease.fencing_token => {
                instant_after(sent, usable)
            }
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
    cancel.leftover = Leftover::Nothing;
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

/// Checks a resource name like the server does (1–256 bytes of `[A-Za-z0-9._:/-]`), and that
/// it can be sent in a URL (not `.` or `..`), so a bad name fails before anything is sent.
pub(crate) fn validate_resource(resource: &str) -> Result<(), Error> {
    wire::validate_resource(resource)
        .and_then(|()| wire::resource_in_path(resource).map(drop))
        .map_err(|why| Error::Invalid(format!("resource '{resource}': {why}")))
}

/// What an acquire that ends without handing out a guard may have left on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leftover {
    /// Nothing was sent, or the answers settled that this request id holds nothing.
    Nothing,
    /// A definite refusal, after an attempt that may have queued a waiter (a long poll whose
    /// connection dropped, or a request still on its way): cancel it. A grant is ruled out:
    /// the refused attempt carried the same request id, and the server would have answered
    /// with that grant instead.
    Waiter,
    /// An attempt's outcome is unknown (no answer yet, or none that settled it), or the grant
    /// arrived but no guard was handed out: cancel a waiter, collect and release a grant.
    Unknown,
}

impl Leftover {
    /// After a definite refusal. Collecting a grant here would only replay the acquire as a
    /// fresh try-once request (a refused request id keeps no record), which could take a lock
    /// that has just come free and release it again: a token spent and a lock briefly taken
    /// by nobody.
    fn after_refusal(maybe_waiting: bool) -> Leftover {
        if maybe_waiting {
            Leftover::Waiter
        } else {
            Leftover::Nothing
        }
    }
}

/// Cleans up after an acquire that ends without handing a guard to the caller: the future was
/// dropped (caller gave up, `select!` lost, timeout), or it failed after an attempt whose
/// outcome we never learned. In a spawned task:
///
/// 1. `cancel` with the request id removes a queued waiter (`cancelled: true`: done).
/// 2. Otherwise (`cancelled: false`) the request id is not waiting: it was granted (the answer
///    was lost, or the lock was handed to us as we went), or the server never saw it. The
///    acquire is sent once more, try-once, with the same request id: the server's dedup
///    returns the original grant if there is one, and that lease is released, so the lock
///    does not sit idle for a whole TTL. Had the acquire never reached the server, this
///    replay is a fresh try-once acquire: it may take the lock, and releases it at once.
/// 3. A waiting acquire whose replay is refused (`lock_held`) is cancelled once more: the
///    original request may have reached the server after the first cancel and be waiting now.
///
/// After a definite refusal only step 1 runs (see [`Leftover`]). All of it is best effort,
/// bounded by `call_timeout`; what it misses is bounded by the wait timeout and the TTL.
struct CancelOnDrop {
    transport: Arc<Transport>,
    resource: String,
    request_id: String,
    holder: Option<String>,
    ttl_ms: Option<u64>,
    /// The acquire asked to wait, so a waiter may exist for its request id.
    waits: bool,
    leftover: Leftover,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.leftover == Leftover::Nothing {
            return;
        }
        // No runtime (process shutting down): the server drops the waiter when our
        // connection closes, and its wait deadline and the TTL bound the rest.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let transport = self.transport.clone();
        let resource = std::mem::take(&mut self.resource);
        let collect = self.leftover == Leftover::Unknown;
        let waits = self.waits;
        let replay = AcquireRequest {
            request_id: std::mem::take(&mut self.request_id),
            holder: self.holder.take(),
            ttl_ms: self.ttl_ms,
            wait_timeout_ms: None,
        };
        rt.spawn(async move {
            let until = transport.until(transport.opts.call_timeout);
            if !cancel_wait(&transport, &resource, &replay.request_id, until).await || !collect {
                return;
            }
            if !release_unseen(&transport, &resource, &replay, until).await && waits {
                cancel_wait(&transport, &resource, &replay.request_id, until).await;
            }
        });
    }
}

/// Cancels a waiting acquire. `true` if the server answered that the request id was not
/// waiting (there may be a grant to collect).
async fn cancel_wait(
    transport: &Transport,
    resource: &str,
    request_id: &str,
    until: Instant,
) -> bool {
    let cancel = CancelRequest {
        request_id: request_id.to_string(),
    };
    match transport
        .call_until::<_, CancelResponse>(resource, "cancel", &cancel, until)
        .await
    {
        Ok((_, answer)) if answer.cancelled => {
            tracing::debug!(%resource, "abandoned acquire's wait cancelled");
            false
        }
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(%resource, error = ?e, "cancel of an abandoned acquire failed; the server's wait deadline will remove it");
            false
        }
    }
}

/// Releases the grant of an abandoned acquire that was not waiting, if it got one: sent again
/// (try-once), its request id returns the grant (a retry never makes a second one). Had the
/// acquire never reached the server, this call may take the lock now, and it is released at
/// once as well. `false` if the replay was refused, e.g. `lock_held`: held by another lease,
/// or (for a waiting acquire) this request id is waiting after all.
async fn release_unseen(
    transport: &Transport,
    resource: &str,
    replay: &AcquireRequest,
    until: Instant,
) -> bool {
    let lease = match transport
        .call_until::<_, wire::AcquireResponse>(resource, "acquire", replay, until)
        .await
    {
        Ok((_, lease)) => lease,
        Err(CallFailure::Api(_)) => return false,
        Err(e) => {
            tracing::warn!(%resource, error = ?e, "could not learn whether an abandoned acquire was granted; its TTL bounds it");
            return true;
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
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definite_refusal_never_replays_the_acquire() {
        // Replaying would be a fresh try-once acquire that can take a lock just come free.
        assert_eq!(Leftover::after_refusal(true), Leftover::Waiter);
        assert_eq!(Leftover::after_refusal(false), Leftover::Nothing);
    }
}
