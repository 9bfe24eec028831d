//! The raft log, vote and committed id in fjall (openraft `RaftLogStorage`, storage-v2).

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, Weak};

use fjall::PersistMode;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};

use super::{blocking, decode, encode, encode_compressed, Db, StoreError};
use crate::raft::TypeConfig;

const VOTE_KEY: &[u8] = b"vote";
const COMMITTED_KEY: &[u8] = b"committed";
const PURGED_KEY: &[u8] = b"purged";

/// Why a write the flusher thread should have taken failed.
const FLUSHER_GONE: &str = "log flusher thread is gone";

/// How many log entries one removal batch deletes (truncate and purge).
const REMOVE_BATCH: usize = 1024;

/// The raft log store. Cloning is cheap; clones share the same database and serve as openraft's
/// log readers for replication.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Db>,
    /// Hands appended entries' callbacks and the committed log id to the flusher thread
    /// (group commit).
    flusher: std::sync::mpsc::Sender<FlushJob>,
    /// Hands purge points to the thread that deletes purged entries.
    purger: std::sync::mpsc::Sender<u64>,
    /// The committed log id: read at open, then the one saved last, which the flusher may not
    /// have written yet.
    committed: Arc<Mutex<Option<LogId<u64>>>>,
}

/// What the flusher thread is handed.
enum FlushJob {
    /// Entries written to the journal, not yet synced; the callback tells raft once they are.
    Appended(LogFlushed<TypeConfig>),
    /// The newest committed log id, encoded: written, unsynced, before the next sync.
    Committed(Vec<u8>),
}

/// Group commit: `append` writes entries into fjall's journal without syncing and queues its
/// callback here; this thread syncs once for everything queued meanwhile and only then tells
/// raft the entries are durable. Under load one fsync covers many appends instead of one each,
/// and no entry is acknowledged before it is on disk.
///
/// The committed log id is written here too, so raft's core does not wait for it: openraft
/// awaits `save_committed` between learning that entries committed and applying them, and a
/// write there (a hop to a blocking thread, and fjall's journal lock, which a sync holds) sat
/// on every commit's path, on every node. It is written after the entries it covers (they were
/// appended before raft saved it, and jobs are taken in order), so the journal never holds a
/// committed id without the entries below it.
fn spawn_flusher(db: Arc<Db>) -> std::sync::mpsc::Sender<FlushJob> {
    let (tx, rx) = std::sync::mpsc::channel::<FlushJob>();
    let spawned = std::thread::Builder::new()
        .name("fjall-log-flusher".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut waiting = Vec::new();
                let mut committed = None;
                for job in std::iter::once(first).chain(rx.try_iter()) {
                    match job {
                        FlushJob::Appended(callback) => waiting.push(callback),
                        // Only the newest matters.
                        FlushJob::Committed(value) => committed = Some(value),
                    }
                }
                if let Some(value) = committed {
                    // Unsynced: it rides along with the next sync (see `save_committed`). A
                    // failure here poisons the database, and the next append reports it.
                    let mut batch = db.db.batch().durability(None);
                    batch.insert(&db.meta, COMMITTED_KEY, value);
                    if let Err(e) = batch.commit() {
                        tracing::error!(error = %e, "could not write the committed log id");
                    }
                }
                if waiting.is_empty() {
                    continue;
                }
                let synced = db.db.persist(PersistMode::SyncAll);
                for callback in waiting {
                    let result = match &synced {
                        Ok(()) => Ok(()),
                        Err(e) => Err(io::Error::other(format!("log fsync failed: {e}"))),
                    };
                    callback.log_io_completed(result);
                }
            }
        });
    if let Err(e) = spawned {
        // Without the thread every callback is dropped unanswered and raft stalls; say why.
        tracing::error!(error = %e, "could not start the log flusher thread");
    }
    tx
}

/// Deletes purged entries off raft's path. openraft awaits `purge` inside its core loop, so
/// whatever `purge` does holds back every append, vote and commit meanwhile; deleting the
/// ~20,000 entries a snapshot frees took long enough to show as slow commits at every
/// snapshot. Once the purge marker is durable the entries at or below it are invisible (the log
/// state starts after the marker, and `open` finishes an interrupted deletion), so their
/// deletion can trail behind. Purge points that queue up while a deletion runs are merged.
///
/// `next` is the lowest index that may still be stored. The keys are the indexes themselves,
/// so a deletion removes `next..=upto` without reading the log first. The thread holds the
/// database only while it deletes one batch: once the node has dropped its stores, the
/// database closes (and can be opened again) without waiting for the deletion to end.
fn spawn_purger(db: Weak<Db>, mut next: u64) -> std::sync::mpsc::Sender<u64> {
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let spawned = std::thread::Builder::new()
        .name("fjall-log-purger".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let upto = rx.try_iter().fold(first, u64::max);
                if upto < next {
                    continue;
                }
                if let Err(e) = remove_indexes(&db, next, upto) {
                    // The entries stay invisible behind the durable marker; `open` deletes them
                    // after the next restart.
                    tracing::error!(error = %e, upto, "could not delete purged log entries");
                }
                next = upto + 1;
            }
        });
    if let Err(e) = spawned {
        // Purged entries then stay on disk until `open` deletes them at the next restart.
        tracing::error!(error = %e, "could not start the log purger thread");
    }
    tx
}

/// Deletes the entries `from..=upto`, in unsynced batches of [`REMOVE_BATCH`], and stops early
/// if the database was closed. Nothing above the log's last entry is deleted: a follower that
/// installs a snapshot far ahead of its own log purges up to the snapshot's index, and
/// tombstones for the hundreds of thousands of indexes it never stored would only cost writes.
fn remove_indexes(db: &Weak<Db>, from: u64, upto: u64) -> Result<(), StoreError> {
    let last = match db.upgrade() {
        Some(db) => match db.log.last_key_value() {
            Some(guard) => key_index(&guard.key()?)?,
            None => return Ok(()),
        },
        None => return Ok(()),
    };
    let upto = upto.min(last);
    let mut start = from;
    while start <= upto {
        let Some(db) = db.upgrade() else {
            return Ok(());
        };
        let end = upto.min(start.saturating_add(REMOVE_BATCH as u64 - 1));
        let mut batch = db.db.batch().durability(None);
        for index in start..=end {
            batch.remove(&db.log, log_key(index));
        }
        batch.commit()?;
        start = match end.checked_add(1) {
            Some(s) => s,
            None => break,
        };
    }
    Ok(())
}

fn read_meta<T: serde::de::DeserializeOwned>(
    db: &Db,
    key: &[u8],
    what: &'static str,
) -> Result<Option<T>, StoreError> {
    match db.meta.get(key)? {
        Some(v) => Ok(Some(decode(what, &v)?)),
        None => Ok(None),
    }
}

fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn key_index(key: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| StoreError::Corrupt {
        what: "log key",
        detail: format!("{} bytes, expected 8", key.len()),
    })?;
    Ok(u64::from_be_bytes(bytes))
}

fn map_bound(b: Bound<&u64>) -> Bound<[u8; 8]> {
    match b {
        Bound::Included(i) => Bound::Included(log_key(*i)),
        Bound::Excluded(i) => Bound::Excluded(log_key(*i)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl LogStore {
    pub(crate) fn open(db: Arc<Db>) -> Result<Self, StoreError> {
        let flusher = spawn_flusher(db.clone());
        // A crash between recording the purge marker and deleting the entries leaves entries at
        // or below it behind; finish that purge now so the log starts right after the marker.
        let purged = read_meta::<LogId<u64>>(&db, PURGED_KEY, "purged log id")?;
        let first = match &purged {
            Some(purged) => {
                remove_range(&db, ..=purged.index, false)?;
                purged.index + 1
            }
            None => match db.log.first_key_value() {
                Some(guard) => key_index(&guard.key()?)?,
                None => 0,
            },
        };
        // Stored as `Option<LogId>`, so a saved `None` reads back as `None` too.
        let committed =
            read_meta::<Option<LogId<u64>>>(&db, COMMITTED_KEY, "committed log id")?.flatten();
        let purger = spawn_purger(Arc::downgrade(&db), first);
        Ok(LogStore {
            db,
            flusher,
            purger,
            committed: Arc::new(Mutex::new(committed)),
        })
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        what: &'static str,
    ) -> Result<Option<T>, StoreError> {
        read_meta(&self.db, key, what)
    }

    /// Writes one meta value and syncs it to disk.
    async fn write_meta(&self, key: &'static [u8], value: Vec<u8>) -> Result<(), StoreError> {
        let db = self.db.clone();
        blocking(move || {
            let mut batch = db.db.batch().durability(Some(PersistMode::SyncAll));
            batch.insert(&db.meta, key, value);
            batch.commit()?;
            Ok(())
        })
        .await
    }

    /// Writes entries in one batch into the journal, not yet synced (the flusher syncs).
    fn write_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<(), StoreError> {
        let mut batch = self.db.db.batch().durability(None);
        for entry in entries {
            let value = encode_compressed("log entry", &entry)?;
            batch.insert(&self.db.log, log_key(entry.log_id.index), value);
        }
        batch.commit()?;
        Ok(())
    }

    fn read_entries<R: RangeBounds<u64>>(
        &self,
        range: R,
    ) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        let bounds = (map_bound(range.start_bound()), map_bound(range.end_bound()));
        let mut entries = Vec::new();
        for guard in self.db.log.range::<[u8; 8], _>(bounds) {
            let (key, value) = guard.into_inner()?;
            let entry: Entry<TypeConfig> = decode("log entry", &value)?;
            let index = key_index(&key)?;
            if entry.log_id.index != index {
                return Err(StoreError::Corrupt {
                    what: "log entry",
                    detail: format!("entry {} stored under index {index}", entry.log_id),
                });
            }
            entries.push(entry);
        }
        Ok(entries)
    }

    fn last_entry_id(&self) -> Result<Option<LogId<u64>>, StoreError> {
        match self.db.log.last_key_value() {
            Some(guard) => {
                let (_, value) = guard.into_inner()?;
                let entry: Entry<TypeConfig> = decode("log entry", &value)?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
    }
}

/// Deletes the entries whose index lies in `range`, in batches of [`REMOVE_BATCH`]. A
/// truncation (`from_top`) goes from the highest entry down, so an interrupted one leaves a
/// shorter but still gap-free log, and is synced: new entries will be appended at those
/// indexes. Finishing a purge at startup is not synced: the marker is already durable.
fn remove_range<R: RangeBounds<u64>>(db: &Db, range: R, from_top: bool) -> Result<(), StoreError> {
    let durability = from_top.then_some(PersistMode::SyncAll);
    let bounds = (map_bound(range.start_bound()), map_bound(range.end_bound()));
    let mut keys = Vec::new();
    for guard in db.log.range::<[u8; 8], _>(bounds) {
        keys.push(guard.key()?);
    }
    if from_top {
        keys.reverse();
    }
    for chunk in keys.chunks(REMOVE_BATCH) {
        let mut batch = db.db.batch().durability(durability);
        for key in chunk {
            batch.remove(&db.log, key.clone());
        }
        batch.commit()?;
    }
    Ok(())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        self.read_entries(range)
            .map_err(|e| e.into_raft(StorageIOError::read_logs))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let read = || -> Result<LogState<TypeConfig>, StoreError> {
            let last_purged_log_id = self.read_meta::<LogId<u64>>(PURGED_KEY, "purged log id")?;
            // An empty log (everything purged) ends at the purge marker.
            let last_log_id = self.last_entry_id()?.max(last_purged_log_id);
            Ok(LogState {
                last_purged_log_id,
                last_log_id,
            })
        };
        read().map_err(|e| e.into_raft(StorageIOError::read_logs))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let write = async {
            let value = encode("vote", vote)?;
            self.write_meta(VOTE_KEY, value).await
        };
        write
            .await
            .map_err(|e| e.into_raft(StorageIOError::write_vote))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        self.read_meta(VOTE_KEY, "vote")
            .map_err(|e| e.into_raft(StorageIOError::read_vote))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        // Not synced: a lost or older committed id only means fewer entries are re-applied at
        // startup (raft re-learns the commit index from the leader). The flusher thread writes
        // it, and it rides along with the next synced append, as fjall has one journal for all
        // keyspaces; raft's core goes on to apply meanwhile.
        let value = encode("committed log id", &committed)
            .map_err(|e| e.into_raft(StorageIOError::write))?;
        *self.committed.lock().unwrap_or_else(|e| e.into_inner()) = committed;
        self.flusher
            .send(FlushJob::Committed(value))
            .map_err(|_| StorageIOError::write(&io::Error::other(FLUSHER_GONE)).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(*self.committed.lock().unwrap_or_else(|e| e.into_inner()))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let written = self.write_entries(entries);
        match written {
            // Durable once the flusher has synced; it calls back then.
            Ok(()) => match self.flusher.send(FlushJob::Appended(callback)) {
                Ok(()) => Ok(()),
                Err(unsent) => {
                    if let FlushJob::Appended(callback) = unsent.0 {
                        callback.log_io_completed(Err(io::Error::other(FLUSHER_GONE)));
                    }
                    Err(StorageIOError::write_logs(&io::Error::other(FLUSHER_GONE)).into())
                }
            },
            Err(e) => {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                Err(e.into_raft(StorageIOError::write_logs))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let this = self.clone();
        blocking(move || remove_range(&this.db, log_id.index.., true))
            .await
            .map_err(|e| e.into_raft(StorageIOError::write_logs))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let this = self.clone();
        let purge = async move {
            let value = encode("purged log id", &log_id)?;
            // The marker first: once it is durable, get_log_state no longer reports the purged
            // entries, and open() finishes deleting them if we crash halfway.
            this.write_meta(PURGED_KEY, value).await?;
            // The deletion itself trails behind (see `spawn_purger`). Without the thread the
            // entries stay, invisible, until `open` deletes them after a restart.
            let _ = this.purger.send(log_id.index);
            Ok::<(), StoreError>(())
        };
        purge
            .await
            .map_err(|e| e.into_raft(StorageIOError::write_logs))
    }
}
