//! Backups of a running node's state, and a member's data directory restored from one.
//!
//! The file format and what a restore changes are described in `store/backup.rs`; this is
//! the node's side: a backup covers every write committed before it was asked for, and a
//! restored directory is written in place under a marker that a node refuses until the
//! restore completed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use openraft::LogId;

use super::start::{claim_data_dir, create_private_dir};
use super::{Node, NodeConfig, NodeError, ProposeError};
use crate::raft::{NodeInfo, SnapshotStream};
use crate::store::backup::{self, BackupSummary, RestoreSummary};

/// How long a backup may wait for the snapshot it needs (one of the seed state takes a few
/// seconds on a small machine).
const SNAPSHOT_WAIT: Duration = Duration::from_secs(120);

/// How often a backup asks raft again for the snapshot it waits for.
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// Why a backup could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// No leader confirmed what is committed, or this node could not catch up with it.
    #[error(transparent)]
    Unavailable(#[from] ProposeError),
    /// No snapshot covering the committed writes was built in time.
    #[error("no snapshot covering log index {0} within {1} s; check the node's log")]
    Snapshot(u64, u64),
    #[error("reading the snapshot: {0}")]
    Storage(#[from] crate::store::StoreError),
}

impl Node {
    /// A backup of the replicated state: a snapshot file that covers every write committed
    /// before this call (a linearizable read barrier, then a snapshot at or past it), with the
    /// log id it ends at. Any member can take it; the leader's disk and CPU are spared if a
    /// follower does.
    pub async fn backup(&self) -> Result<(LogId<u64>, SnapshotStream), BackupError> {
        self.read_barrier().await?;
        let needed = self.machine.last_applied_index();
        let deadline = Instant::now() + SNAPSHOT_WAIT;
        let mut rx = self.raft.metrics();
        let mut asked: Option<Instant> = None;
        loop {
            let covered = rx.borrow().snapshot.is_some_and(|s| s.index >= needed);
            if covered {
                if let Some((Some(id), stream)) = self.backups.current().await? {
                    if id.index >= needed {
                        return Ok((id, stream));
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BackupError::Snapshot(needed, SNAPSHOT_WAIT.as_secs()));
            }
            // openraft ignores the request while it builds one: asked again at most once a
            // second, not at every commit.
            if asked.is_none_or(|at| at.elapsed() >= ASK_AGAIN) {
                asked = Some(Instant::now());
                if let Err(e) = self.raft.trigger().snapshot().await {
                    return Err(ProposeError::Stopped(e.to_string()).into());
                }
            }
            let changed = tokio::time::timeout(left.min(ASK_AGAIN), rx.changed()).await;
            if let Ok(Err(_)) = changed {
                return Err(ProposeError::Stopped("the node is shutting down".into()).into());
            }
        }
    }
}

/// The file that marks a data directory while a restore writes it. A node refuses to start
/// on a directory that has it: the restore did not finish.
pub const RESTORING_FILE: &str = "restoring";

/// Left in a data directory a restore made: the wall-clock time of the restore, ms since 1970.
/// The node's proxy reads it: until a route's retention has passed since, a key it has no
/// record of may have been used on the lost cluster after the backup, so on a route with
/// `reconcile` it asks the upstream before forwarding.
pub const RESTORED_FILE: &str = "restored-at";

/// The wall-clock time of the restore that made `dir`, if one did.
pub fn restored_at_ms(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join(RESTORED_FILE))
        .ok()
        .and_then(|text| text.trim().parse().ok())
}

/// A mount point's own directory, left alone by a restore.
const LOST_FOUND: &str = "lost+found";

/// The members `config.initial_members` names, as raft records them.
fn members_of(config: &NodeConfig) -> BTreeMap<u64, NodeInfo> {
    config
        .initial_members
        .iter()
        .map(|(id, addrs)| {
            let info = NodeInfo {
                api_addr: addrs.api.clone(),
                peer_addr: addrs.peer.clone(),
            };
            (*id, info)
        })
        .collect()
}

/// Turns the backup at `backup` into the prepared backup `out` for a new cluster of
/// `config.initial_members`: run once; every member is then restored from `out`.
pub fn prepare_backup(
    config: &NodeConfig,
    backup: &Path,
    out: &Path,
) -> Result<(BackupSummary, RestoreSummary), NodeError> {
    let members = members_of(config);
    Ok(backup::prepare(
        backup,
        out,
        &members,
        super::clock::unix_ms(),
    )?)
}

/// Makes `config`'s data directory from the prepared backup at `prepared`. The directory must
/// be missing or empty (a mount point's `lost+found` aside), and the config's `initial_members`
/// must be the members the backup was prepared for. It is written in place under a `restoring`
/// marker, removed last: a node refuses a directory that still has it, and a failed restore
/// empties the directory again.
///
/// With `advertise` (the addresses the node will announce), the config's own entry in
/// `initial_members` must name them, as at a new node's first start: a config copied from
/// another member with its id left unchanged would otherwise make two members of one id.
pub async fn restore_data_dir(
    config: &NodeConfig,
    prepared: &Path,
    advertise: Option<&NodeInfo>,
) -> Result<RestoreSummary, NodeError> {
    let dir = &config.data_dir;
    if let Some(advertise) = advertise {
        super::check_own_entry(config, advertise)?;
    }
    if dir
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(NodeError::Config(format!(
            "data directory {}: a path with `..` cannot be restored into; name it directly",
            dir.display()
        )));
    }
    let ours = members_of(config);
    let theirs = backup::prepared_members(prepared)?;
    if ours != theirs {
        let list = |m: &BTreeMap<u64, NodeInfo>| {
            m.iter()
                .map(|(id, n)| format!("{id} = {} / {}", n.api_addr, n.peer_addr))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(NodeError::Config(format!(
            "the backup was prepared for the members {}, but this node's initial_members are {}. \
             Every member must be restored from one prepared backup with the same members",
            list(&theirs),
            list(&ours)
        )));
    }
    check_empty(dir)?;
    let in_dir = |path: &Path| {
        let path = path.to_path_buf();
        move |source| NodeError::DataDir { path, source }
    };
    let existed = dir.exists();
    create_private_dir(dir).map_err(in_dir(dir))?;
    if !existed {
        // The new directory's name must last too.
        let parent = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        sync_dir(parent).map_err(in_dir(parent))?;
    }
    check_empty(dir)?;
    let marker = dir.join(RESTORING_FILE);
    let written = std::fs::write(
        &marker,
        b"a restore from a backup is writing this directory\n",
    )
    .and_then(|()| sync_dir(dir));
    if let Err(e) = written {
        empty(dir);
        return Err(in_dir(&marker)(e));
    }
    let restored = match claim_data_dir(dir, config.id) {
        Ok(()) => backup::restore(prepared, dir, config.id)
            .await
            .map_err(NodeError::from),
        Err(e) => Err(e),
    };
    let summary = match restored {
        Ok(summary) => summary,
        Err(e) => {
            empty(dir);
            return Err(e);
        }
    };
    let stamped = dir.join(RESTORED_FILE);
    let written = std::fs::File::create(&stamped).and_then(|mut f| {
        use std::io::Write;
        writeln!(f, "{}", super::clock::unix_ms())?;
        f.sync_all()
    });
    if let Err(e) = written {
        empty(dir);
        return Err(in_dir(&stamped)(e));
    }
    // Everything the restore wrote is synced; the marker goes last.
    std::fs::remove_file(&marker)
        .and_then(|()| sync_dir(dir))
        .map_err(in_dir(&marker))?;
    Ok(summary)
}

/// Refuses a restore into a directory that holds anything (but a mount point's `lost+found`).
pub fn check_empty(dir: &Path) -> Result<(), NodeError> {
    let holds_something = std::fs::read_dir(dir).map(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name() != std::ffi::OsStr::new(LOST_FOUND))
    });
    match holds_something {
        Ok(true) => Err(NodeError::Config(format!(
            "data directory {} is not empty. A restore makes a new member's data directory; \
             stop the node and empty the directory (or move it aside) first",
            dir.display()
        ))),
        Ok(false) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NodeError::DataDir {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Removes what a failed restore wrote into the directory it found empty (best effort: the
/// directory itself and a mount point's `lost+found` stay).
fn empty(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name() == std::ffi::OsStr::new(LOST_FOUND) {
            continue;
        }
        let path = entry.path();
        let _ = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
