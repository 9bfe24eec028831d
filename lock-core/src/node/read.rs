//! The linearizable read path: a read index from the leader, then wait to apply it.

use std::time::{Duration, Instant};

use super::read_rounds::Scope;
use super::{Node, ProposeError};

/// Why a read barrier failed.
#[derive(Debug)]
pub enum ReadFailure {
    /// No read index: no leader, or none that a quorum confirmed in time.
    Index(ProposeError),
    /// The leader gave a read index, but this node did not apply the log up to it in time.
    NotApplied { applied: u64, needed: u64 },
}

impl Node {
    /// Waits until this node's state machine reflects every write committed before the call
    /// (a read index obtained from the leader, which confirms its leadership with a quorum).
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        self.read_barrier_or_why().await.map_err(|e| match e {
            ReadFailure::Index(e) => e,
            ReadFailure::NotApplied { .. } => ProposeError::NoQuorum,
        })
    }

    /// [`Self::read_barrier`], saying which of its two steps failed.
    pub async fn read_barrier_or_why(&self) -> Result<(), ReadFailure> {
        let deadline = Instant::now() + self.write_timeout();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ReadFailure::Index(ProposeError::NoQuorum));
            }
            match self.reads.read_index(Scope::Anywhere, remaining).await {
                Ok(index) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    return self.wait_applied(index, remaining).await.map_err(|_| {
                        ReadFailure::NotApplied {
                            applied: self.machine.last_applied_index(),
                            needed: index,
                        }
                    });
                }
                // No usable leader yet (election in progress, or it is unreachable).
                Err(ProposeError::NotLeader(_)) => {}
                Err(e) => return Err(ReadFailure::Index(e)),
            }
            tokio::time::sleep(Duration::from_millis(50).min(remaining)).await;
        }
    }

    /// On the leader: confirms leadership with a quorum and returns the index reads must see.
    /// A follower answers `NotLeader`.
    pub async fn local_read_index(&self, timeout: Duration) -> Result<u64, ProposeError> {
        self.reads.read_index(Scope::Leader, timeout).await
    }

    /// Waits, at most `timeout`, until this node has applied log index `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), ProposeError> {
        if self.machine.last_applied_index() >= index {
            return Ok(());
        }
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "read barrier")
            .await
            .map(|_| ())
            .map_err(|_| ProposeError::NoQuorum)
    }
}
