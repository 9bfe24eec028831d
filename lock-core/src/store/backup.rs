//! Backups of the replicated state, and the data directory of a new cluster made from one.
//!
//! A backup is a snapshot file exactly as a leader sends one to a lagging follower: the lock
//! machine (leases, tokens, dedup records, quotas, API keys) and the proxy's idempotency records,
//! self-contained and checked when read (see `snapshot_file.rs`).
//!
//! A restore cannot know what the lost cluster did after the backup was taken. It starts the
//! new cluster past anything that cluster could have reached:
//!
//! - every lease ends and every token up to a floor [`TOKEN_GAP`] above the backup's last one
//!   is stale (see `LockMachine::restored_after_loss`): no token is issued twice, and a token
//!   the lost cluster superseded after the backup is never admitted again;
//! - the **raft term** moves by [`TERM_JUMP`] and the **log index** by [`INDEX_JUMP`]: a member
//!   that still holds the lost cluster's log is then behind the restored members in both, can
//!   win no election, and is brought to the restored state by a snapshot, like any lagging
//!   follower, instead of mixing the two histories.
//!
//! The restored state and its log id depend only on the backup and the member list, so every
//! member restored from one file with one member list starts with the same state at the same
//! log id. A member given another list gets another log id (the list's digest is part of the
//! index), never another state under the same id.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership, Vote};

use super::snapshot_file::Meta;
use super::state_machine::read_backup;
use super::StoreError;
use crate::raft::NodeInfo;

/// How far past the backup's raft term a restored cluster starts.
pub const TERM_JUMP: u64 = 1 << 20;

/// How far past the backup's log index a restored cluster starts (about 35 years of log at a
/// thousand entries a second).
pub const INDEX_JUMP: u64 = 1 << 40;

/// How far past the backup's last token a restored cluster's tokens start: a trillion tokens,
/// 15 years of acquisitions at 2,000 a second. Fixed, so that no two members restored from one
/// backup can start with different counters.
pub const TOKEN_GAP: u64 = 1_000_000_000_000;

/// The part of the index that tells member lists apart (see [`list_digest`]).
const LIST_DIGEST_BITS: u32 = 24;

/// The largest token a restore will set: 2^53 - 1, the largest integer a JSON number keeps
/// exactly in every client (JavaScript's included).
pub const MAX_TOKEN: u64 = (1 << 53) - 1;

/// What a backup file holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BackupSummary {
    /// The raft term and log index of the last entry the backup covers.
    pub term: u64,
    pub index: u64,
    /// The members of the cluster it was taken from.
    pub members: Vec<u64>,
    pub resources: u64,
    pub active_locks: u64,
    pub waiters: u64,
    pub dedup_records: u64,
    pub idempotency_records: u64,
    /// The highest fencing token issued when it was taken.
    pub last_token: u64,
    /// Log time when it was taken (ms since the Unix epoch, as the cluster counted it).
    pub log_time_ms: u64,
    pub bytes: u64,
}

/// Reads the whole backup at `path` and checks it: its state decodes, its idempotency records
/// decode and end where they should.
pub fn inspect(path: &Path) -> Result<BackupSummary, StoreError> {
    let mut backup = read_backup(path)?;
    let mut records = 0u64;
    if let Some((_, entries)) = backup.reader.records() {
        for entry in entries {
            entry?;
            records += 1;
        }
    }
    summary(path, &backup.meta, &backup.machine.stats(), records)
}

fn summary(
    path: &Path,
    meta: &Meta,
    stats: &crate::wire::LockStats,
    idempotency_records: u64,
) -> Result<BackupSummary, StoreError> {
    let bytes = std::fs::metadata(path)
        .map_err(|source| StoreError::SnapshotFile {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    let last = meta.last_log_id.unwrap_or_default();
    Ok(BackupSummary {
        term: last.leader_id.term,
        index: last.index,
        members: meta.last_membership.membership().voter_ids().collect(),
        resources: stats.resources,
        active_locks: stats.active_locks,
        waiters: stats.waiters,
        dedup_records: stats.dedup_records,
        idempotency_records,
        last_token: stats.last_token,
        log_time_ms: stats.now_ms,
        bytes,
    })
}

/// How to make one member's data directory from a backup.
#[derive(Clone, Debug)]
pub struct RestorePlan {
    /// The member whose directory this is.
    pub node_id: u64,
    /// Every voter of the restored cluster and its addresses; every member must be given the
    /// same list.
    pub members: BTreeMap<u64, NodeInfo>,
}

/// What a restore made.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RestoreSummary {
    pub backup: BackupSummary,
    /// The restored cluster's first term and log index.
    pub term: u64,
    pub index: u64,
    /// Every token the restored cluster issues is above this.
    pub token_floor: u64,
}

/// Writes the state of the backup at `backup` into `data_dir` (which must hold no storage) as
/// the state of a new cluster of `plan.members`: the backup's snapshot, moved past the lost
/// cluster's tokens, terms and log as the module documentation says, installed as a follower
/// installs one from its leader, then the log purged up to it and a vote saved in its term.
pub async fn restore(
    backup: &Path,
    data_dir: &Path,
    plan: &RestorePlan,
) -> Result<RestoreSummary, StoreError> {
    let refused = |detail: String| StoreError::Corrupt {
        what: "backup",
        detail,
    };
    if !plan.members.contains_key(&plan.node_id) {
        return Err(refused(format!(
            "node {} is not among the restored cluster's members",
            plan.node_id
        )));
    }
    let mut image = read_backup(backup)?;
    let Some(old) = image.meta.last_log_id else {
        return Err(refused("it covers no log entry".into()));
    };
    let stats = image.machine.stats();
    let token_floor = stats
        .last_token
        .checked_add(TOKEN_GAP)
        .filter(|floor| *floor <= MAX_TOKEN)
        .ok_or_else(|| {
            refused(format!(
                "its last token {} is within {TOKEN_GAP} of {MAX_TOKEN}, the largest token JSON \
                 clients read exactly",
                stats.last_token
            ))
        })?;
    let (Some(term), Some(index)) = (
        old.leader_id.term.checked_add(TERM_JUMP),
        old.index
            .checked_add(INDEX_JUMP)
            .and_then(|i| i.checked_add(list_digest(&plan.members))),
    ) else {
        return Err(refused(
            "its term or index is too large to restore from".into(),
        ));
    };
    let machine = image.machine.restored_after_loss(token_floor);
    let log_id = LogId::new(CommittedLeaderId::new(term, old.leader_id.node_id), index);
    let voters: BTreeSet<u64> = plan.members.keys().copied().collect();
    let membership = Membership::new(vec![voters], plan.members.clone());
    let meta = Meta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        snapshot_id: format!("restored-{term}-{index}"),
    };

    let (mut log, mut sm) = super::open(data_dir, Arc::new(|_, _| {}))?;
    let raft_err = |what: &str, e: openraft::StorageError<u64>| {
        StoreError::Task(format!("{what} in the restored directory: {e}"))
    };
    let (applied, _) = sm
        .applied_state()
        .await
        .map_err(|e| raft_err("read the state", e))?;
    let state = log
        .get_log_state()
        .await
        .map_err(|e| raft_err("read the log", e))?;
    if applied.is_some() || state.last_log_id.is_some() {
        return Err(refused(format!(
            "{} already holds a node's storage",
            data_dir.display()
        )));
    }
    let mut records_read = 0u64;
    let mut counted;
    let records = match image.reader.records() {
        Some((_, entries)) => {
            counted = entries.inspect(|_| records_read += 1);
            Some(&mut counted as &mut dyn Iterator<Item = _>)
        }
        None => None,
    };
    sm.install_restored(&meta, &machine, records).await?;
    // Every record was read back from the backup, so the count is the records it carried.
    let idempotency_records = records_read;
    log.purge(log_id)
        .await
        .map_err(|e| raft_err("purge the log", e))?;
    log.save_committed(Some(log_id))
        .await
        .map_err(|e| raft_err("save the committed id", e))?;
    log.save_vote(&Vote::new(term, plan.node_id))
        .await
        .map_err(|e| raft_err("save the vote", e))?;
    let backup = summary(backup, &image.meta, &stats, idempotency_records)?;
    Ok(RestoreSummary {
        backup,
        term,
        index,
        token_floor,
    })
}

/// A number below 2^24 that differs, but for a chance of one in 16 million, between two member
/// lists (ids and addresses).
fn list_digest(members: &BTreeMap<u64, NodeInfo>) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (id, info) in members {
        for part in [
            &id.to_be_bytes()[..],
            info.api_addr.as_bytes(),
            info.peer_addr.as_bytes(),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) >> (64 - LIST_DIGEST_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(peer_of_3: &str) -> BTreeMap<u64, NodeInfo> {
        (1..=3)
            .map(|id| {
                let peer = if id == 3 {
                    peer_of_3.to_string()
                } else {
                    format!("10.0.{id}.10:7101")
                };
                let info = NodeInfo {
                    api_addr: format!("10.0.{id}.10:7001"),
                    peer_addr: peer,
                };
                (id, info)
            })
            .collect()
    }

    #[test]
    fn one_member_list_one_digest_and_another_list_another() {
        let list = members("10.0.3.10:7101");
        assert_eq!(list_digest(&list), list_digest(&list.clone()));
        assert!(list_digest(&list) < 1 << LIST_DIGEST_BITS);
        assert_ne!(list_digest(&list), list_digest(&members("10.0.3.11:7101")));
        let mut fewer = list.clone();
        fewer.remove(&3);
        assert_ne!(list_digest(&list), list_digest(&fewer));
    }
}
