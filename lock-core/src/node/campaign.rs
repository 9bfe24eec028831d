//! When a node starts an election: only after a pre-vote round says it could win.
//!
//! Raft as openraft 0.9 runs it lets any voter that stops hearing from a leader raise its term
//! and campaign. A member that cannot reach the others (a one-sided partition, a wrong peer
//! secret) or that was removed from the cluster but still runs does so every election timeout,
//! and its term climbs. When it is heard again, an append to it or its vote request carries
//! that higher term, and the healthy leader steps down: an election, and a pause in service,
//! for nothing.
//!
//! So this node never lets raft campaign on its own (its `elect` switch stays off). This task
//! keeps raft's election timing instead: a follower that has heard from no leader for the
//! leader lease plus a random election timeout asks every voter first whether it *would* vote
//! for it (`/raft/pre-vote`, which changes nothing on either side). A voter says yes only if it
//! is not the leader, has not heard from a leader within the lease itself, and the candidate's
//! log is at least as complete as its own: the conditions under which its real vote could be
//! granted. With a yes from a majority of every configuration the node asks raft to elect;
//! otherwise it tries again after another election timeout, its term unchanged.
//!
//! The cost is one round trip before each election. A node of an earlier version answers the
//! pre-vote path with 404; that counts as a yes, so its real vote decides as before.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::{LogId, ServerState};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use super::Node;
use crate::net::PeerError;
use crate::timing::RaftTiming;

/// Where a node asks another whether it would get its vote.
pub const PRE_VOTE_PATH: &str = "/raft/pre-vote";

/// "Would you vote for me?": the candidate and the last entry of its log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteRequest {
    pub candidate: u64,
    pub last_log_id: Option<LogId<u64>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteResponse {
    pub granted: bool,
}

/// When this node last heard from a leader (an append or snapshot chunk it accepted), and
/// when it last heard from the leader of the term before: how long an election left it
/// without one.
#[derive(Default)]
pub struct LeaderContact(Mutex<Contacts>);

#[derive(Default)]
struct Contacts {
    /// The latest contact and the leader's term.
    last: Option<(Instant, u64)>,
    /// The first contact in that term, and the last one in the term before it.
    term_began: Option<(Instant, Option<Instant>)>,
}

impl LeaderContact {
    /// Notes a contact from the leader of `term`.
    pub fn heard(&self, term: u64) {
        let now = Instant::now();
        let mut c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match c.last {
            Some((_, t)) if t >= term => {}
            previous => c.term_began = Some((now, previous.map(|(at, _)| at))),
        }
        c.last = Some((now, term));
    }

    pub fn last(&self) -> Option<Instant> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last
            .map(|(at, _)| at)
    }

    /// How long this node heard from no leader before the current one: from the last contact
    /// of the previous term to the first of this one; for a node that became leader itself,
    /// from its last contact as a follower until now.
    pub fn silence_before_leader(&self, leader_is_self: bool) -> Option<Duration> {
        let c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if leader_is_self {
            return c.last.map(|(at, _)| at.elapsed());
        }
        let (began, previous) = c.term_began?;
        previous.map(|p| began.saturating_duration_since(p))
    }

    /// Whether a leader of `term` (or later) has been heard from.
    pub fn heard_in(&self, term: u64) -> bool {
        let c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        c.last.is_some_and(|(_, t)| t >= term)
    }

    fn within(&self, window: Duration) -> bool {
        self.last().is_some_and(|at| at.elapsed() < window)
    }
}

/// What a voter knows when it is asked for a pre-vote.
#[derive(Clone, Copy, Debug)]
pub struct VoterView {
    pub is_leader: bool,
    /// It heard from a leader within the leader lease.
    pub heard_leader: bool,
    /// It holds back its vote for this candidate (it started empty; see `VoteHold`).
    pub holds_vote: bool,
    pub last_log_id: Option<LogId<u64>>,
}

/// Whether a voter in `view` grants `req`: exactly when its real vote could be granted.
pub fn grants(view: VoterView, req: &PreVoteRequest) -> bool {
    !view.is_leader && !view.heard_leader && !view.holds_vote && req.last_log_id >= view.last_log_id
}

/// Whether the nodes in `granted` are a majority of each configuration in `configs` (one
/// outside a membership change, two during one).
pub fn is_quorum(configs: &[BTreeSet<u64>], granted: &HashSet<u64>) -> bool {
    configs
        .iter()
        .all(|voters| voters.iter().filter(|v| granted.contains(v)).count() * 2 > voters.len())
}

/// This node's answer to a pre-vote request. A leader that is stepping aside (an operator's
/// drain) answers as a voter without a leader: with another voter down, its vote is the one
/// a successor needs.
pub fn answer(node: &Node, req: &PreVoteRequest) -> PreVoteResponse {
    let draining = node.ops.draining.load(std::sync::atomic::Ordering::Acquire);
    let is_leader = node.raft.metrics().borrow().state == ServerState::Leader && !draining;
    let view = VoterView {
        is_leader,
        heard_leader: !draining && node.leader_contact.within(leader_lease(&node.config.raft)),
        holds_vote: node.config.founder().is_some_and(|f| {
            node.vote_hold
                .refuses_candidate(req.candidate, req.last_log_id, f)
        }),
        last_log_id: node.raft.data_metrics().borrow().last_log,
    };
    let granted = grants(view, req);
    tracing::debug!(candidate = req.candidate, granted, ?view, "pre-vote asked");
    PreVoteResponse { granted }
}

/// How long a voter refuses to vote after hearing from a leader (openraft's leader lease: the
/// longest election timeout).
fn leader_lease(timing: &RaftTiming) -> Duration {
    Duration::from_millis(timing.election_timeout_max_ms())
}

fn election_timeout(timing: &RaftTiming) -> Duration {
    Duration::from_millis(rand::random_range(
        timing.election_timeout_ms..=timing.election_timeout_max_ms(),
    ))
}

/// Whether this node may campaign at all. A node holding back its vote does not, except the
/// founding member of a brand-new cluster until a leader has reached it.
fn may_campaign(node: &Node) -> bool {
    // A leader that is stepping aside and lost its leadership to the successor's campaign does
    // not campaign to win it back (were that campaign to fail, another voter's timer elects).
    if node.ops.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return false;
    }
    !node.vote_hold.is_held()
        || (node.config.founder() == Some(node.id) && node.leader_contact.last().is_none())
}

fn is_voter(node: &Node, m: &openraft::RaftMetrics<u64, crate::raft::NodeInfo>) -> bool {
    m.membership_config
        .membership()
        .voter_ids()
        .any(|v| v == node.id)
}

/// Runs the election timer: see the module documentation.
pub async fn run(node: Arc<Node>) {
    let timing = node.config.raft;
    let tick = Duration::from_millis((timing.heartbeat_ms / 2).max(5));
    // The quiet time is counted from the later of the last leader contact and the last
    // attempt; after a leader contact the voters' lease must run out as well.
    let mut quiet_from = Instant::now();
    let mut after_leader = false;
    let mut timeout = election_timeout(&timing);
    loop {
        tokio::time::sleep(tick).await;
        if let Some(heard) = node.leader_contact.last().filter(|h| *h > quiet_from) {
            quiet_from = heard;
            after_leader = true;
        }
        let campaigns = {
            let m = node.raft.metrics();
            let m = m.borrow();
            m.state != ServerState::Leader && is_voter(&node, &m)
        };
        if !campaigns || !may_campaign(&node) {
            quiet_from = Instant::now();
            after_leader = false;
            continue;
        }
        let wait = if after_leader {
            timeout + leader_lease(&timing)
        } else {
            timeout
        };
        if quiet_from.elapsed() < wait {
            continue;
        }
        let round = Instant::now();
        quiet_from = round;
        after_leader = false;
        timeout = election_timeout(&timing);
        // A leader heard while the round ran (another voter won meanwhile) makes the round
        // moot: electing now would depose it and cost a second election.
        let moot = || {
            node.leader_contact
                .last()
                .is_some_and(|heard| heard > round)
        };
        campaign(&node, moot).await;
    }
}

/// One pre-vote round and, if it is won and what was learnt meanwhile does not make it
/// `moot`, an election. One round at a time: the timer and a leader's hand-over may both
/// start one. True if an election was started.
async fn campaign(node: &Arc<Node>, moot: impl Fn() -> bool) -> bool {
    let Ok(_one_round) = node.campaign_round.try_lock() else {
        return false;
    };
    if pre_vote(node, node.config.raft).await && !moot() {
        tracing::info!(node = node.id, "pre-vote won: starting an election");
        node.metrics.pre_votes.with_label_values(&["won"]).inc();
        match node.raft.trigger().elect().await {
            Ok(()) => return true,
            Err(e) => tracing::warn!(error = %e, "could not start an election"),
        }
    } else {
        node.metrics.pre_votes.with_label_values(&["lost"]).inc();
    }
    false
}

/// Where a leader that steps aside (an operator's drain) asks the follower it chose to
/// campaign at once, as etcd's leader transfer does with its "timeout now" message.
pub const CAMPAIGN_NOW_PATH: &str = "/raft/campaign-now";

/// "I am stepping aside and you hold my whole log: campaign now."
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CampaignNowRequest {
    pub leader: u64,
    pub term: u64,
    /// The leader's last log entry; the follower campaigns only if it holds it.
    pub last_log_id: Option<LogId<u64>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CampaignNowResponse {
    /// Whether the follower won its pre-vote round and started an election.
    pub started: bool,
}

/// A follower's answer to its leader's [`CampaignNowRequest`]. Only the leader it follows, in
/// the term it follows it, can ask, and only a voter holding that leader's whole log goes on.
/// It still runs the pre-vote round: the leader, stepping aside, grants it, and the other
/// voters, whose leader lease has not run out, do not, so with two of three it wins alone and
/// at once, before any other follower's timer fires. Without the hand-over both followers'
/// timers would run out together after the leader went quiet, and on a busy machine the second
/// one's election could follow the first one's and depose it.
pub async fn campaign_now(node: &Arc<Node>, req: &CampaignNowRequest) -> CampaignNowResponse {
    let eligible = {
        let m = node.raft.metrics();
        let m = m.borrow();
        is_voter(node, &m)
            && m.state == ServerState::Follower
            && m.current_leader == Some(req.leader)
            && m.current_term == req.term
    };
    let holds_log = node.raft.data_metrics().borrow().last_log >= req.last_log_id;
    // Moot once a leader of a later term is heard: a late heartbeat of the asking leader is not.
    let moot = || node.leader_contact.heard_in(req.term + 1);
    let started = eligible && holds_log && may_campaign(node) && campaign(node, moot).await;
    tracing::info!(
        node = node.id,
        leader = req.leader,
        eligible,
        holds_log,
        started,
        "the leader asked this node to campaign now"
    );
    CampaignNowResponse { started }
}

/// The leader's side of a hand-over: picks a voter that holds this leader's whole log and asks
/// it to campaign now ([`CampaignNowRequest`]). Called with proposals and heartbeats stopped,
/// so the log no longer grows. With `to`, only that voter is asked; otherwise the one whose
/// appends have lately been answered fastest (a follower behind a slow or saturated link
/// would make a poor leader), waiting a few heartbeats for it to catch up before settling for
/// the fastest one that has. Returns the voter that started an election, if one did; otherwise
/// the followers' own timers take over once their leader lease runs out (a voter of an earlier
/// version answers 404, and a leader elected less than a lease ago is refused by raft itself).
pub async fn hand_over(node: &Node, to: Option<u64>) -> Option<u64> {
    let timing = node.config.raft;
    let waited = Duration::from_millis(timing.election_timeout_max_ms());
    let heartbeat = Duration::from_millis(timing.heartbeat_ms);
    let started = Instant::now();
    let mut rx = node.raft.metrics();
    let (target, req) = loop {
        let chosen = {
            let m = rx.borrow();
            let last_log_id = node.raft.data_metrics().borrow().last_log;
            // The candidates, fastest first; a peer not answered lately comes last.
            let mut ranked: Vec<(Duration, u64)> = m
                .membership_config
                .membership()
                .voter_ids()
                .filter(|v| *v != node.id && to.is_none_or(|t| t == *v))
                .map(|v| {
                    let rtt = node.peers.append_round_trip(v, 10 * heartbeat);
                    (rtt.unwrap_or(Duration::MAX), v)
                })
                .collect();
            ranked.sort();
            let caught_up = |v: u64| {
                m.replication
                    .as_ref()
                    .and_then(|matched| matched.get(&v))
                    .is_some_and(|matched| *matched >= last_log_id)
            };
            // Only once no write is under way (none starts while draining): an entry appended
            // after `last_log_id` was read would make the leader refuse its successor's vote.
            // Then the fastest, once caught up; after a few heartbeats, the fastest caught up.
            // Raft's metrics may show the last write a moment after it returned.
            let settled = !node.writes.writing()
                && last_log_id.is_some_and(|l| l.index >= node.writes.last_written());
            let patient = started.elapsed() < 4 * heartbeat;
            let pick = match ranked.first() {
                _ if !settled => None,
                Some((_, best)) if caught_up(*best) => Some(*best),
                _ if patient => None,
                _ => ranked.iter().map(|(_, v)| *v).find(|v| caught_up(*v)),
            };
            pick.map(|target| {
                let req = CampaignNowRequest {
                    leader: node.id,
                    term: m.current_term,
                    last_log_id,
                };
                (target, req)
            })
        };
        if let Some(chosen) = chosen {
            break chosen;
        }
        let left = waited.saturating_sub(started.elapsed());
        if left.is_zero() {
            tracing::info!("hand-over: no voter holds the whole log; waiting for an election");
            return None;
        }
        // Metrics change with every append answered; the timer ends the patient wait.
        let _ = tokio::time::timeout(left.min(heartbeat), rx.changed()).await;
    };
    let addr = node.member_addr(target)?;
    let answer: Result<CampaignNowResponse, PeerError> = node
        .peers
        .post(target, &addr, CAMPAIGN_NOW_PATH, &req, waited)
        .await;
    match answer {
        Ok(CampaignNowResponse { started: true }) => {
            tracing::info!(target, "hand-over: the chosen voter campaigns");
            Some(target)
        }
        other => {
            tracing::info!(target, answer = ?other, "hand-over declined; waiting for an election");
            None
        }
    }
}

/// Asks every other voter for a pre-vote; true if the answers (with this node's own) make a
/// quorum of the current configurations.
async fn pre_vote(node: &Arc<Node>, timing: RaftTiming) -> bool {
    let configs = node
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .get_joint_config()
        .clone();
    let req = PreVoteRequest {
        candidate: node.id,
        last_log_id: node.raft.data_metrics().borrow().last_log,
    };
    let mut granted = HashSet::from([node.id]);
    let voters: BTreeSet<u64> = configs.iter().flatten().copied().collect();
    let mut asks = JoinSet::new();
    let timeout = Duration::from_millis(timing.election_timeout_ms);
    for voter in voters.into_iter().filter(|v| *v != node.id) {
        let Some(addr) = node.member_addr(voter) else {
            continue;
        };
        let (node, req) = (node.clone(), req.clone());
        asks.spawn(async move {
            let answer: Result<PreVoteResponse, PeerError> = node
                .peers
                .post(voter, &addr, PRE_VOTE_PATH, &req, timeout)
                .await;
            let yes = match answer {
                Ok(a) => a.granted,
                // A node of an earlier version: its real vote decides.
                Err(PeerError::Status { status: 404, .. }) => true,
                Err(e) => {
                    tracing::debug!(voter, error = %e, "no pre-vote answer");
                    false
                }
            };
            (voter, yes)
        });
    }
    // Done as soon as the grants make a quorum: a voter that does not answer (a paused old
    // leader) would hold the round up to its timeout, while another candidate may win.
    let mut won = is_quorum(&configs, &granted);
    while !won {
        let Some(done) = asks.join_next().await else {
            break;
        };
        if let Ok((voter, true)) = done {
            granted.insert(voter);
            won = is_quorum(&configs, &granted);
        }
    }
    tracing::debug!(node = node.id, ?granted, won, "pre-vote round");
    won
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn log(term: u64, index: u64) -> Option<LogId<u64>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    fn view(last_log_id: Option<LogId<u64>>) -> VoterView {
        VoterView {
            is_leader: false,
            heard_leader: false,
            holds_vote: false,
            last_log_id,
        }
    }

    fn ask(last_log_id: Option<LogId<u64>>) -> PreVoteRequest {
        PreVoteRequest {
            candidate: 3,
            last_log_id,
        }
    }

    #[test]
    fn a_voter_grants_only_when_its_real_vote_could_be_granted() {
        assert!(grants(view(log(4, 100)), &ask(log(4, 100))));
        assert!(
            grants(view(log(4, 100)), &ask(log(5, 90))),
            "a later term wins"
        );
        assert!(grants(view(None), &ask(None)));
        assert!(!grants(view(log(4, 100)), &ask(log(4, 99))), "shorter log");
        assert!(!grants(view(log(5, 1)), &ask(log(4, 100))), "older term");
        assert!(!grants(view(log(4, 1)), &ask(None)));
        let leader = VoterView {
            is_leader: true,
            ..view(None)
        };
        assert!(!grants(leader, &ask(log(4, 100))));
        let following = VoterView {
            heard_leader: true,
            ..view(None)
        };
        assert!(!grants(following, &ask(log(4, 100))));
        let holding = VoterView {
            holds_vote: true,
            ..view(None)
        };
        assert!(!grants(holding, &ask(log(4, 100))));
    }

    #[test]
    fn the_silence_before_a_leader_runs_from_the_old_terms_last_contact() {
        let contact = LeaderContact::default();
        assert_eq!(contact.silence_before_leader(false), None);
        contact.heard(1);
        let before_last_of_1 = Instant::now();
        contact.heard(1);
        std::thread::sleep(Duration::from_millis(60));
        assert!(!contact.heard_in(2));
        contact.heard(2);
        let after_first_of_2 = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        contact.heard(2);
        let silent = contact.silence_before_leader(false).expect("a gap");
        assert!(
            silent >= Duration::from_millis(60) && silent <= after_first_of_2 - before_last_of_1,
            "{silent:?}: from the last contact of term 1 to the first of term 2"
        );
        assert!(contact.heard_in(2));
        let checked = Instant::now();
        let as_leader = contact.silence_before_leader(true).expect("a last contact");
        assert!(as_leader <= checked.elapsed() + (checked - after_first_of_2));
    }

    #[test]
    fn a_quorum_is_a_majority_of_every_configuration() {
        let config = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
        let granted = |ids: &[u64]| ids.iter().copied().collect::<HashSet<u64>>();
        let three = [config(&[1, 2, 3])];
        assert!(is_quorum(&three, &granted(&[1, 3])));
        assert!(!is_quorum(&three, &granted(&[3])));
        assert!(
            !is_quorum(&three, &granted(&[3, 4, 5])),
            "outsiders do not count"
        );
        let four = [config(&[1, 2, 3, 4])];
        assert!(
            !is_quorum(&four, &granted(&[1, 2])),
            "half is not a majority"
        );
        let joint = [config(&[1, 2, 3]), config(&[3, 4, 5])];
        assert!(!is_quorum(&joint, &granted(&[1, 2, 3])));
        assert!(is_quorum(&joint, &granted(&[2, 3, 4])));
        assert!(is_quorum(&[config(&[1])], &granted(&[1])), "a single voter");
    }
}
