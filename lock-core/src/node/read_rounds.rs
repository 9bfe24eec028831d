//! Read indexes in rounds: the reads that ask while one round is out share the next one.
//!
//! A linearizable read needs a read index: on the leader, one leadership confirmation (a
//! heartbeat answered by a quorum); on a follower, one message to the leader, which confirms.
//! Asked once per read, that was a heartbeat to every follower per read: under load most of
//! the leader's replication traffic, and every release through a follower asks for one.
//!
//! There is no timer, as in the write [`batcher`](super::batcher): one round is out at a time,
//! and every read that asked before a round started gets that round's index. That keeps reads
//! linearizable: the index is taken after the read arrived, so it covers every write committed
//! before the read began.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};

use super::{Node, ProposeError};
use crate::net::PeerError;

/// Peer path of a follower's read-index request.
pub const READ_INDEX_PATH: &str = "/internal/read_index";

/// Where a read may get its index.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Only on this node, as the leader (a follower's request arriving at the leader).
    Leader,
    /// Here if this node leads, else from the leader.
    Anywhere,
}

struct Ask {
    scope: Scope,
    reply: oneshot::Sender<Result<u64, ProposeError>>,
}

/// The asking side, held by the node; the rounds run in [`run`].
#[derive(Clone)]
pub struct ReadIndexQueue {
    tx: mpsc::UnboundedSender<Ask>,
}

pub struct ReadIndexReceiver {
    rx: mpsc::UnboundedReceiver<Ask>,
}

pub fn queue() -> (ReadIndexQueue, ReadIndexReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    (ReadIndexQueue { tx }, ReadIndexReceiver { rx })
}

impl ReadIndexQueue {
    /// Joins the next round and waits, at most `timeout`, for its index. A timeout answers
    /// `NoQuorum`: no quorum confirmed a leader in time.
    pub async fn read_index(&self, scope: Scope, timeout: Duration) -> Result<u64, ProposeError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || ProposeError::Stopped("the read-index queue is closed".to_string());
        self.tx.send(Ask { scope, reply }).map_err(|_| stopped())?;
        match tokio::time::timeout(timeout, answer).await {
            Err(_) => Err(ProposeError::NoQuorum),
            Ok(answer) => answer.map_err(|_| stopped())?,
        }
    }
}

/// Takes every read queued so far, gets one index for all of them, answers, and repeats.
pub async fn run(node: Arc<Node>, mut queue: ReadIndexReceiver) {
    let mut round: Vec<Ask> = Vec::new();
    while let Some(first) = queue.rx.recv().await {
        round.push(first);
        while let Ok(ask) = queue.rx.try_recv() {
            round.push(ask);
        }
        // Reads whose callers gave up cost nothing.
        round.retain(|ask| !ask.reply.is_closed());
        if round.is_empty() {
            continue;
        }
        node.metrics.read_index_reads.observe(round.len() as f64);
        let leader = node.current_leader();
        if leader == Some(node.id) {
            let index = confirm_leadership(&node).await;
            for ask in round.drain(..) {
                let _ = ask.reply.send(index.clone());
            }
            continue;
        }
        // Not the leader: requests that must be answered here are told so at once; the rest
        // share one message to the leader.
        let (here, anywhere): (Vec<Ask>, Vec<Ask>) =
            round.drain(..).partition(|ask| ask.scope == Scope::Leader);
        for ask in here {
            let _ = ask.reply.send(Err(ProposeError::NotLeader(leader)));
        }
        if anywhere.is_empty() {
            continue;
        }
        let index = ask_leader(&node, leader).await;
        for ask in anywhere {
            let _ = ask.reply.send(index.clone());
        }
    }
}

/// On the leader: confirms leadership with a quorum; the index reads must see.
async fn confirm_leadership(node: &Node) -> Result<u64, ProposeError> {
    match tokio::time::timeout(node.write_timeout(), node.raft.ensure_linearizable()).await {
        Err(_) => Err(ProposeError::NoQuorum),
        Ok(Ok(log_id)) => Ok(log_id.map_or(0, |l| l.index)),
        Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
            Err(ProposeError::NotLeader(f.leader_id))
        }
        Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
            Err(ProposeError::NoQuorum)
        }
        Ok(Err(RaftError::Fatal(f))) => Err(ProposeError::Stopped(f.to_string())),
    }
}

/// On a follower: the leader's read index. An unknown or unreachable leader answers
/// `NotLeader`, which the reader retries after a beat.
async fn ask_leader(node: &Node, leader: Option<u64>) -> Result<u64, ProposeError> {
    let Some((leader, addr)) = leader.and_then(|l| Some((l, node.member_addr(l)?))) else {
        return Err(ProposeError::NotLeader(None));
    };
    let reply: Result<Result<u64, ProposeError>, PeerError> = node
        .peers
        .post(leader, &addr, READ_INDEX_PATH, &(), node.write_timeout())
        .await;
    reply.unwrap_or(Err(ProposeError::NotLeader(None)))
}
