//! The leader's command batching: commands that arrive while a raft write is in flight wait
//! in a queue, and the next write carries all of them as one log entry.
//!
//! There is no timer. An idle leader writes a lone command at once; under load every write
//! carries what queued up during the previous one, so batches grow with the load and the
//! per-entry costs (a log record, an fsync share, a replication message, a wake-up per
//! waiter) are paid once per batch instead of once per command. One write is in flight at a
//! time; the log store's group commit already overlaps its fsync with the replication of the
//! same entry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot};

use super::{Committed, Node, ProposeError};
use crate::machine::{Batch, Command, Response};

/// The most commands one log entry carries. It bounds an entry (and so an append message)
/// while leaving batches large enough that the queue drains in one write at any load seen.
pub const MAX_BATCH: usize = 512;

type Reply = oneshot::Sender<Result<Committed, ProposeError>>;

/// The sending side, held by the node; the receiving side runs in [`run`].
#[derive(Clone)]
pub struct BatchQueue {
    tx: mpsc::UnboundedSender<(Command, Reply)>,
}

pub struct BatchReceiver {
    rx: mpsc::UnboundedReceiver<(Command, Reply)>,
}

pub fn queue() -> (BatchQueue, BatchReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    (BatchQueue { tx }, BatchReceiver { rx })
}

impl BatchQueue {
    /// Queues `cmd` for the next write and waits for its own response.
    pub async fn submit(&self, cmd: Command) -> Result<Committed, ProposeError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((cmd, reply))
            .map_err(|_| ProposeError::Stopped("the write queue is closed".to_string()))?;
        answer
            .await
            .map_err(|_| ProposeError::Stopped("the write queue is closed".to_string()))?
    }
}

impl BatchQueue {
    /// Queues `cmds` together (so they join the same write where they fit) and waits for
    /// their responses, in order.
    pub async fn submit_all(&self, cmds: Vec<Command>) -> Vec<Result<Committed, ProposeError>> {
        let closed = || ProposeError::Stopped("the write queue is closed".to_string());
        let answers: Vec<_> = cmds
            .into_iter()
            .map(|cmd| {
                let (reply, answer) = oneshot::channel();
                self.tx.send((cmd, reply)).ok().map(|()| answer)
            })
            .collect();
        let mut out = Vec::with_capacity(answers.len());
        for answer in answers {
            out.push(match answer {
                Some(answer) => answer.await.unwrap_or_else(|_| Err(closed())),
                None => Err(closed()),
            });
        }
        out
    }
}

/// Takes whatever is queued (up to [`MAX_BATCH`]), writes it as one entry, hands each
/// command its response, and repeats.
pub async fn run(node: Arc<Node>, mut queue: BatchReceiver) {
    let mut cmds = Vec::with_capacity(MAX_BATCH);
    let mut replies: Vec<Reply> = Vec::with_capacity(MAX_BATCH);
    while let Some((cmd, reply)) = queue.rx.recv().await {
        cmds.push(cmd);
        replies.push(reply);
        while cmds.len() < MAX_BATCH {
            match queue.rx.try_recv() {
                Ok((cmd, reply)) => {
                    cmds.push(cmd);
                    replies.push(reply);
                }
                Err(_) => break,
            }
        }
        let n = cmds.len();
        let answers = write(&node, std::mem::take(&mut cmds)).await;
        node.metrics.batch_commands.observe(n as f64);
        match answers {
            Ok((responses, index)) if responses.len() == n => {
                for (reply, response) in replies.drain(..).zip(responses) {
                    let _ = reply.send(Ok(Committed { response, index }));
                }
            }
            Ok((responses, _)) => {
                let e = ProposeError::Stopped(format!(
                    "{} responses for {n} commands",
                    responses.len()
                ));
                for reply in replies.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
            }
            Err(e) => {
                for reply in replies.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// One raft write of `cmds`, stamped now: their responses and the entry's log index. Bounded
/// by the write timeout: a write that cannot reach a quorum must not hold up the queue behind
/// it (it may still commit later, which is why every command is safe to retry).
async fn write(node: &Node, cmds: Vec<Command>) -> Result<(Vec<Response>, u64), ProposeError> {
    let batch = Batch::new(node.now_ms(), node.config.policy.failover_grace_ms, cmds);
    let started = Instant::now();
    let timeout = Duration::from_millis(node.config.policy.write_timeout_ms);
    match tokio::time::timeout(timeout, node.raft.client_write(batch)).await {
        Err(_) => Err(ProposeError::NoQuorum),
        Ok(Ok(resp)) => {
            node.metrics
                .commit_seconds
                .observe(started.elapsed().as_secs_f64());
            Ok((resp.data, resp.log_id.index))
        }
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
            Err(ProposeError::NotLeader(f.leader_id))
        }
        Ok(Err(RaftError::APIError(e))) => Err(ProposeError::Stopped(e.to_string())),
        Ok(Err(RaftError::Fatal(f))) => Err(ProposeError::Stopped(f.to_string())),
    }
}
