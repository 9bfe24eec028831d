//! Revocations of fencing-proxy grants, as this node applies them.
//!
//! When a release ends a lease while proxies hold grants for its token, every replica emits
//! `Effect::Revoke`. The proxy running in this node subscribes here, stops forwarding that
//! token, waits for its in-flight writes, and confirms with `Command::RevokeAck`. A release
//! call waits here until the revocation completed (`Effect::Revoked`), so when it answers, the
//! released token is refused by every proxy that confirmed.

use tokio::sync::{broadcast, watch};

/// Buffered revocations per subscriber. A proxy that falls further behind misses some; it
/// then never confirms them, and the next lease waits for those grants to run out instead.
const CAPACITY: usize = 4_096;

/// One ended token that `proxies` must stop forwarding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocation {
    pub resource: String,
    pub fencing_token: u64,
    pub proxies: Vec<u64>,
}

#[derive(Clone)]
pub struct Revocations {
    tx: broadcast::Sender<Revocation>,
    /// Counts completed revocations; waiters re-check the state when it moves.
    completed: watch::Sender<u64>,
}

impl Default for Revocations {
    fn default() -> Self {
        Revocations {
            tx: broadcast::Sender::new(CAPACITY),
            completed: watch::Sender::new(0),
        }
    }
}

impl Revocations {
    pub fn subscribe(&self) -> broadcast::Receiver<Revocation> {
        self.tx.subscribe()
    }

    /// A receiver that changes whenever a revocation completes on this node.
    pub fn completions(&self) -> watch::Receiver<u64> {
        self.completed.subscribe()
    }

    pub(super) fn publish(&self, revocation: Revocation) {
        // No subscriber (no proxy in this node) is fine: the grants run out on their own.
        let _ = self.tx.send(revocation);
    }

    pub(super) fn complete(&self) {
        self.completed.send_modify(|n| *n += 1);
    }
}
