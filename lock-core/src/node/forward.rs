//! Forwarding on a follower: commands proposed here travel to the leader together, as one
//! peer message per batch, the way the leader's [`batcher`](super::batcher) writes them
//! together as one log entry.
//!
//! There is no timer. At most [`FORWARDS_IN_FLIGHT`] messages are on their way to the leader
//! at a time; commands proposed meanwhile wait in a queue and go in the next one. An idle
//! follower sends a lone command at once; under load one message carries what queued up
//! during the previous ones. Before this, every forwarded command was its own signed HTTP
//! request, and the followers' per-request work delayed the acknowledgements every commit
//! waits for.
//!
//! Only the transport is batched: each command keeps its own answer, and a command whose
//! message fails is retried by its caller exactly like a single forward (see `propose`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::batcher::MAX_BATCH;
use super::{Committed, Node, ProposeError};
use crate::machine::{Command, Response};
use crate::net::PeerError;

/// Peer path of a batch of forwarded commands, answered with a [`ForwardReply`].
pub const FORWARD_PATH: &str = "/internal/forward";

/// The path earlier versions forward batches to, answered with the bare answers; a leader
/// still serves it for followers of those versions.
pub const PROPOSE_BATCH_PATH: &str = "/internal/propose_batch";

/// The leader's answer to a forwarded batch.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardReply {
    /// One answer per command, in order.
    pub answers: Vec<Result<Response, ProposeError>>,
    /// A log index at which the leader's state includes every command of the batch: the
    /// follower that applied it answers reads that must see the commands (a release's
    /// revocation wait) without asking the leader again.
    pub index: u64,
}

/// Batches on their way to the leader at once. Two rather than one: a batch is answered
/// only after the leader's write commits, and a second one in flight lets commands proposed
/// meanwhile reach the leader's next write instead of waiting for that answer first.
pub const FORWARDS_IN_FLIGHT: usize = 2;

/// The leader's answer to one forwarded command, or `None` if its message got no answer
/// (the caller retries, as after any transport failure).
pub type Forwarded = Option<Result<Committed, ProposeError>>;

struct Forward {
    leader: u64,
    addr: String,
    cmd: Command,
    deadline: Instant,
    reply: oneshot::Sender<Forwarded>,
}

/// The sending side, held by the node; the receiving side runs in [`run`].
#[derive(Clone)]
pub struct ForwardQueue {
    tx: mpsc::UnboundedSender<Forward>,
}

pub struct ForwardReceiver {
    rx: mpsc::UnboundedReceiver<Forward>,
}

pub fn queue() -> (ForwardQueue, ForwardReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    (ForwardQueue { tx }, ForwardReceiver { rx })
}

impl ForwardQueue {
    /// Sends `cmd` to `leader` (at `addr`) with the next batch and waits, until `deadline`,
    /// for its own answer.
    pub async fn forward(
        &self,
        leader: u64,
        addr: String,
        cmd: Command,
        deadline: Instant,
    ) -> Forwarded {
        let (reply, answer) = oneshot::channel();
        let queued = self.tx.send(Forward {
            leader,
            addr,
            cmd,
            deadline,
            reply,
        });
        if queued.is_err() {
            return None;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(remaining, answer)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
    }
}

/// Takes whatever is queued (up to [`MAX_BATCH`]) once a message may go, sends it, and
/// repeats.
pub async fn run(node: Arc<Node>, mut queue: ForwardReceiver) {
    let in_flight = Arc::new(Semaphore::new(FORWARDS_IN_FLIGHT));
    while let Some(first) = queue.rx.recv().await {
        // Waiting here for a free slot is what lets the queue fill up under load.
        let Ok(slot) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.rx.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        let node = node.clone();
        tokio::spawn(async move {
            // All for one leader, except right after a leader change.
            while let Some(leader) = batch.first().map(|f| (f.leader, f.addr.clone())) {
                let (same, rest): (Vec<_>, Vec<_>) = batch
                    .into_iter()
                    .partition(|f| (f.leader, &f.addr) == (leader.0, &leader.1));
                batch = rest;
                send(&node, leader.0, &leader.1, same).await;
            }
            drop(slot);
        });
    }
}

async fn send(node: &Node, leader: u64, addr: &str, batch: Vec<Forward>) {
    let now = Instant::now();
    // A caller past its deadline has stopped waiting; its command is not sent.
    let batch: Vec<Forward> = batch.into_iter().filter(|f| f.deadline > now).collect();
    let Some(latest) = batch.iter().map(|f| f.deadline).max() else {
        return;
    };
    let cmds: Vec<&Command> = batch.iter().map(|f| &f.cmd).collect();
    node.metrics.forward_commands.observe(cmds.len() as f64);
    let timeout = latest
        .saturating_duration_since(now)
        .max(Duration::from_millis(1));
    let mut reply: Result<ForwardReply, PeerError> = node
        .peers
        .post(leader, addr, FORWARD_PATH, &cmds, timeout)
        .await;
    if let Err(PeerError::Status { status: 404, .. }) = reply {
        // A leader of an earlier version answers without an index.
        reply = node
            .peers
            .post(leader, addr, PROPOSE_BATCH_PATH, &cmds, timeout)
            .await
            .map(|answers| ForwardReply { answers, index: 0 });
    }
    match reply {
        Ok(ForwardReply { answers, index }) if answers.len() == batch.len() => {
            for (f, answer) in batch.into_iter().zip(answers) {
                let answer = answer.map(|response| Committed { response, index });
                let _ = f.reply.send(Some(answer));
            }
        }
        Ok(ForwardReply { answers, .. }) => {
            node.metrics
                .forward_failures
                .with_label_values(&["count"])
                .inc();
            tracing::warn!(
                leader,
                sent = batch.len(),
                answered = answers.len(),
                "the leader answered a forwarded batch with the wrong number of results"
            );
        }
        Err(e) => {
            node.metrics
                .forward_failures
                .with_label_values(&[failure_reason(&e)])
                .inc();
            tracing::debug!(leader, error = %e, "forwarded batch got no answer");
        }
    }
    // Callers whose reply was not sent see `None` and retry.
}

/// The `reason` label of a forwarded message that got no usable answer.
fn failure_reason(e: &PeerError) -> &'static str {
    match e {
        PeerError::Dropped(_) => "dropped",
        PeerError::Unreachable { .. } => "unreachable",
        PeerError::Codec { .. } => "codec",
        PeerError::Status { .. } => "status",
    }
}

impl Node {
    /// Proposes `cmds` (forwarded by a follower) on this node if it is the leader, all in its
    /// next raft write where they fit, and answers each in order, with the highest log index
    /// among them. Never forwards.
    pub async fn propose_local_all(&self, cmds: Vec<Command>, timeout: Duration) -> ForwardReply {
        let n = cmds.len();
        let committed = match self.ready_to_propose() {
            Err(e) => vec![Err(e); n],
            Ok(()) => match tokio::time::timeout(timeout, self.writes.submit_all(cmds)).await {
                Ok(answers) => answers,
                Err(_) => vec![Err(ProposeError::NoQuorum); n],
            },
        };
        let index = committed
            .iter()
            .filter_map(|c| c.as_ref().ok().map(|c| c.index))
            .max()
            .unwrap_or(0);
        let answers = committed
            .into_iter()
            .map(|c| c.map(|c| c.response))
            .collect();
        ForwardReply { answers, index }
    }
}
