//! The state a lease guard shares with its renewal task and its fenced requests: the lease,
//! its local deadline and whether it is still valid.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue};
use tokio::sync::watch;

use super::schedule::instant_after;
use super::{Error, Lease, LostReason};
use crate::wire::{LeaseRequest, FENCE_RESOURCE_HEADER, FENCE_TOKEN_HEADER};

/// State shared by the guard, its renewal task and fenced requests.
pub(crate) struct LeaseState {
    pub lease: Lease,
    pub ttl: Duration,
    pub margin: Duration,
    validity: Mutex<Validity>,
    /// `true` while valid; flips to `false` once, when the guard turns invalid.
    valid_tx: watch::Sender<bool>,
    pub renewals: AtomicU64,
}

struct Validity {
    deadline: Instant,
    lost: Option<LostReason>,
}

impl LeaseState {
    pub fn new(lease: Lease, margin: Duration, deadline: Instant) -> Self {
        let ttl = lease.ttl();
        LeaseState {
            lease,
            ttl,
            margin,
            validity: Mutex::new(Validity {
                deadline,
                lost: None,
            }),
            valid_tx: watch::Sender::new(true),
            renewals: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Validity> {
        // The critical sections cannot panic, so a poisoned lock still holds consistent data.
        self.validity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The local deadline if still valid, else why not. Reads the clock itself, so a guard
    /// whose renewal task is stalled (or whose process was paused) still answers correctly.
    pub fn status(&self) -> Result<Instant, LostReason> {
        let mut v = self.lock();
        if let Some(reason) = v.lost {
            return Err(reason);
        }
        if Instant::now() >= v.deadline {
            v.lost = Some(LostReason::Unconfirmed);
            drop(v);
            self.valid_tx.send_replace(false);
            return Err(LostReason::Unconfirmed);
        }
        Ok(v.deadline)
    }

    pub fn check(&self) -> Result<(), Error> {
        self.status().map(|_| ()).map_err(Error::LeaseInvalid)
    }

    pub fn deadline(&self) -> Instant {
        self.lock().deadline
    }

    pub fn lost_reason(&self) -> Option<LostReason> {
        self.status().err()
    }

    /// Marks the guard invalid (the first reason sticks) and wakes every watcher.
    pub fn invalidate(&self, reason: LostReason) {
        let mut v = self.lock();
        if v.lost.is_none() {
            v.lost = Some(reason);
        }
        drop(v);
        self.valid_tx.send_replace(false);
    }

    /// Records a successful renewal sent at `sent`. A renewal that lands after the guard
    /// already turned invalid does not revive it: callers may have stopped work on the
    /// strength of `lost()`, and flapping would make that signal useless.
    pub fn extend(&self, sent: Instant) -> bool {
        let mut v = self.lock();
        if v.lost.is_some() || Instant::now() >= v.deadline {
            v.lost.get_or_insert(LostReason::Unconfirmed);
            drop(v);
            self.valid_tx.send_replace(false);
            return false;
        }
        v.deadline = v
            .deadline
            .max(instant_after(sent, self.ttl.saturating_sub(self.margin)));
        drop(v);
        self.renewals.fetch_add(1, Ordering::Relaxed);
        true
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.valid_tx.subscribe()
    }

    /// The renew and release body for this lease.
    pub fn body(&self) -> LeaseRequest {
        LeaseRequest {
            lease_id: Some(self.lease.lease_id),
        }
    }
}

pub(crate) fn fence_headers(state: &LeaseState) -> Result<HeaderMap, Error> {
    let mut h = HeaderMap::new();
    h.insert(
        FENCE_TOKEN_HEADER,
        HeaderValue::from(state.lease.fencing_token),
    );
    let resource = HeaderValue::from_str(&state.lease.resource)
        .map_err(|_| Error::Invalid("resource is not a valid header value".into()))?;
    h.insert(FENCE_RESOURCE_HEADER, resource);
    Ok(h)
}
