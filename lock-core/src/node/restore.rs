//! Backups of a running node's state, and a member's data directory restored from one.
//!
//! The file format and what a restore changes are described in `store/backup.rs`; this is
//! the node's side: a backup covers every write committed before it was asked for, and a
//! restored directory is made beside the target and renamed into place only when complete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openraft::LogId;

use super::start::{claim_data_dir, create_private_dir};
use super::{Node, NodeConfig, NodeError, ProposeError};
use crate::raft::{NodeInfo, SnapshotStream};
use crate::store::backup::{self, RestorePlan, RestoreSummary};

/// How long a backup may wait for the snapshot it needs (one of the seed state takes a few
/// seconds on a small machine).
const SNAPSHOT_WAIT: Duration = Duration::from_secs(120);

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
            // openraft ignores the request while it builds one; asked again after each change.
            if let Err(e) = self.raft.trigger().snapshot().await {
                tracing::debug!(error = %e, "could not ask for a snapshot");
            }
            let _ = tokio::time::timeout(left.min(Duration::from_secs(1)), rx.changed()).await;
        }
    }
}

/// Makes `config`'s data directory from the backup at `backup`: a member of a new cluster of
/// `config.initial_members`, with the token counter moved by `token_gap`. The directory must be
/// missing or empty. It is written as `<data_dir>.restoring` and renamed into place once
/// complete, so an interrupted restore leaves no directory a node would start on.
pub async fn restore_data_dir(
    config: &NodeConfig,
    backup: &Path,
    token_gap: u64,
) -> Result<RestoreSummary, NodeError> {
    // Without a trailing `/`, so the staging directory is a sibling.
    let dir: &Path = &config.data_dir.components().collect::<PathBuf>();
    if !config.initial_members.contains_key(&config.id) {
        return Err(NodeError::Config(format!(
            "initial_members does not list node {}: a restore makes a cluster of \
             initial_members, and this node must be one of them",
            config.id
        )));
    }
    let in_dir = |path: &Path| {
        let path = path.to_path_buf();
        move |source| NodeError::DataDir { path, source }
    };
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(NodeError::Config(format!(
                    "data directory {} is not empty. A restore makes a new member's data \
                     directory; stop the node and move the old directory aside first",
                    dir.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(in_dir(dir)(e)),
    }
    let members: BTreeMap<u64, NodeInfo> = config
        .initial_members
        .iter()
        .map(|(id, addrs)| {
            let info = NodeInfo {
                api_addr: addrs.api.clone(),
                peer_addr: addrs.peer.clone(),
            };
            (*id, info)
        })
        .collect();
    let plan = RestorePlan {
        node_id: config.id,
        members,
        token_gap,
    };
    let staging = staging_dir(dir);
    if staging.exists() {
        // What an interrupted restore left.
        std::fs::remove_dir_all(&staging).map_err(in_dir(&staging))?;
    }
    create_private_dir(&staging).map_err(in_dir(&staging))?;
    claim_data_dir(&staging, config.id)?;
    let summary = backup::restore(backup, &staging, &plan).await;
    let summary = match summary {
        Ok(summary) => summary,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e.into());
        }
    };
    // An empty directory is replaced by the rename; its parent is synced so the rename lasts.
    std::fs::rename(&staging, dir).map_err(in_dir(dir))?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(in_dir(parent))?;
    Ok(summary)
}

/// `<data_dir>.restoring`, beside the data directory.
fn staging_dir(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(".restoring");
    PathBuf::from(name)
}
