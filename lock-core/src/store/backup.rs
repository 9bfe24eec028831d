//! Backups of the replicated state, and the data directories of a new cluster made from one.
//!
//! A backup is a snapshot file exactly as a leader sends one to a lagging follower: the lock
//! machine (leases, tokens, dedup records, quotas, API keys) and the proxy's idempotency records,
//! self-contained and checked when read (see `snapshot_file.rs`).
//!
//! A restore has two steps. [`prepare`] runs once: it turns the backup into the snapshot of the
//! new cluster, in a file of the same format. [`restore`] then installs that one file on every
//! member. All members thus start from the same bytes at the same log position, whatever
//! differs between their machines or their configs (a member whose `initial_members` differ from
//! the prepared ones is refused).
//!
//! The lost cluster may have done anything after the backup was taken, and a cluster restored
//! before may still run somewhere. So the prepared state starts past all of it:
//!
//! - every lease ends and every token up to a floor is stale (see
//!   `LockMachine::restored_after_loss`): no token is issued twice, and a token superseded after
//!   the backup is never admitted again. The floor is [`TOKEN_GAP`] above the backup's last
//!   token plus the microseconds since the backup was taken, and at least the wall clock in
//!   microseconds, so a later preparation (of this backup again, or of an older one) starts
//!   above an earlier one;
//! - the **raft term** and the **log index** start past the backup's by [`TERM_JUMP`] and
//!   [`INDEX_JUMP`] plus the milliseconds and microseconds since the backup, and at least at
//!   the wall clock in milliseconds and microseconds: a member
//!   that still holds the lost cluster's log (or an earlier restored cluster's) is behind the
//!   restored members in both, can win no election, and is brought to the restored state by a
//!   snapshot, like any lagging follower, instead of mixing two histories.
//!
//! Both orders hold only if the preparing machine's clock is right: [`prepare`] refuses a clock
//! more than [`CLOCK_BEHIND_TOLERANCE_MS`] behind the backup's log time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership, Vote};

use super::snapshot_file::Meta;
use super::state_machine::{read_backup, write_prepared};
use super::StoreError;
use crate::raft::NodeInfo;

/// How far past the backup's raft term a restored cluster starts.
pub const TERM_JUMP: u64 = 1 << 20;

/// How far past the backup's log index a restored cluster starts (about 35 years of log at a
/// thousand entries a second).
pub const INDEX_JUMP: u64 = 1 << 40;

/// How far past the backup's last token a restored cluster's tokens start at least: a trillion
/// tokens, 15 years of acquisitions at 2,000 a second.
pub const TOKEN_GAP: u64 = 1_000_000_000_000;

/// The largest raft term or log index a restore sets: the idempotency records are keyed by log
/// index times 1,024.
const MAX_INDEX: u64 = u64::MAX / 1_024;

/// How far the preparing machine's wall clock may read behind the backup's log time. Log time
/// follows the wall clock of the cluster's birth at the monotonic clock's rate, so a correct
/// clock reads at or past it; a clock further behind would start this preparation below one
/// made earlier on a machine whose clock is right.
pub const CLOCK_BEHIND_TOLERANCE_MS: u64 = 10_000;

/// What a prepared backup's snapshot id starts with.
const PREPARED: &str = "prepared-restore-";

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

/// What a prepared backup holds: the restored cluster's first state.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RestoreSummary {
    /// The restored state (no active lease; its last token is the floor).
    pub state: BackupSummary,
    /// The restored cluster's first term and log index.
    pub term: u64,
    pub index: u64,
    /// Every token the restored cluster issues is above this.
    pub token_floor: u64,
}

fn refused(what: &'static str, detail: String) -> StoreError {
    StoreError::Refused { what, detail }
}

/// Turns the backup at `backup` into the prepared backup `out`: the state a new cluster of
/// `members` starts from (see the module documentation), `wall_ms` being the wall clock.
/// Returns what the backup held and what the prepared file holds.
pub fn prepare(
    backup: &Path,
    out: &Path,
    members: &BTreeMap<u64, NodeInfo>,
    wall_ms: u64,
) -> Result<(BackupSummary, RestoreSummary), StoreError> {
    if members.is_empty() {
        return Err(refused(
            "backup",
            "the restored cluster needs at least one member".into(),
        ));
    }
    let mut image = read_backup(backup)?;
    if image.meta.snapshot_id.starts_with(PREPARED) {
        return Err(refused(
            "backup",
            "it is a prepared backup already; prepare the backup it was made from".into(),
        ));
    }
    let Some(old) = image.meta.last_log_id else {
        return Err(refused("backup", "it covers no log entry".into()));
    };
    let stats = image.machine.stats();
    if wall_ms.saturating_add(CLOCK_BEHIND_TOLERANCE_MS) < stats.now_ms {
        return Err(refused(
            "clock",
            format!(
                "this machine's clock reads {:.1} s before the backup's log time ({} ms since \
                 1970), and a preparation starts its tokens at the wall clock: one made here \
                 could start below one made earlier on a machine whose clock is right. Set the \
                 clock right (NTP) and prepare again; if it is right, the lost cluster's clock \
                 ran ahead: prepare once this clock has passed the backup's log time",
                (stats.now_ms - wall_ms) as f64 / 1_000.0,
                stats.now_ms
            ),
        ));
    }
    // Each value moves past the backup's by its jump plus the wall-clock time since the backup
    // (by the backup's log time), and to at least the wall clock: preparing the same backup
    // later, or an older one, starts above an earlier preparation, as long as a cluster issues
    // fewer than a million tokens a second.
    let wall_us = wall_ms.saturating_mul(1_000);
    let since_ms = wall_ms.saturating_sub(stats.now_ms);
    let since_us = since_ms.saturating_mul(1_000);
    let token_floor = stats
        .last_token
        .checked_add(TOKEN_GAP)
        .and_then(|floor| floor.checked_add(since_us))
        .map(|floor| floor.max(wall_us))
        .filter(|floor| *floor <= MAX_TOKEN)
        .ok_or_else(|| {
            refused(
                "backup",
                format!(
                    "its last token {} is within {TOKEN_GAP} of {MAX_TOKEN}, the largest token \
                     JSON clients read exactly",
                    stats.last_token
                ),
            )
        })?;
    let after = |value: u64, jump: u64, since: u64, wall: u64| {
        value
            .checked_add(jump)
            .and_then(|v| v.checked_add(since))
            .map(|v| v.max(wall))
            .filter(|v| *v <= MAX_INDEX)
    };
    let (Some(term), Some(index)) = (
        after(old.leader_id.term, TERM_JUMP, since_ms, wall_ms),
        after(old.index, INDEX_JUMP, since_us, wall_us),
    ) else {
        return Err(refused(
            "backup",
            "its term or index is too large to restore from".into(),
        ));
    };
    let machine = image.machine.restored_after_loss(token_floor);
    let log_id = LogId::new(CommittedLeaderId::new(term, old.leader_id.node_id), index);
    let voters: BTreeSet<u64> = members.keys().copied().collect();
    let membership = Membership::new(vec![voters], members.clone());
    let meta = Meta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        snapshot_id: format!("{PREPARED}{term}-{index}"),
    };
    {
        let mut records = image.reader.records().map(|(_, entries)| entries);
        let records = records
            .as_mut()
            .map(|r| r as &mut dyn Iterator<Item = Result<_, _>>);
        write_prepared(out, &meta, &machine, records)?;
    }
    let state = inspect(out)?;
    let held = summary(backup, &image.meta, &stats, state.idempotency_records)?;
    Ok((
        held,
        RestoreSummary {
            state,
            term,
            index,
            token_floor,
        },
    ))
}

/// The members a prepared backup makes the cluster of; refuses a file that is not one.
pub fn prepared_members(prepared: &Path) -> Result<BTreeMap<u64, NodeInfo>, StoreError> {
    let meta = super::snapshot_file::open_at(prepared)?.header.meta;
    if !meta.snapshot_id.starts_with(PREPARED) {
        return Err(refused(
            "prepared backup",
            format!(
                "{} is a backup, not a prepared one: prepare it once with `fencegate backup \
                 prepare`, then restore every member from the prepared file",
                prepared.display()
            ),
        ));
    }
    Ok(meta
        .last_membership
        .nodes()
        .map(|(id, info)| (*id, info.clone()))
        .collect())
}

/// Installs the prepared backup at `prepared` into `data_dir` (which must hold no storage) as
/// node `node_id`'s: as a follower installs a snapshot from its leader, then the log purged up
/// to it and a vote saved in its term.
pub async fn restore(
    prepared: &Path,
    data_dir: &Path,
    node_id: u64,
) -> Result<RestoreSummary, StoreError> {
    if !prepared_members(prepared)?.contains_key(&node_id) {
        return Err(refused(
            "prepared backup",
            format!("node {node_id} is not among the members it was prepared for"),
        ));
    }
    let state = inspect(prepared)?;
    let (mut log, mut sm) = super::open(data_dir, Arc::new(|_, _| {}))?;
    let raft_err = |what: &str, e: openraft::StorageError<u64>| {
        StoreError::Task(format!("{what} in the restored directory: {e}"))
    };
    let (applied, _) = sm
        .applied_state()
        .await
        .map_err(|e| raft_err("read the state", e))?;
    let log_state = log
        .get_log_state()
        .await
        .map_err(|e| raft_err("read the log", e))?;
    if applied.is_some() || log_state.last_log_id.is_some() {
        return Err(refused(
            "prepared backup",
            format!("{} already holds a node's storage", data_dir.display()),
        ));
    }
    let meta = sm.install_prepared(prepared).await?;
    let Some(log_id) = meta.last_log_id else {
        return Err(refused("prepared backup", "it covers no log entry".into()));
    };
    log.purge(log_id)
        .await
        .map_err(|e| raft_err("purge the log", e))?;
    log.save_committed(Some(log_id))
        .await
        .map_err(|e| raft_err("save the committed id", e))?;
    log.save_vote(&Vote::new(log_id.leader_id.term, node_id))
        .await
        .map_err(|e| raft_err("save the vote", e))?;
    Ok(RestoreSummary {
        token_floor: state.last_token,
        state,
        term: log_id.leader_id.term,
        index: log_id.index,
    })
}
