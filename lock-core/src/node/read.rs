//! The linearizable read path: a read index from the leader, then wait to apply it.

use std::time::{Duration, Instant};

use openraft::error::RaftError;

use super::{Node, ProposeError};
use crate::net::PeerError;

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
}
