//! Starting a node: open storage, start raft, initialise a new cluster, spawn the sweeper.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::Config as RaftConfig;
use tokio::task::JoinHandle;

use super::ops::{self, Activity, AuditLog, OpsState};
use super::vote_hold::VoteHold;
use super::waits::{WaitOutcome, WaitRegistry};
use super::{Clock, Metrics, Node, NodeConfig, NodeError, Revocation, Revocations};
use crate::machine::Effect;
use crate::net::{FaultLayer, NetworkFactory, PeerClient};
use crate::raft::{FencegateRaft, NodeInfo, RaftConfigExt};
use crate::store::{self, EffectSink};
use crate::wire::ElectionRecord;

/// A node with raft and its background tasks running. Dropping it does not stop the node;
/// call [`RunningNode::stop`].
pub struct RunningNode {
    pub node: Arc<Node>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningNode {
    /// Stops the background tasks and raft. What was acknowledged as durable stays on disk;
    /// nothing else is flushed, so this is also how a crash is simulated.
    pub async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.node.raft.shutdown().await;
    }
}

/// Opens storage in `config.data_dir`, starts raft and the leader's sweeper. `api` and `peer`
/// are the addresses the caller's API and peer listeners are bound to: the advertised
/// addresses unless the config names others.
pub async fn start(
    config: NodeConfig,
    api: SocketAddr,
    peer: SocketAddr,
) -> Result<RunningNode, NodeError> {
    config.policy.validate().map_err(NodeError::Config)?;
    config.raft.validate().map_err(NodeError::Config)?;
    config
        .limits
        .validate("limits")
        .map_err(NodeError::Config)?;
    config
        .peer_limits
        .validate("peer_limits")
        .map_err(NodeError::Config)?;
    let secret = config.require_peer_secret()?;
    let advertise = NodeInfo {
        api_addr: config
            .advertise_addr
            .clone()
            .unwrap_or_else(|| api.to_string()),
        peer_addr: config
            .advertise_peer_addr
            .clone()
            .unwrap_or_else(|| peer.to_string()),
    };
    let faults = FaultLayer::new();
    let clock = Clock::new(faults.clone());
    let peers = PeerClient::new(config.id, faults, secret);
    let waits = WaitRegistry::default();
    let revocations = Revocations::default();
    let metrics = Metrics::new(config.id);
    let in_data_dir = |path: &Path| {
        let path = path.to_path_buf();
        move |source| NodeError::DataDir { path, source }
    };
    create_private_dir(&config.data_dir).map_err(in_data_dir(&config.data_dir))?;
    if config.data_dir.join(super::RESTORING_FILE).exists() {
        return Err(NodeError::Config(format!(
            "data directory {} holds an unfinished restore from a backup (its `{}` file). \
             Empty the directory and run the restore again.",
            config.data_dir.display(),
            super::RESTORING_FILE
        )));
    }
    claim_data_dir(&config.data_dir, config.id)?;
    let audit_dir = config.data_dir.join("audit");
    let audit = AuditLog::open(&audit_dir, config.audit_max_bytes, config.audit_keep)
        .map_err(in_data_dir(&audit_dir))?;
    let ops = Arc::new(OpsState::new(audit));

    // The entries in the log at start were applied by the previous run (up to its last
    // commit) and are applied again now: their hand-offs, expiries and timeouts are not new,
    // and counting them again made the counters jump at every restart.
    let replayed_until = Arc::new(AtomicU64::new(u64::MAX));
    let sink: EffectSink = {
        let waits = waits.clone();
        let revocations = revocations.clone();
        let metrics = metrics.clone();
        let ops = ops.clone();
        let replayed_until = replayed_until.clone();
        Arc::new(move |index, effects: &[Effect]| {
            let replayed = index <= replayed_until.load(Ordering::Relaxed);
            dispatch_effects(
                &waits,
                &revocations,
                (!replayed).then_some(&metrics),
                effects,
            );
            // For the operators' page only: when this node saw it, by its wall clock.
            note_effects(&ops, super::clock::unix_ms(), effects);
        })
    };
    let (mut log_store, mut sm_store) =
        store::open(&config.data_dir, sink).map_err(|e| match e {
            store::StoreError::Fjall(fjall::Error::Locked) => NodeError::DataDir {
                path: config.data_dir.clone(),
                source: std::io::Error::other(
                    "in use by another process (is a node already running on it?)",
                ),
            },
            other => other.into(),
        })?;
    // Read from the storage itself: raft's metrics start out empty and are filled in only
    // once its core has loaded the storage, so right after start they describe every node
    // as new.
    let (empty, last_index) = storage_at_start(&mut log_store, &mut sm_store)
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    replayed_until.store(last_index, Ordering::Relaxed);
    if empty {
        check_own_entry(&config, &advertise)?;
        announce_joining(&config);
    }
    log_store.observe_sync_with(metrics.log_sync_seconds.clone());
    sm_store.observe_apply_with(metrics.apply_seconds.clone());
    sm_store.observe_idem_forgotten_with(metrics.idem_forgotten.clone());
    let machine = sm_store.shared();
    let backups = sm_store.backup_source();

    let raft_config = RaftConfig::fencegate(&config.raft)
        .validate()
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    let raft = FencegateRaft::new(
        config.id,
        Arc::new(raft_config),
        NetworkFactory::new(
            peers.clone(),
            config.peer_limits.max_body_bytes,
            Duration::from_millis(config.raft.heartbeat_ms),
        ),
        log_store,
        sm_store,
    )
    .await
    .map_err(|e| NodeError::Raft(e.to_string()))?;
    let vote_hold = VoteHold::open(&config.data_dir, empty, metrics.vote_held.clone())
        .map_err(in_data_dir(&config.data_dir))?;
    // Raft never campaigns on its own: `campaign` starts each election after a pre-vote.
    raft.runtime_config().elect(false);

    let (writes, write_queue) = super::batcher::queue(
        config.max_queued_writes,
        metrics.write_queue.clone(),
        metrics.writes_refused.clone(),
    );
    let (forwards, forward_queue) = super::forward::queue();
    let (reads, read_queue) = super::read_rounds::queue();
    let restored_at_ms = super::restored_at_ms(&config.data_dir);
    let node = Arc::new(Node {
        id: config.id,
        restored_at_ms,
        config,
        raft,
        machine,
        peers,
        waits,
        revocations,
        metrics,
        clock,
        advertise,
        writes,
        forwards,
        reads,
        ops,
        tenant_rates: Default::default(),
        vote_hold,
        leader_contact: Default::default(),
        campaign_round: Default::default(),
        backups,
        stopping: tokio::sync::watch::Sender::new(false),
        in_touch: tokio::sync::watch::Sender::new(true),
    });

    maybe_initialize(&node).await?;

    let tasks = vec![
        tokio::spawn(super::batcher::run(node.clone(), write_queue)),
        tokio::spawn(super::forward::run(node.clone(), forward_queue)),
        tokio::spawn(super::read_rounds::run(node.clone(), read_queue)),
        tokio::spawn(super::sweeper::run(node.clone())),
        tokio::spawn(watch_leader(node.clone())),
        tokio::spawn(track_contact(node.clone())),
        tokio::spawn(super::campaign::run(node.clone())),
        tokio::spawn(super::snapshots::run(node.clone())),
        tokio::spawn(ops::run_health_probes(node.clone())),
        tokio::spawn(ops::run_sampler(node.clone())),
    ];
    Ok(RunningNode { node, tasks })
}

/// Whether the node's storage holds nothing at all: no vote, no log entry (kept or purged),
/// nothing applied.
/// Whether the storage is empty (a new member), and the index of the last entry in its log.
async fn storage_at_start(
    log: &mut store::LogStore,
    sm: &mut store::StateMachineStore,
) -> Result<(bool, u64), openraft::StorageError<u64>> {
    let state = log.get_log_state().await?;
    let (applied, _) = sm.applied_state().await?;
    let empty = log.read_vote().await?.is_none()
        && state.last_log_id.is_none()
        && state.last_purged_log_id.is_none()
        && applied.is_none();
    Ok((empty, state.last_log_id.map_or(0, |id| id.index)))
}

/// Creates the data directory readable by the node's user only: its raft log holds lease ids
/// (bearer capabilities) in the clear. A directory that exists keeps its mode.
pub(super) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.exists() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// The file in a data directory naming the node it belongs to.
const OWNER_FILE: &str = "node-id";

/// A data directory belongs to one node: its id is written into it at the first start, and a
/// node with another id refuses to start on it. A copy of another member's data would make this
/// node vote with a log that is not its own; a quorum of such votes can elect a leader that
/// lacks acknowledged entries, and granted leases would be lost.
pub(super) fn claim_data_dir(dir: &Path, id: u64) -> Result<(), NodeError> {
    let path = dir.join(OWNER_FILE);
    let failed = |source| NodeError::DataDir {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let owner = text.trim();
            if owner == id.to_string() {
                return Ok(());
            }
            Err(NodeError::Config(format!(
                "data directory {} belongs to node {owner} (its {OWNER_FILE} file), but this is \
                 node {id}. A node starts only on its own data directory: one copied from another \
                 member votes with that member's log, and acknowledged writes can be lost. To \
                 replace this node's data, start it on an empty directory.",
                dir.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // First start here (or a directory from a version without the file): claim it.
            let tmp = dir.join(format!("{OWNER_FILE}.tmp"));
            let mut f = std::fs::File::create(&tmp).map_err(failed)?;
            std::io::Write::write_all(&mut f, format!("{id}\n").as_bytes()).map_err(failed)?;
            f.sync_all().map_err(failed)?;
            std::fs::rename(&tmp, &path).map_err(failed)?;
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(failed)
        }
        Err(e) => Err(failed(e)),
    }
}

/// On a first start, where `initial_members` is the membership, this node's own entry must
/// name the addresses it announces. If it does not, the id is most likely another node's (a
/// copied config): started anyway, the founder would record itself under that id and the
/// real holder of the id could never join. A wildcard listen address without an advertised
/// one says nothing about where the node is reached, and is not compared.
pub fn check_own_entry(config: &NodeConfig, advertise: &NodeInfo) -> Result<(), NodeError> {
    let Some(entry) = config.initial_members.get(&config.id) else {
        return Ok(());
    };
    let wildcard = |addr: &str| {
        addr.parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_unspecified())
    };
    let differs = |ours: &str, listed: &str| !wildcard(ours) && ours != listed;
    if differs(&advertise.api_addr, &entry.api) || differs(&advertise.peer_addr, &entry.peer) {
        return Err(NodeError::Config(format!(
            "initial_members lists node {id} at api {} / peer {}, but this node announces api {} \
             / peer {} (advertise_addr and advertise_peer_addr, else listen and peer_listen). \
             Is id {id} this node's? Two nodes must never share an id.",
            entry.api,
            entry.peer,
            advertise.api_addr,
            advertise.peer_addr,
            id = config.id,
        )));
    }
    Ok(())
}

/// A new node that is not a founding member waits, unready, until a member adds it; says so,
/// since nothing else would until then.
fn announce_joining(config: &NodeConfig) {
    let id = config.id;
    if config.initial_members.is_empty() {
        tracing::warn!(
            "node {id} has no initial_members: it is not part of any cluster and waits until a \
             member adds it (`fencegate cluster add --id {id} …`); until then /readyz answers \
             503. To found a new cluster, list its members, this node among them, in \
             initial_members"
        );
    } else if !config.initial_members.contains_key(&id) {
        tracing::info!(
            "node {id} is not among initial_members: it joins once a member adds it \
             (`fencegate cluster add --id {id} …`); until then /readyz answers 503"
        );
    }
}

/// The founding member with the lowest id initialises a brand-new cluster. Everyone else
/// (and every restart) finds the membership in its log.
async fn maybe_initialize(node: &Arc<Node>) -> Result<(), NodeError> {
    if node.config.founder() != Some(node.id) {
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
    let nodes: BTreeMap<u64, NodeInfo> = node
        .config
        .initial_members
        .iter()
        .map(|(id, addrs)| {
            let info = if *id == node.id {
                node.advertise.clone()
            } else {
                NodeInfo {
                    api_addr: addrs.api.clone(),
                    peer_addr: addrs.peer.clone(),
                }
            };
            (*id, info)
        })
        .collect();
    node.raft
        .initialize(nodes)
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))
}

/// Hands the effects of an applied entry to whoever waits for them; `metrics` counts them,
/// unless the entry is being applied again after a restart.
fn dispatch_effects(
    waits: &WaitRegistry,
    revocations: &Revocations,
    metrics: Option<&Metrics>,
    effects: &[Effect],
) {
    for e in effects {
        match e {
            Effect::HandedOff { request_id, grant } => {
                if let Some(m) = metrics {
                    m.handoffs.inc();
                }
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
                if let (Some(m), crate::machine::WaiterGone::TimedOut) = (metrics, reason) {
                    m.waiter_timeouts.inc();
                }
                waits.notify(resource, request_id, WaitOutcome::Removed(*reason));
            }
            Effect::Expired { .. } => {
                if let Some(m) = metrics {
                    m.expirations.inc();
                }
            }
            Effect::Revoke {
                resource,
                fencing_token,
                proxies,
            } => revocations.publish(Revocation {
                resource: resource.clone(),
                fencing_token: *fencing_token,
                proxies: proxies.clone(),
            }),
            Effect::Revoked { .. } => revocations.complete(),
        }
    }
}

/// Hand-offs and expiries reach every replica as effects: the resource page shows them on
/// every node, not only on the one that proposed the command.
fn note_effects(ops: &OpsState, now_ms: u64, effects: &[Effect]) {
    for e in effects {
        let (resource, kind, token, outcome) = match e {
            Effect::HandedOff { grant, .. } => {
                (&grant.resource, "handoff", grant.fencing_token, "granted")
            }
            Effect::Expired {
                resource,
                fencing_token,
            } => (resource, "expire", *fencing_token, "expired"),
            Effect::WaiterRemoved { .. } | Effect::Revoke { .. } | Effect::Revoked { .. } => {
                continue
            }
        };
        ops.hot.event(
            resource,
            Activity {
                at_ms: now_ms,
                kind,
                fencing_token: Some(token),
                outcome,
            },
            None,
        );
    }
}

/// Counts leader changes and measures how long the node was without a leader. Watches raft's
/// server metrics, which change with the vote, role, leader or membership only: the full
/// metrics change with every step of every write, and this task has nothing to do then.
/// How often a node without a leader says so.
const LEADERLESS_WARN_EVERY: Duration = Duration::from_secs(10);

async fn watch_leader(node: Arc<Node>) {
    let mut rx = node.raft.server_metrics();
    let mut last_leader = rx.borrow().current_leader;
    let started = Instant::now();
    let mut leaderless_since: Option<Instant> = last_leader.is_none().then_some(started);
    let mut warned: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            _ = tick.tick() => {
                // A founding member can lead before this task first looks (no change is seen
                // then): a leader's log is caught up by definition, so it votes again.
                if node.vote_hold.is_held() && node.current_leader() == Some(node.id) {
                    node.vote_hold.release("elected leader");
                }
                if warned.is_none_or(|at| at.elapsed() >= LEADERLESS_WARN_EVERY)
                    && warn_if_leaderless(&node, started)
                {
                    warned = Some(Instant::now());
                }
                continue;
            }
        }
        let leader = rx.borrow().current_leader;
        if leader == last_leader {
            continue;
        }
        match leader {
            None => leaderless_since = Some(Instant::now()),
            Some(l) => {
                node.metrics.leader_changes.inc();
                // How long no leader was heard from: raft's view keeps naming a leader that
                // went silent, so "no leader" in its metrics covers only the vote itself. A
                // node that never knew the previous leader counts from when it saw none.
                let silent = if l == node.id {
                    node.leader_contact.silence_before_leader(true)
                } else {
                    // The new leader's first append may still be on its way.
                    wait_for_contact(&node).await
                };
                let unseen = leaderless_since.take().map(|since| since.elapsed());
                let took = silent.max(unseen);
                if let Some(took) = took {
                    node.metrics.election_seconds.observe(took.as_secs_f64());
                }
                node.ops.record_election(ElectionRecord {
                    at_ms: node.wall_ms(),
                    duration_ms: took.map_or(0, |t| t.as_millis() as u64),
                    leader_id: l,
                    // The full metrics' term: the server metrics carry the persisted vote,
                    // which can still be the previous term's in the report naming the leader.
                    term: node.raft.metrics().borrow().current_term,
                });
                tracing::info!(node = node.id, leader = l, "leader changed");
                if l == node.id {
                    node.vote_hold.release("elected leader");
                }
            }
        }
        last_leader = leader;
    }
}

/// Keeps [`Node::in_touch`] current, looking every 100 ms; a leader a quorum acknowledges
/// also notes the contact (with itself), so that once it is deposed the silence before the next
/// leader counts from its last acknowledged moment, not from the last append it received as a
/// follower before it led. Its own task: the leader watch waits for a new leader's first append.
async fn track_contact(node: Arc<Node>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let leader = node.leader_in_touch();
        node.in_touch
            .send_if_modified(|was| std::mem::replace(was, leader.is_some()) != leader.is_some());
        if leader == Some(node.id) {
            let term = node.raft.metrics().borrow().current_term;
            node.leader_contact.heard(term);
        }
    }
}

/// How long this follower heard from no leader before the current one, once the new
/// leader's first append arrived (waiting at most an election timeout's worth for it).
async fn wait_for_contact(node: &Node) -> Option<Duration> {
    let term = node.raft.metrics().borrow().current_term;
    let deadline = Instant::now() + Duration::from_millis(node.config.raft.election_timeout_ms);
    loop {
        if node.leader_contact.heard_in(term) || Instant::now() >= deadline {
            return node.leader_contact.silence_before_leader(false);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A node that has known no leader for [`LEADERLESS_WARN_EVERY`] or longer says so (at most
/// once per interval), with its term and role: a stuck candidate is otherwise silent. A
/// follower counts from the last append or snapshot chunk a leader sent it (raft's metrics
/// keep naming a leader that has gone silent), a leader from the last acknowledgement of a
/// quorum, anyone else from `started`. True if it warned.
fn warn_if_leaderless(node: &Node, started: Instant) -> bool {
    let (term, state, quorum_ack_ms) = {
        let m = node.raft.metrics();
        let m = m.borrow();
        (m.current_term, m.state, m.millis_since_quorum_ack)
    };
    if state == openraft::ServerState::Leader {
        // A leader heard from no quorum for as long as a follower may hear from no leader.
        let Some(silent_ms) = quorum_ack_ms.filter(|ms| {
            u128::from(*ms) >= LEADERLESS_WARN_EVERY.as_millis() && node.leader_in_touch().is_none()
        }) else {
            return false;
        };
        tracing::warn!(
            node = node.id,
            term,
            "this node leads term {term} but no quorum has acknowledged it for {} s: the other \
             members are down or cut off, and writes and linearizable reads here answer 503 \
             until they are back",
            silent_ms / 1000
        );
        return true;
    }
    let since = node.leader_contact.last().unwrap_or(started);
    if since.elapsed() < LEADERLESS_WARN_EVERY {
        return false;
    }
    tracing::warn!(
        node = node.id,
        term,
        state = ?state,
        "no leader heard from for {} s: this node cannot reach a majority of the members \
         (down, partitioned, another peer secret, a clock more than 60 s off), is not a member \
         any more, or is held back while it catches up",
        since.elapsed().as_secs()
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::PeerSecret;
    use crate::node::MemberAddrs;

    /// A new data directory is the node user's alone; one that exists keeps its mode.
    #[cfg(unix)]
    #[test]
    fn a_new_data_directory_is_readable_by_its_user_only() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("a/node1");
        create_private_dir(&dir).expect("create");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        create_private_dir(&dir).expect("exists");
        assert_eq!(mode(&dir), 0o750, "an existing directory keeps its mode");
    }

    fn config(id: u64) -> NodeConfig {
        let members = (1..=3)
            .map(|n| {
                let addrs = MemberAddrs {
                    api: format!("10.0.{n}.10:7001"),
                    peer: format!("10.0.{n}.10:7101"),
                };
                (n, addrs)
            })
            .collect();
        let secret = PeerSecret::new("0123456789abcdef0123").expect("secret");
        NodeConfig::new(id, "/tmp/unused", members, secret)
    }

    #[test]
    fn a_data_directory_belongs_to_the_node_that_first_used_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        claim_data_dir(dir.path(), 2).expect("first start claims it");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(OWNER_FILE)).unwrap(),
            "2\n"
        );
        claim_data_dir(dir.path(), 2).expect("its own node starts again");
        let err = claim_data_dir(dir.path(), 1).expect_err("another node is refused");
        let said = err.to_string();
        assert!(
            said.contains("belongs to node 2") && said.contains("this is node 1"),
            "{said}"
        );
    }

    fn announcing(api: &str, peer: &str) -> NodeInfo {
        NodeInfo {
            api_addr: api.into(),
            peer_addr: peer.into(),
        }
    }

    #[test]
    fn a_first_start_under_another_nodes_id_is_refused() {
        let ok = announcing("10.0.1.10:7001", "10.0.1.10:7101");
        assert!(check_own_entry(&config(1), &ok).is_ok());
        // Node 2's addresses under id 1: a copied config.
        let copied = announcing("10.0.2.10:7001", "10.0.2.10:7101");
        let err = check_own_entry(&config(1), &copied)
            .expect_err("refused")
            .to_string();
        assert!(err.contains("node 1 at api 10.0.1.10:7001"), "{err}");
        assert!(err.contains("announces api 10.0.2.10:7001"), "{err}");
        let peer_only = announcing("10.0.1.10:7001", "10.0.2.10:7101");
        assert!(check_own_entry(&config(1), &peer_only).is_err());
        // A wildcard listen address without an advertised one is not compared.
        let wildcard = announcing("0.0.0.0:7001", "[::]:7101");
        assert!(check_own_entry(&config(1), &wildcard).is_ok());
        // A node not among the initial members (one that joins later) has nothing to match.
        assert!(check_own_entry(&config(4), &copied).is_ok());
    }
}
