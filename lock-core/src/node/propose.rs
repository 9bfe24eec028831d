//! The write path: commit a command through raft, on the leader or forwarded to it.

use std::time::{Duration, Instant};

use super::{Node, ProposeError};
use crate::machine::{Command, Response};

/// A committed command's response, and the log index its state is reached at: once a node
/// has applied `index`, its state includes the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    pub response: Response,
    /// The entry that carried the command, or a later one; 0 when the leader did not say
    /// (an earlier version).
    pub index: u64,
}

impl Node {
    /// Commits `cmd` through raft wherever the leader is, and returns the state machine's
    /// response. Answers `NoQuorum` within the write timeout rather than hanging.
    ///
    /// Retrying a command is safe: acquires are deduplicated by request id, renew, release
    /// and cancel are idempotent in effect, and ticks only act on what is due.
    pub async fn propose(&self, cmd: Command) -> Result<Response, ProposeError> {
        self.propose_committed(cmd).await.map(|c| c.response)
    }

    /// [`propose`](Self::propose), with the log index to wait for before this node's own
    /// state shows the command.
    pub async fn propose_committed(&self, cmd: Command) -> Result<Committed, ProposeError> {
        let admit = match &cmd {
            Command::Admit {
                resource,
                fencing_token,
                ..
            } => Some((resource.clone(), *fencing_token)),
            _ => None,
        };
        let result = self.propose_anywhere(cmd).await;
        // Fencing decisions are counted where the proxy asked, for the hot-resources view.
        if let (
            Some((resource, token)),
            Ok(Committed {
                response: Response::Admit(outcome),
                ..
            }),
        ) = (admit, &result)
        {
            self.record_fence_decision(&resource, token, outcome);
        }
        result
    }

    async fn propose_anywhere(&self, cmd: Command) -> Result<Committed, ProposeError> {
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
                    // With whatever else this node forwards meanwhile (see `forward`).
                    let answer = self
                        .forwards
                        .forward(leader, addr, cmd.clone(), deadline)
                        .await;
                    match answer {
                        Some(Ok(committed)) => return Ok(committed),
                        Some(Err(ProposeError::NotLeader(_))) | None => {}
                        Some(Err(e)) => return Err(e),
                    }
                }
            }
            // No usable leader yet (election in progress, or it is unreachable): wait a beat.
            tokio::time::sleep(Duration::from_millis(50).min(remaining)).await;
        }
    }

    /// Proposes on this node if it is the leader; never forwards. The command joins the
    /// leader's next raft write (see `batcher`) and gets its own response.
    pub async fn propose_local(
        &self,
        cmd: Command,
        timeout: Duration,
    ) -> Result<Committed, ProposeError> {
        self.ready_to_propose()?;
        match tokio::time::timeout(timeout, self.writes.submit(cmd)).await {
            Err(_) => Err(ProposeError::NoQuorum),
            Ok(answer) => answer,
        }
    }

    /// Whether this node takes proposals: it must be the leader, and not draining.
    pub(super) fn ready_to_propose(&self) -> Result<(), ProposeError> {
        let leader = self.current_leader();
        if leader != Some(self.id) {
            return Err(ProposeError::NotLeader(leader));
        }
        // A draining leader proposes nothing (its followers' leader lease then runs out and
        // another voter can win an election); callers retry and find the next leader.
        if self.ops.draining.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ProposeError::NotLeader(None));
        }
        Ok(())
    }
}
