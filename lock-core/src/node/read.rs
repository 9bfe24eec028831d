//! The linearizable read path: a read index from the leader, then wait to apply it.

use std::time::{Duration, Instant};

use super::read_rounds::Scope;
use super::{Node, ProposeError};

impl Node {
    /// Waits until this node's state machine reflects every write committed before the call
    /// (a read index obtained from the leader, which confirms its leadership with a quorum).
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        let deadline = Instant::now() + self.write_timeout();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ProposeError::NoQuorum);
            }
            match self.reads.read_index(Scope::Anywhere, remaining).await {
                Ok(index) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    return self.wait_applied(index, remaining).await;
                }
                // No usable leader yet (election in progress, or it is unreachable).
                Err(ProposeError::NotLeader(_)) => {}
                Err(e) => return Err(e),
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
