//! A node that starts with an empty data directory holds back its vote until it has caught up
//! with a leader.
//!
//! Raft counts a vote only from a node that still has every entry it acknowledged. A member
//! whose data directory was lost (a replaced disk, a wiped volume) and that starts again under
//! its id has forgotten entries it helped commit; voting at once, it could elect a node that
//! lacks them, and acknowledged lock grants would vanish; campaigning on a partial log, it
//! could be elected by such a node just the same. So a node that finds its storage empty at
//! start writes a marker file (`catching-up`) and, while it is there, refuses every vote
//! request except the founding member's first campaign of a brand-new cluster, and does not
//! campaign (the founding member only once a leader has reached it). It drops
//! the marker once its log reaches an index that a leader had committed in that leader's own
//! term: by the leader's completeness, every entry committed before the data was lost is at or
//! below such an index. A node elected leader itself drops it too (a majority found its log
//! complete). The marker survives restarts, so a node restarted halfway through catching up
//! goes on holding its vote.
//!
//! The cost is availability in a double fault: while a rejoining node catches up, a cluster of
//! three that also loses another member cannot elect a leader until that member returns —
//! the same answer etcd gives, which refuses such a member outright.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::LogId;
use prometheus::IntGauge;

use crate::raft::TypeConfig;

const MARKER: &str = "catching-up";

pub struct VoteHold {
    marker: PathBuf,
    /// Whether the vote is held; read on every append, so kept apart from `target`.
    held: AtomicBool,
    /// The index the log must reach: the first commit index heard from a leader of its own
    /// term.
    target: Mutex<Option<u64>>,
    gauge: IntGauge,
}

impl VoteHold {
    /// Holds the vote if the node's storage is `empty` (writing the marker, synced, before
    /// returning) or if an earlier start left the marker in `data_dir`.
    pub fn open(data_dir: &Path, empty: bool, gauge: IntGauge) -> io::Result<VoteHold> {
        let marker = data_dir.join(MARKER);
        let held = marker.exists();
        if empty && !held {
            File::create(&marker)?.sync_all()?;
            File::open(data_dir)?.sync_all()?;
        }
        let held = held || empty;
        if held {
            // Every member of a brand-new cluster says so once; anywhere else it marks a
            // member that lost its data.
            tracing::info!(
                "this node started with an empty data directory: it votes in no election until \
                 it has caught up with a leader"
            );
        }
        gauge.set(i64::from(held));
        Ok(VoteHold {
            marker,
            held: AtomicBool::new(held),
            target: Mutex::new(None),
            gauge,
        })
    }

    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Whether to refuse `req` without passing it to raft. The one vote a held node gives is
    /// to `founder` (the lowest founding member) campaigning with nothing but the cluster's
    /// first entry: the election that starts a brand-new cluster, whose members all start
    /// empty.
    pub fn refuses(&self, req: &VoteRequest<u64>, founder: u64) -> bool {
        self.refuses_candidate(req.vote.leader_id.node_id, req.last_log_id, founder)
    }

    /// The same for `candidate` campaigning with `last_log_id`: for a vote or a pre-vote.
    pub fn refuses_candidate(
        &self,
        candidate: u64,
        last_log_id: Option<LogId<u64>>,
        founder: u64,
    ) -> bool {
        if !self.is_held() {
            return false;
        }
        let first_campaign = candidate == founder && last_log_id.is_none_or(|l| l.index == 0);
        !first_campaign
    }

    /// Takes note of an append from a leader: its commit index becomes the target when the
    /// leader committed it in its own term.
    pub fn heard(&self, req: &AppendEntriesRequest<TypeConfig>) {
        let Some(commit) = req.leader_commit else {
            return;
        };
        if commit.leader_id.term != req.vote.leader_id.term {
            return;
        }
        let mut target = self.target.lock().unwrap_or_else(|e| e.into_inner());
        if target.is_none() {
            *target = Some(commit.index);
        }
    }

    /// Releases the vote once the log's last index (`last_log`) reached the target.
    pub fn caught_up(&self, last_log: Option<u64>) {
        let target = *self.target.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(target), Some(last)) = (target, last_log) {
            if last >= target {
                self.release("caught up with the leader");
            }
        }
    }

    /// Releases the vote: the node caught up, or was itself elected leader.
    pub fn release(&self, why: &str) {
        if !self.held.swap(false, Ordering::AcqRel) {
            return;
        }
        // Losing the removal only means holding the vote once more after a restart.
        if let Err(e) = fs::remove_file(&self.marker) {
            tracing::warn!(error = %e, "could not remove the catching-up marker");
        }
        self.gauge.set(0);
        tracing::info!("this node votes again: {why}");
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Vote};

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn append(term: u64, commit: Option<LogId<u64>>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(term, 1),
            prev_log_id: None,
            leader_commit: commit,
            entries: Vec::new(),
        }
    }

    fn vote(candidate: u64, last: Option<LogId<u64>>) -> VoteRequest<u64> {
        VoteRequest {
            vote: Vote::new(5, candidate),
            last_log_id: last,
        }
    }

    #[test]
    fn an_empty_start_holds_until_the_log_reaches_a_commit_of_the_leaders_own_term() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hold = VoteHold::open(dir.path(), true, IntGauge::new("g", "g").unwrap()).unwrap();
        assert!(hold.is_held() && dir.path().join(MARKER).exists());
        assert!(hold.refuses(&vote(2, Some(log_id(4, 900))), 1));

        // A commit index from an earlier term does not cover what the old leader committed.
        hold.heard(&append(5, Some(log_id(4, 1_000))));
        hold.caught_up(Some(2_000));
        assert!(hold.is_held(), "no target from a commit of another term");

        hold.heard(&append(5, Some(log_id(5, 1_200))));
        hold.heard(&append(5, Some(log_id(5, 1_500))));
        hold.caught_up(Some(1_199));
        assert!(hold.is_held());
        hold.caught_up(Some(1_200));
        assert!(!hold.is_held(), "the first target counts");
        assert!(!dir.path().join(MARKER).exists());
        assert!(!hold.refuses(&vote(2, Some(log_id(4, 900))), 1));
    }

    #[test]
    fn the_marker_outlives_a_restart_and_a_node_with_data_never_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gauge = || IntGauge::new("g", "g").unwrap();
        drop(VoteHold::open(dir.path(), true, gauge()).unwrap());
        let again = VoteHold::open(dir.path(), false, gauge()).unwrap();
        assert!(again.is_held(), "restarted halfway: still held");
        again.release("elected");
        let later = VoteHold::open(dir.path(), false, gauge()).unwrap();
        assert!(!later.is_held());
    }

    #[test]
    fn only_the_founders_first_campaign_gets_a_held_vote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hold = VoteHold::open(dir.path(), true, IntGauge::new("g", "g").unwrap()).unwrap();
        assert!(!hold.refuses(&vote(1, Some(log_id(0, 0))), 1));
        assert!(!hold.refuses(&vote(1, None), 1));
        assert!(hold.refuses(&vote(1, Some(log_id(3, 1))), 1));
        assert!(hold.refuses(&vote(3, Some(log_id(0, 0))), 1));
    }
}
