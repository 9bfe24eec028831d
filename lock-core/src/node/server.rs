//! Node state, the write path (propose, forward to leader) and the linearizable read path.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{Config as RaftConfig, ServerState};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::NodeConfig;
use super::metrics::Metrics;
use super::waits::{WaitOutcome, WaitRegistry};
use crate::machine::{Command, Effect, Proposal, Response};
use crate::net::{FaultLayer, NetworkFactory, PeerClient, PeerError};
use crate::raft::{FencegateRaft, NodeInfo, RaftConfigExt};
use crate::store::{self, EffectSink, SharedMachine};

/// Fatal errors starting or running a node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error("storage: {0}")]
    Storage(#[from] store::StoreError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Why a command could not be committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// This node is not the leader; it names the leader if it knows one.
    #[error("not the leader (leader: {0:?})")]
    NotLeader(Option<u64>),
    /// No quorum answered within the write timeout.
    #[error("no quorum within the write timeout")]
    NoQuorum,
    /// The raft node stopped.
    #[error("raft stopped: {0}")]
    Stopped(String),
}

/// State shared by the HTTP handlers and background tasks of one node.
pub struct Node {
    pub id: u64,
    pub config: NodeConfig,
    pub raft: FencegateRaft,
    pub machine: SharedMachine,
    pub peers: PeerClient,
    pub waits: WaitRegistry,
    pub metrics: Metrics,
    pub advertise_addr: String,
}

impl Node {
    pub fn faults(&self) -> &FaultLayer {
        self.peers.faults()
    }

    /// The leader's clock; also what this node stamps with when it is the leader.
    pub fn now_ms(&self) -> u64 {
        self.faults().now_ms()
    }

    fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.config.policy.write_timeout_ms)
    }

    pub fn current_leader(&self) -> Option<u64> {
        self.raft.metrics().borrow().current_leader
    }

    fn member_addr(&self, id: u64) -> Option<String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.api_addr.clone())
    }

    /// Commits `cmd` through raft wherever the leader is, and returns the state machine's
    /// response. Answers `NoQuorum` within the write timeout rather than hanging.
    ///
    /// Retrying a command is safe: acquires are deduplicated by request id, renew, release
    /// and cancel are idempotent in effect, and ticks only act on what is due.
    pub async fn propose(&self, cmd: Command) -> Result<Response, ProposeError> {
        let deadline = Instant::now() + self.write_timeout();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ProposeError::NoQuorum);
            }
            let leader = match self.propose_local(cmd.clone(), remaining).await {
                Err(ProposeError::NotLeader(leader)) => leader,
                other => return other,
            };
            if let Some(leader) = leader.filter(|l| *l != self.id) {
                if let Some(addr) = self.member_addr(leader) {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    let reply: Result<Result<Response, ProposeError>, PeerError> = self
                        .peers
                        .post(leader, &addr, "/internal/propose", &cmd, remaining)
                        .await;
                    match reply {
                        Ok(Ok(resp)) => return Ok(resp),
                        Ok(Err(ProposeError::NotLeader(_))) | Err(_) => {}
                        Ok(Err(e)) => return Err(e),
                    }
                }
            }
            // No usable leader yet (election in progress, or it is unreachable): wait a beat.
            tokio::time::sleep(Duration::from_millis(50).min(remaining)).await;
        }
    }

    /// Proposes on this node if it is the leader; never forwards.
    pub async fn propose_local(
        &self,
        cmd: Command,
        timeout: Duration,
    ) -> Result<Response, ProposeError> {
        let leader = self.current_leader();
        if leader != Some(self.id) {
            return Err(ProposeError::NotLeader(leader));
        }
        let proposal = Proposal {
            now_ms: self.now_ms(),
            failover_grace_ms: self.config.policy.failover_grace_ms,
            cmd,
        };
        let started = Instant::now();
        let result = tokio::time::timeout(timeout, self.raft.client_write(proposal)).await;
        match result {
            Err(_) => Err(ProposeError::NoQuorum),
            Ok(Ok(resp)) => {
                self.metrics
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
                Ok(resp.data)
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader(f.leader_id))
            }
            Ok(Err(RaftError::APIError(e))) => Err(ProposeError::Stopped(e.to_string())),
            Ok(Err(RaftError::Fatal(f))) => Err(ProposeError::Stopped(f.to_string())),
        }
    }

    /// Waits until this node's state machine reflects every write committed before the call
    /// (a read index obtained from the leader, which confirms its leadership with a quorum).
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        let deadline = Instant::now() + self.write_timeout();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ProposeError::NoQuorum);
            }
            let leader = match self.local_read_index(remaining).await {
                Ok(index) => return self.wait_applied(index, deadline).await,
                Err(ProposeError::NotLeader(leader)) => leader,
                Err(e) => return Err(e),
            };
            if let Some(leader) = leader.filter(|l| *l != self.id) {
                if let Some(addr) = self.member_addr(leader) {
                    let reply: Result<Result<u64, ProposeError>, PeerError> = self
                        .peers
                        .post(leader, &addr, "/internal/read_index", &(), remaining)
                        .await;
                    match reply {
                        Ok(Ok(index)) => return self.wait_applied(index, deadline).await,
                        Ok(Err(ProposeError::NotLeader(_))) | Err(_) => {}
                        Ok(Err(e)) => return Err(e),
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50).min(remaining)).await;
        }
    }

    /// On the leader: confirms leadership with a quorum and returns the index reads must see.
    pub async fn local_read_index(&self, timeout: Duration) -> Result<u64, ProposeError> {
        let leader = self.current_leader();
        if leader != Some(self.id) {
            return Err(ProposeError::NotLeader(leader));
        }
        match tokio::time::timeout(timeout, self.raft.ensure_linearizable()).await {
            Err(_) => Err(ProposeError::NoQuorum),
            Ok(Ok(log_id)) => Ok(log_id.map_or(0, |l| l.index)),
            Ok(Err(RaftError::APIError(e))) => match e {
                openraft::error::CheckIsLeaderError::ForwardToLeader(f) => {
                    Err(ProposeError::NotLeader(f.leader_id))
                }
                openraft::error::CheckIsLeaderError::QuorumNotEnough(_) => {
                    Err(ProposeError::NoQuorum)
                }
            },
            Ok(Err(RaftError::Fatal(f))) => Err(ProposeError::Stopped(f.to_string())),
        }
    }

    async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), ProposeError> {
        if self.machine.last_applied_index() >= index {
            return Ok(());
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        self.raft
            .wait(Some(remaining))
            .applied_index_at_least(Some(index), "read barrier")
            .await
            .map(|_| ())
            .map_err(|_| ProposeError::NoQuorum)
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

/// A started node. Dropping it does not stop the node; call [`NodeHandle::shutdown`].
pub struct NodeHandle {
    pub node: Arc<Node>,
    pub addr: std::net::SocketAddr,
    shutdown_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    server: JoinHandle<()>,
}

impl NodeHandle {
    /// Stops serving, stops raft and waits for the background tasks.
    pub async fn shutdown(self) {
        let _ = self.shutdown_tx.send(true);
        // In-flight long-polls get a moment to finish, then the server is cut.
        let mut server = self.server;
        if tokio::time::timeout(Duration::from_secs(2), &mut server)
            .await
            .is_err()
        {
            server.abort();
        }
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.node.raft.shutdown().await;
    }

    /// Simulates a crash: everything stops at once, nothing is flushed beyond what was
    /// already acknowledged as durable.
    pub async fn crash(self) {
        self.server.abort();
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.node.raft.shutdown().await;
    }
}

/// Opens storage, starts raft and serves the API on `listener`.
pub async fn start(config: NodeConfig, listener: TcpListener) -> Result<NodeHandle, NodeError> {
    let addr = listener.local_addr()?;
    let advertise_addr = config
        .advertise_addr
        .clone()
        .unwrap_or_else(|| addr.to_string());
    let faults = FaultLayer::new();
    let peers = PeerClient::new(config.id, faults);
    let waits = WaitRegistry::default();
    let metrics = Metrics::new(config.id);

    let sink: EffectSink = {
        let waits = waits.clone();
        let metrics = metrics.clone();
        Arc::new(move |_index, effects: &[Effect]| dispatch_effects(&waits, &metrics, effects))
    };
    std::fs::create_dir_all(&config.data_dir)?;
    let (log_store, mut sm_store) = store::open(&config.data_dir, sink)?;
    sm_store.observe_apply_with(metrics.apply_seconds.clone());
    let machine = sm_store.shared();

    let raft_config = RaftConfig::fencegate_default()
        .validate()
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    let raft = FencegateRaft::new(
        config.id,
        Arc::new(raft_config),
        NetworkFactory::new(peers.clone()),
        log_store,
        sm_store,
    )
    .await
    .map_err(|e| NodeError::Raft(e.to_string()))?;

    let node = Arc::new(Node {
        id: config.id,
        config,
        raft,
        machine,
        peers,
        waits,
        metrics,
        advertise_addr,
    });

    maybe_initialize(&node).await?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let tasks = vec![
        tokio::spawn(super::sweeper::run(node.clone())),
        tokio::spawn(watch_leader(node.clone())),
    ];
    let app = crate::api::router(node.clone());
    let server = tokio::spawn(async move {
        let mut rx = shutdown_rx;
        let shutdown = async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "API server stopped");
        }
    });
    Ok(NodeHandle {
        node,
        addr,
        shutdown_tx,
        tasks,
        server,
    })
}

/// The founding member with the lowest id initialises a brand-new cluster. Everyone else
/// (and every restart) finds the membership in its log.
async fn maybe_initialize(node: &Arc<Node>) -> Result<(), NodeError> {
    let members = &node.config.initial_members;
    if members.keys().next() != Some(&node.id) {
        return Ok(());
    }
    let initialized = node
        .raft
        .is_initialized()
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    if initialized {
        return Ok(());
    }
    let nodes: BTreeMap<u64, NodeInfo> = members
        .iter()
        .map(|(id, addr)| {
            let api_addr = if *id == node.id {
                node.advertise_addr.clone()
            } else {
                addr.clone()
            };
            (*id, NodeInfo { api_addr })
        })
        .collect();
    node.raft
        .initialize(nodes)
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))
}

fn dispatch_effects(waits: &WaitRegistry, metrics: &Metrics, effects: &[Effect]) {
    for e in effects {
        match e {
            Effect::HandedOff { request_id, grant } => {
                metrics.handoffs.inc();
                waits.notify(
                    &grant.resource,
                    request_id,
                    WaitOutcome::Granted(grant.clone()),
                );
            }
            Effect::WaiterRemoved {
                resource,
                request_id,
                reason,
            } => {
                if *reason == crate::machine::WaiterGone::TimedOut {
                    metrics.waiter_timeouts.inc();
                }
                waits.notify(resource, request_id, WaitOutcome::Removed(*reason));
            }
            Effect::Expired { .. } => metrics.expirations.inc(),
        }
    }
}

/// Counts leader changes and measures how long the node was without a leader.
async fn watch_leader(node: Arc<Node>) {
    let mut rx = node.raft.metrics();
    let mut last_leader = rx.borrow().current_leader;
    let mut leaderless_since: Option<Instant> = last_leader.is_none().then(Instant::now);
    while rx.changed().await.is_ok() {
        let leader = rx.borrow().current_leader;
        if leader == last_leader {
            continue;
        }
        match leader {
            None => leaderless_since = Some(Instant::now()),
            Some(l) => {
                node.metrics.leader_changes.inc();
                if let Some(since) = leaderless_since.take() {
                    node.metrics
                        .election_seconds
                        .observe(since.elapsed().as_secs_f64());
                }
                tracing::info!(node = node.id, leader = l, "leader changed");
            }
        }
        last_leader = leader;
    }
}
