//! A running fencegate node: raft, storage, the clock and the write and read paths.
//!
//! [`Node`] is the shared state the API handlers and background tasks see. [`start`] opens
//! storage, starts raft and the node's background tasks; serving the HTTP API on top of it is
//! the [`api`](crate::api) layer's job, and [`crate::server`] puts the two together.

mod auth;
mod batcher;
mod campaign;
mod clock;
mod commands;
mod config;
mod error;
mod forward;
mod limits;
mod member_api;
mod metrics;
pub mod ops;
mod propose;
mod read;
mod read_rounds;
mod restore;
mod revocations;
mod snapshots;
mod start;
mod sweeper;
mod vote_hold;
mod waits;

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;

pub use auth::{
    constant_time_eq, key_digest, new_api_key, AuthMode, Caller, Denied, TenantPolicy, TenantRates,
};
pub use campaign::{
    hand_over, CampaignNowRequest, CampaignNowResponse, PreVoteRequest, PreVoteResponse,
    CAMPAIGN_NOW_PATH, PRE_VOTE_PATH,
};
pub(crate) use clock::monotonic_ms;
pub use clock::Clock;
pub use config::{MemberAddrs, NodeConfig, Policy, MAX_FAILOVER_GRACE_MS};
pub use error::{NodeError, ProposeError};
pub use forward::{ForwardReply, FORWARD_PATH, PROPOSE_BATCH_PATH};
pub use limits::{HttpLimits, TlsFiles, MIN_HEADER_BYTES};
pub use member_api::{MemberApiAnswer, MemberApiCall, MAX_MEMBER_API_ANSWER, MEMBER_API_PATH};
pub use metrics::{Metrics, HOT_ACQUIRES_PER_S, HOT_FENCE_REJECTIONS, HOT_IN_METRICS};
pub use propose::Committed;
pub use read::ReadFailure;
pub use read_rounds::READ_INDEX_PATH;
pub use restore::{
    check_empty as check_restore_target, prepare_backup, restore_data_dir, restored_at_ms,
    BackupError, RESTORED_FILE, RESTORING_FILE,
};
pub use revocations::{Revocation, Revocations};
pub use start::{check_own_entry, start, RunningNode};
pub use waits::{WaitOutcome, WaitRegistry, WaitTicket};

use crate::net::{FaultLayer, PeerClient};
use crate::raft::{FencegateRaft, NodeInfo};
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
    /// The addresses this node announces to the cluster.
    pub advertise: NodeInfo,
    /// Commands for the leader's next raft write.
    writes: batcher::BatchQueue,
    /// Commands for the next batch forwarded to the leader.
    forwards: forward::ForwardQueue,
    /// Reads waiting for the next read index (see `read_rounds`).
    reads: read_rounds::ReadIndexQueue,
    /// The operators' view: audit log, activity counters, member health, metrics history.
    pub ops: Arc<ops::OpsState>,
    /// Each tenant's lock-call rate on this node (with authentication on).
    pub tenant_rates: TenantRates,
    /// Whether this node, started with an empty data directory, still holds back its vote.
    pub vote_hold: vote_hold::VoteHold,
    /// When this node last heard from a leader (it decides when to campaign).
    pub leader_contact: campaign::LeaderContact,
    /// Held while a pre-vote round and the election it may start run: one at a time.
    campaign_round: tokio::sync::Mutex<()>,
    /// What a backup reads: the current snapshot and the idempotency records.
    backups: crate::store::BackupSource,
    /// Turns true when the node begins to shut down (see [`Node::begin_stopping`]).
    stopping: tokio::sync::watch::Sender<bool>,
    /// Whether this node is in touch with a leader ([`Node::leader_in_touch`]), as last seen
    /// (looked at every 100 ms). Waiting acquires watch it instead of asking raft each.
    pub(crate) in_touch: tokio::sync::watch::Sender<bool>,
    /// When a restore from a backup made this node's data directory (wall clock, ms), if one
    /// did ([`RESTORED_FILE`]).
    pub restored_at_ms: Option<u64>,
}

impl Node {
    /// Tells the calls that wait on this node (queued acquires) that it is shutting down, so
    /// they answer now instead of being cut off when the drain time is over.
    pub fn begin_stopping(&self) {
        self.stopping.send_replace(true);
    }

    /// Why raft stopped on its own (a disk that is full or failing, a storage error), if it
    /// did: the node then serves nothing, and only a restart can bring it back.
    pub fn raft_failure(&self) -> Option<String> {
        if *self.stopping.borrow() {
            return None;
        }
        let m = self.raft.metrics();
        let failure = match &m.borrow().running_state {
            Ok(()) | Err(openraft::error::Fatal::Stopped) => None,
            Err(e) => Some(e.to_string()),
        };
        failure
    }

    /// Completes, with the cause, when raft stops on its own (see [`Node::raft_failure`]);
    /// never during a shutdown. Watches the server metrics, which change with the role and
    /// end with raft's core, not with every write as the full metrics do.
    pub async fn raft_failed(&self) -> String {
        let mut rx = self.raft.server_metrics();
        loop {
            if let Some(cause) = self.raft_failure() {
                return cause;
            }
            if rx.changed().await.is_err() {
                // The metrics end with raft's core; read the cause it left, if any.
                if let Some(cause) = self.raft_failure() {
                    return cause;
                }
                std::future::pending::<()>().await;
            }
        }
    }

    /// Completes once the node has begun to shut down.
    pub async fn stopping(&self) {
        let mut stopping = self.stopping.subscribe();
        let _ = stopping.wait_for(|s| *s).await;
    }

    pub fn faults(&self) -> &FaultLayer {
        self.peers.faults()
    }

    /// What this node stamps its proposals with when it is the leader (see [`Clock`]).
    pub fn now_ms(&self) -> u64 {
        let term = self.raft.metrics().borrow().current_term;
        let log_now = self.machine.read(|m| m.now_ms());
        self.clock.stamp(term, log_now)
    }

    /// This node's wall clock, for what operators read next to other logs: audit lines, the
    /// hot-resource events, metric samples, elections, probes. Never for lease time, which is
    /// log time ([`Node::now_ms`]): log time pauses during elections and so falls behind the
    /// wall clock by their length.
    pub fn wall_ms(&self) -> u64 {
        clock::unix_ms()
    }

    fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.config.policy.write_timeout_ms)
    }

    /// The leader this node is in touch with: as a follower, one it heard from (an append or a
    /// snapshot chunk) within the election timeout's upper end twice over; as the leader,
    /// itself while a quorum acknowledged it that recently. `None` for a node cut off from the
    /// cluster, which raft's own view does not show: it keeps naming the last leader it knew.
    pub fn leader_in_touch(&self) -> Option<u64> {
        let window =
            std::time::Duration::from_millis(2 * self.config.raft.election_timeout_max_ms());
        let (state, quorum_ack_ms, voters) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let voters = m.membership_config.membership().voter_ids().count();
            (m.state, m.millis_since_quorum_ack, voters)
        };
        if state == ServerState::Leader {
            let acked =
                voters <= 1 || quorum_ack_ms.is_some_and(|ms| u128::from(ms) <= window.as_millis());
            return acked.then_some(self.id);
        }
        let heard = self
            .leader_contact
            .last()
            .is_some_and(|at| at.elapsed() <= window);
        self.current_leader().filter(|_| heard)
    }

    /// Returns once this node has lost touch with the leader ([`Node::leader_in_touch`] is
    /// `None`). A long poll waiting here for a hand-off ends then: a node cut off from the
    /// cluster would not hear of the grant until it is healed.
    pub async fn cut_off(&self) {
        let mut in_touch = self.in_touch.subscribe();
        loop {
            let _ = in_touch.wait_for(|in_touch| !*in_touch).await;
            // The watch may lag by a tick (a node just started): ask raft itself.
            if self.leader_in_touch().is_none() {
                return;
            }
            if in_touch.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// This node's answer to a candidate asking whether it would get its vote.
    pub fn pre_vote(&self, req: &PreVoteRequest) -> campaign::PreVoteResponse {
        campaign::answer(self, req)
    }

    /// This node's answer to its leader asking it to campaign at once (the leader steps aside).
    pub async fn campaign_now(self: &Arc<Self>, req: &CampaignNowRequest) -> CampaignNowResponse {
        campaign::campaign_now(self, req).await
    }

    /// The leader as this node knows it. A node that names itself but is not leader (one
    /// that was leader and was removed from the voters) knows none: raft's metrics keep
    /// naming it, and a call would wait on a leader that is not there.
    pub fn current_leader(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        match m.current_leader {
            Some(l) if l == self.id && m.state != ServerState::Leader => None,
            known => known,
        }
    }

    /// The peer address of a member (where forwarded commands go), from the current
    /// membership.
    pub fn member_addr(&self, id: u64) -> Option<String> {
        self.member(id).map(|n| n.peer_addr().to_string())
    }

    /// The public API address of a member, from the current membership.
    pub fn member_api_addr(&self, id: u64) -> Option<String> {
        self.member(id).map(|n| n.api_addr)
    }

    fn member(&self, id: u64) -> Option<NodeInfo> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config.membership().get_node(&id).cloned()
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
        // A leader no quorum acknowledges does not count: raft keeps the role until it hears
        // of a newer term, which a leader cut off from the others never does.
        m.is_leader
            .set(i64::from(self.leader_in_touch() == Some(self.id)));
        m.last_applied
            .set(rm.last_applied.map_or(0, |l| l.index) as i64);
        // With API keys on, /metrics (open to scrapers without a credential) names no
        // resource: names carry tenants and what they lock. The admin API's hot view has them.
        if self.auth_on() {
            return;
        }
        // The top resources change: the series of those that left the top go with them. Only
        // resources that are hot by an absolute bar are named: under an even spread the top
        // ten change at every scrape, and each new name is a new series for Prometheus.
        let [by_rate, _, by_rejections] = self.ops.hot.top(self.wall_ms(), HOT_IN_METRICS);
        for (gauge, top, bar) in [
            (&m.hot_acquire_rate, by_rate, HOT_ACQUIRES_PER_S),
            (&m.hot_fence_rejections, by_rejections, HOT_FENCE_REJECTIONS),
        ] {
            gauge.reset();
            for e in top.into_iter().filter(|e| e.value >= bar) {
                gauge.with_label_values(&[&e.resource]).set(e.value);
            }
        }
    }
}
