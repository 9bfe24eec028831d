//! A per-node fault layer sitting in the peer transport.
//!
//! Every outgoing peer request (raft RPCs and forwarded client commands) passes
//! [`FaultLayer::outgoing`], and every incoming one [`FaultLayer::incoming_allowed`], so one
//! rule on each side of a link partitions it in both directions. Rules are per peer node id.
//! The layer also carries a skew for this node's clock (read by the node's clock, which the
//! leader stamps commands with), so clock skew can be injected too.

use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use crate::wire::{FaultRule, FaultSnapshot};

#[derive(Clone, Debug, Default)]
pub struct FaultLayer {
    inner: Arc<RwLock<FaultSnapshot>>,
}

/// The request was dropped by an injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped;

impl FaultLayer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Cuts this node off from `peers` (call on both sides for a symmetric partition, or use
    /// the test harness helpers that do).
    pub fn block(&self, peers: impl IntoIterator<Item = u64>) {
        let mut s = self.write();
        for p in peers {
            s.peers.entry(p).or_default().blocked = true;
        }
    }

    pub fn set_rule(&self, peer: u64, rule: FaultRule) {
        self.write().peers.insert(peer, rule);
    }

    pub fn set_clock_offset_ms(&self, offset: i64) {
        self.write().clock_offset_ms = offset;
    }

    /// Removes every fault.
    pub fn heal(&self) {
        *self.write() = FaultSnapshot::default();
    }

    pub fn replace(&self, snapshot: FaultSnapshot) {
        *self.write() = snapshot;
    }

    pub fn snapshot(&self) -> FaultSnapshot {
        self.read().clone()
    }

    /// Applies the rule for `peer` to an outgoing request: sleeps for the delay, then says
    /// whether the request may go.
    pub async fn outgoing(&self, peer: u64) -> Result<(), Dropped> {
        let rule = self.read().peers.get(&peer).cloned().unwrap_or_default();
        if rule.blocked {
            return Err(Dropped);
        }
        if rule.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(rule.delay_ms)).await;
        }
        if rule.drop_rate > 0.0 && rand::random::<f64>() < rule.drop_rate {
            return Err(Dropped);
        }
        Ok(())
    }

    pub fn incoming_allowed(&self, peer: u64) -> bool {
        !self.read().peers.get(&peer).is_some_and(|r| r.blocked)
    }

    /// The injected skew of this node's clock (see `node::Clock`).
    pub fn clock_offset_ms(&self) -> i64 {
        self.read().clock_offset_ms
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, FaultSnapshot> {
        // The lock only guards plain data; a poisoned lock still holds a consistent value.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, FaultSnapshot> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}
