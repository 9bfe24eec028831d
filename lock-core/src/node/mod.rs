//! A running fencegate node: raft, storage, the clock and the write and read paths.
//!
//! [`Node`] is the shared state the API handlers and background tasks see. [`start`] opens
//! storage, starts raft and the node's background tasks; serving the HTTP API on top of it is
//! the [`api`](crate::api) layer's job, and [`crate::server`] puts the two together.

mod clock;
mod commands;
mod config;
mod error;
mod metrics;
pub mod ops;
mod propose;
mod read;
mod revocations;
mod start;
mod sweeper;
mod waits;

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;

pub use clock::Clock;
pub use config::{NodeConfig, Policy, MAX_FAILOVER_GRACE_MS};
pub use error::{NodeError, ProposeError};
pub use metrics::Metrics;
pub use revocations::{Revocation, Revocations};
pub use start::{start, RunningNode};
pub use waits::{WaitOutcome, WaitRegistry, WaitTicket};

use crate::net::{FaultLayer, PeerClient};
use crate::raft::FencegateRaft;
use crate::store::SharedMachine;

/// State shared by the HTTP handlers and background tasks of one node.
pub struct Node {
    pub id: u64,
    pub config: NodeConfig,
    pub raft: FencegateRaft,
    pub machine: SharedMachine,
    pub peers: PeerClient,
    pub waits: WaitRegistry,
    pub revocations: Revocations,
    pub metrics: Metrics,
    pub clock: Clock,
    pub advertise_addr: String,
    /// The operators' view: audit log, activity counters, member health, metrics history.
    pub ops: Arc<ops::OpsState>,
}

impl Node {
    pub fn faults(&self) -> &FaultLayer {
        self.peers.faults()
    }

    /// What this node stamps its proposals with when it is the leader.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.config.policy.write_timeout_ms)
    }

    pub fn current_leader(&self) -> Option<u64> {
        self.raft.metrics().borrow().current_leader
    }

    /// The API address of a member, from the current membership.
    pub fn member_addr(&self, id: u64) -> Option<String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.api_addr.clone())
    }

    /// Refreshes the gauges that mirror state, just before a scrape.
    pub fn refresh_gauges(&self) {
        let stats = self.machine.read(|m| m.stats());
        let m = &self.metrics;
        m.active_locks.set(stats.active_locks as i64);
        m.waiters.set(stats.waiters as i64);
        m.resources.set(stats.resources as i64);
        m.last_token.set(stats.last_token as i64);
        let rm = self.raft.metrics().borrow().clone();
        m.term.set(rm.current_term as i64);
        m.is_leader.set(i64::from(rm.state == ServerState::Leader));
        m.last_applied
            .set(rm.last_applied.map_or(0, |l| l.index) as i64);
    }
}
