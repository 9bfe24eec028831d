//! A per-node fault layer sitting in the peer transport.
//!
//! Every outgoing peer request (raft RPCs and forwarded client commands) passes
//! [`FaultLayer::outgoing`], and every incoming one [`FaultLayer::incoming_allowed`], so one
//! rule on each side of a link partitions it in both directions. Rules are per peer node id.
//! The layer also carries an offset for this node's wall clock, the time source the leader
//! stamps commands with, so clock skew can be injected too.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What happens to traffic between this node and one peer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// Drop everything in both directions (a partition).
    #[serde(default)]
    pub blocked: bool,
    /// Delay every outgoing request by this long.
    #[serde(default)]
    pub delay_ms: u64,
    /// Drop this fraction (0.0–1.0) of outgoing requests.
    #[serde(default)]
    pub drop_rate: f64,
}

/// The whole fault configuration of a node, as shown and set by the admin endpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultSnapshot {
    #[serde(default)]
    pub peers: BTreeMap<u64, FaultRule>,
    #[serde(default)]
    pub clock_offset_ms: i64,
}

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

    /// This node's wall clock in ms since the Unix epoch, plus any injected offset.
    pub fn now_ms(&self) -> u64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        wall.saturating_add_signed(self.read().clock_offset_ms)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, FaultSnapshot> {
        // The lock only guards plain data; a poisoned lock still holds a consistent value.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, FaultSnapshot> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}
