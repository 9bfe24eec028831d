//! The leader's command batching: commands that arrive while a raft write is in flight wait
//! in a queue, and the next write carries all of them as one log entry.
//!
//! There is no timer. An idle leader writes a lone command at once; under load every write
//! carries what queued up during the previous one, so batches grow with the load and the
//! per-entry costs (a log record, an fsync share, a replication message, a wake-up per
//! waiter) are paid once per batch instead of once per command. One write is in flight at a
//! time: openraft 0.9 sends a follower one append at a time and sends an entry only once the
//! leader's own copy is synced, so a second write would wait for the first's round trip anyway
//! and only make entries smaller (measured slower).
//!
//! A command whose caller stopped waiting (its deadline passed, its connection closed) is
//! dropped before it is written. With `max_queued_writes` set, the queue is bounded: past that
//! many commands waiting, a new one is refused at once with [`ProposeError::Overloaded`]
//! instead of waiting behind seconds of work.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use prometheus::{IntCounter, IntGauge};
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
    load: Arc<Load>,
    max_queued: usize,
}

pub struct BatchReceiver {
    rx: mpsc::UnboundedReceiver<(Command, Reply)>,
    load: Arc<Load>,
}

/// What both sides of the queue see of its load.
struct Load {
    /// Commands sent and not yet taken into a write.
    queued: AtomicUsize,
    /// How long the last raft write took, in µs: what a refused caller is told to wait is
    /// the writes the queue ahead of it makes.
    last_write_us: AtomicU64,
    /// Whether a raft write is under way (see [`BatchQueue::writing`]).
    writing: AtomicBool,
    /// The log index of the last write that committed.
    last_written: AtomicU64,
    /// The queue's length and refusals, as the node's metrics show them.
    gauge: IntGauge,
    refused: IntCounter,
}

/// A queue that refuses commands once `max_queued` (at least 1) are waiting, or never without
/// a bound; `gauge` shows its length and `refused` counts the commands it refused.
pub fn queue(
    max_queued: Option<usize>,
    gauge: IntGauge,
    refused: IntCounter,
) -> (BatchQueue, BatchReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let load = Arc::new(Load {
        queued: AtomicUsize::new(0),
        last_write_us: AtomicU64::new(0),
        writing: AtomicBool::new(false),
        last_written: AtomicU64::new(0),
        gauge,
        refused,
    });
    let sender = BatchQueue {
        tx,
        load: load.clone(),
        max_queued: max_queued.map_or(usize::MAX, |m| m.max(1)),
    };
    (sender, BatchReceiver { rx, load })
}

fn closed() -> ProposeError {
    ProposeError::Stopped("the write queue is closed".to_string())
}

impl BatchQueue {
    /// Whether a raft write is under way. While the leader drains, none starts: once this
    /// reads false after the drain began, the leader's log no longer grows, and a follower
    /// that holds it all can win the vote of the leader.
    pub fn writing(&self) -> bool {
        self.load.writing.load(Ordering::SeqCst)
    }

    /// The log index of the last write that committed (0: none yet).
    pub fn last_written(&self) -> u64 {
        self.load.last_written.load(Ordering::SeqCst)
    }

    /// Queues `cmd` for the next write and waits for its own response.
    pub async fn submit(&self, cmd: Command) -> Result<Committed, ProposeError> {
        self.enqueue(cmd)?.await.map_err(|_| closed())?
    }

    /// Queues `cmds` together (so they join the same write where they fit) and waits for
    /// their responses, in order. Each is admitted or refused on its own.
    pub async fn submit_all(&self, cmds: Vec<Command>) -> Vec<Result<Committed, ProposeError>> {
        let answers: Vec<_> = cmds.into_iter().map(|cmd| self.enqueue(cmd)).collect();
        let mut out = Vec::with_capacity(answers.len());
        for answer in answers {
            out.push(match answer {
                Ok(answer) => answer.await.unwrap_or_else(|_| Err(closed())),
                Err(e) => Err(e),
            });
        }
        out
    }

    /// Puts `cmd` in the queue, or refuses it if the queue is full.
    fn enqueue(
        &self,
        cmd: Command,
    ) -> Result<oneshot::Receiver<Result<Committed, ProposeError>>, ProposeError> {
        // Admission and count in one step, so concurrent callers cannot overshoot the bound.
        let admitted = self
            .load
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_queued).then_some(n + 1)
            });
        if let Err(queued) = admitted {
            self.load.refused.inc();
            return Err(ProposeError::Overloaded {
                queued,
                retry_after_ms: self.drain_ms(queued),
            });
        }
        self.load.gauge.inc();
        let (reply, answer) = oneshot::channel();
        if self.tx.send((cmd, reply)).is_err() {
            self.load.queued.fetch_sub(1, Ordering::AcqRel);
            self.load.gauge.dec();
            return Err(closed());
        }
        Ok(answer)
    }

    /// About how long the writes that drain `queued` commands take, at the last write's pace
    /// (at least 1 ms).
    fn drain_ms(&self, queued: usize) -> u64 {
        let writes = queued.div_ceil(MAX_BATCH) as u64;
        let write_us = self.load.last_write_us.load(Ordering::Relaxed);
        (writes * write_us / 1_000).max(1)
    }
}

impl BatchReceiver {
    /// Waits for the next command, then takes it and whatever else is queued, up to
    /// [`MAX_BATCH`] commands whose callers still wait; commands whose caller has gone (its
    /// deadline passed, its connection closed) are dropped unwritten. `false` once the queue
    /// is closed and empty.
    async fn take(&mut self, cmds: &mut Vec<Command>, replies: &mut Vec<Reply>) -> bool {
        let Some(first) = self.rx.recv().await else {
            return false;
        };
        let mut next = Some(first);
        while let Some((cmd, reply)) = next.take() {
            self.load.queued.fetch_sub(1, Ordering::AcqRel);
            self.load.gauge.dec();
            if !reply.is_closed() {
                cmds.push(cmd);
                replies.push(reply);
            }
            if cmds.len() < MAX_BATCH {
                next = self.rx.try_recv().ok();
            }
        }
        true
    }
}

/// Takes whatever is queued (up to [`MAX_BATCH`]), writes it as one entry, hands each
/// command its response, and repeats.
pub async fn run(node: Arc<Node>, mut queue: BatchReceiver) {
    let mut cmds = Vec::with_capacity(MAX_BATCH);
    let mut replies: Vec<Reply> = Vec::with_capacity(MAX_BATCH);
    while queue.take(&mut cmds, &mut replies).await {
        if cmds.is_empty() {
            continue;
        }
        let n = cmds.len();
        let started = Instant::now();
        let answers = write(&node, &queue.load, std::mem::take(&mut cmds)).await;
        queue
            .load
            .last_write_us
            .store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
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
async fn write(
    node: &Node,
    load: &Load,
    cmds: Vec<Command>,
) -> Result<(Vec<Response>, u64), ProposeError> {
    // Marked before the drain is checked, and the drain is set before the mark is read (both
    // sequentially consistent): either this write sees the drain, or the drain waits for it.
    load.writing.store(true, Ordering::SeqCst);
    let written = if node.ops.draining.load(Ordering::SeqCst) {
        Err(ProposeError::NotLeader(None))
    } else {
        write_batch(node, cmds).await
    };
    if let Ok((_, index)) = &written {
        load.last_written.fetch_max(*index, Ordering::SeqCst);
    }
    load.writing.store(false, Ordering::SeqCst);
    written
}

async fn write_batch(
    node: &Node,
    cmds: Vec<Command>,
) -> Result<(Vec<Response>, u64), ProposeError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tick() -> Command {
        Command::Tick { max_items: 1 }
    }

    fn test_queue(max: usize) -> (BatchQueue, BatchReceiver, IntGauge, IntCounter) {
        let gauge = IntGauge::new("q", "q").unwrap();
        let refused = IntCounter::new("r", "r").unwrap();
        let (tx, rx) = queue(Some(max), gauge.clone(), refused.clone());
        (tx, rx, gauge, refused)
    }

    async fn take(rx: &mut BatchReceiver) -> (Vec<Command>, Vec<Reply>) {
        let (mut cmds, mut replies) = (Vec::new(), Vec::new());
        assert!(rx.take(&mut cmds, &mut replies).await);
        (cmds, replies)
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_admits_again_once_a_write_takes_its_commands() {
        let (tx, mut rx, gauge, refused) = test_queue(2);
        let a = tx.enqueue(tick()).expect("first fits");
        let b = tx.enqueue(tick()).expect("second fits");
        match tx.enqueue(tick()) {
            Err(ProposeError::Overloaded {
                queued,
                retry_after_ms,
            }) => {
                assert_eq!(queued, 2);
                assert!(retry_after_ms >= 1);
            }
            other => panic!("expected Overloaded, got {:?}", other.map(|_| ())),
        }
        assert_eq!((gauge.get(), refused.get()), (2, 1));

        let (cmds, _replies) = take(&mut rx).await;
        assert_eq!(cmds.len(), 2);
        assert_eq!(gauge.get(), 0);
        drop((a, b));
        assert!(
            tx.enqueue(tick()).is_ok(),
            "room again once a write took them"
        );
        assert_eq!(refused.get(), 1);
    }

    #[tokio::test]
    async fn without_a_bound_nothing_is_refused() {
        let refused = IntCounter::new("r", "r").unwrap();
        let (tx, _rx) = queue(None, IntGauge::new("q", "q").unwrap(), refused.clone());
        let waiting: Vec<_> = (0..10 * MAX_BATCH)
            .map(|_| tx.enqueue(tick()).expect("admitted"))
            .collect();
        assert_eq!((waiting.len(), refused.get()), (10 * MAX_BATCH, 0));
    }

    #[tokio::test]
    async fn the_wait_offered_to_a_refused_caller_follows_the_last_writes_pace() {
        let (tx, rx, _, _) = test_queue(MAX_BATCH * 2);
        rx.load.last_write_us.store(30_000, Ordering::Relaxed);
        // Two writes' worth queued ahead: two writes of 30 ms.
        assert_eq!(tx.drain_ms(MAX_BATCH * 2), 60);
        assert_eq!(tx.drain_ms(1), 30);
        rx.load.last_write_us.store(0, Ordering::Relaxed);
        assert_eq!(tx.drain_ms(1), 1, "never told to retry at once");
    }

    #[tokio::test]
    async fn commands_whose_callers_stopped_waiting_are_not_written() {
        let (tx, mut rx, gauge, _) = test_queue(16);
        let gone = tx.enqueue(tick()).unwrap();
        let kept = tx.enqueue(tick()).unwrap();
        drop(gone);
        let (cmds, replies) = take(&mut rx).await;
        assert_eq!(cmds.len(), 1, "only the command someone waits for");
        assert_eq!(gauge.get(), 0, "the dropped one left the count too");
        let committed = Committed {
            response: Response::Ticked {
                expired: 0,
                handed_off: 0,
            },
            index: 7,
        };
        replies
            .into_iter()
            .next()
            .unwrap()
            .send(Ok(committed.clone()))
            .unwrap();
        assert_eq!(kept.await.unwrap(), Ok(committed));
    }

    #[tokio::test]
    async fn one_write_takes_at_most_a_full_batch() {
        let (tx, mut rx, gauge, _) = test_queue(MAX_BATCH * 2);
        let waiting: Vec<_> = (0..MAX_BATCH + 3)
            .map(|_| tx.enqueue(tick()).unwrap())
            .collect();
        let (first, _r1) = take(&mut rx).await;
        assert_eq!(first.len(), MAX_BATCH);
        assert_eq!(gauge.get(), 3);
        let (second, _r2) = take(&mut rx).await;
        assert_eq!(second.len(), 3);
        drop(waiting);
    }

    #[tokio::test]
    async fn forwarded_commands_are_admitted_one_by_one() {
        let (tx, mut rx, _, refused) = test_queue(2);
        let all = tokio::spawn({
            let tx = tx.clone();
            async move { tx.submit_all(vec![tick(), tick(), tick()]).await }
        });
        let (cmds, replies) = take(&mut rx).await;
        assert_eq!(cmds.len(), 2);
        for reply in replies {
            let _ = reply.send(Err(ProposeError::NoQuorum));
        }
        let answers = all.await.unwrap();
        assert_eq!(
            answers[..2],
            [Err(ProposeError::NoQuorum), Err(ProposeError::NoQuorum)]
        );
        assert!(matches!(
            answers[2],
            Err(ProposeError::Overloaded { queued: 2, .. })
        ));
        assert_eq!(refused.get(), 1);
    }
}
