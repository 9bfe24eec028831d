//! The raft log (segment files, see `wal.rs`), and the vote, committed id and purge marker in
//! fjall's `meta` keyspace (openraft `RaftLogStorage`, storage-v2). The vote is mirrored in a
//! file of its own (see [`VOTE_FILE`]).

use std::fmt::Debug;
use std::fs;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use fjall::PersistMode;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};

use super::log_tail::LogTail;
use super::wal::{self, Preallocate, Wal};
use super::{blocking, decode, encode, encode_compressed, Db, StoreError};
use crate::raft::TypeConfig;

const VOTE_KEY: &[u8] = b"vote";
const COMMITTED_KEY: &[u8] = b"committed";
const PURGED_KEY: &[u8] = b"purged";

/// The log's directory under the data directory.
const LOG_DIR: &str = "raft-log";
/// A copy of the saved vote beside the database, in the data directory. Raft's safety rests on
/// a node never voting twice in a term, and fjall drops the end of a damaged journal silently:
/// a vote rolled back with it, for a term whose entries never reached this node, would pass
/// every check against the log. The file is written after the database, so a crash between
/// the two leaves the file behind the database, never ahead of it; a file ahead of the
/// database at open means the database lost synced writes, and the node refuses to start.
const VOTE_FILE: &str = "vote";
/// Where a log kept in fjall by an earlier version is copied before it becomes [`LOG_DIR`].
const MIGRATING_DIR: &str = "raft-log.migrating";

/// Why a write the flusher thread should have taken failed.
const FLUSHER_GONE: &str = "log flusher thread is gone";

/// The raft log store. Cloning is cheap; clones share the same files and database and serve as
/// openraft's log readers for replication.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Db>,
    wal: Arc<Mutex<Wal>>,
    /// The newest entries as written, which raft reads back for replication and apply.
    tail: Arc<Mutex<LogTail>>,
    /// Hands appended entries' callbacks and the committed log id to the flusher thread
    /// (group commit).
    flusher: std::sync::mpsc::Sender<FlushJob>,
    /// Hands segment files that hold only purged entries to the thread that deletes them.
    purger: std::sync::mpsc::Sender<Vec<PathBuf>>,
    /// The committed log id: read at open, then the one saved last, which the flusher may not
    /// have written yet.
    committed: Arc<Mutex<Option<LogId<u64>>>>,
    /// Where the flusher records how long each sync of the log took, once a node sets it.
    sync_seconds: SyncTimer,
    /// The vote's own file ([`VOTE_FILE`]).
    vote_file: Arc<Path>,
}

/// A histogram the flusher thread, started before the node's metrics exist, observes once set.
type SyncTimer = Arc<OnceLock<prometheus::Histogram>>;

fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    // The log's state (and its tail's) is only changed by calls that finish their file work
    // before they touch it, so a panic elsewhere while it was held leaves nothing half-changed.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the flusher thread is handed.
enum FlushJob {
    /// Entries written to the log, not yet synced; the callback tells raft once they are.
    Appended(LogFlushed<TypeConfig>),
    /// The newest committed log id, encoded: written, unsynced, once the entries below it are.
    Committed(Vec<u8>),
}

/// The committed log id is written at most this often. It only saves a restarted node some
/// re-applying, and each write is a new version in fjall's `meta` memtable until it is flushed:
/// at the seed workload a write per sync (~600 a second) grew it by ~5 MiB a minute.
const COMMITTED_EVERY: Duration = Duration::from_millis(100);

/// After this many committed-id writes the `meta` memtable is handed to fjall to flush, so
/// that it stays small whatever the keyspace's configured memtable size (64 MiB in data
/// directories made before this was set).
const META_WRITES_PER_FLUSH: u32 = 1_000;

/// Raft log syncs slower than [`SlowSyncs::SLOW`] hold up every command waiting on them (and,
/// on the leader, the whole cluster's commits): logged as a warning at most every
/// [`SlowSyncs::WARN_EVERY`], with how many there were since and the slowest, as etcd warns of
/// slow fdatasyncs.
#[derive(Default)]
struct SlowSyncs {
    count: u64,
    worst: Duration,
    warned: Option<Instant>,
}

impl SlowSyncs {
    const SLOW: Duration = Duration::from_millis(100);
    const WARN_EVERY: Duration = Duration::from_secs(10);

    fn saw(&mut self, took: Duration) {
        if took < Self::SLOW {
            return;
        }
        self.count += 1;
        self.worst = self.worst.max(took);
        if self
            .warned
            .is_some_and(|at| at.elapsed() < Self::WARN_EVERY)
        {
            return;
        }
        tracing::warn!(
            slow_syncs = self.count,
            slowest_ms = self.worst.as_millis() as u64,
            "raft log syncs to disk are slow: {} took over {} ms since the last warning, the \
             slowest {} ms; every write waits for them (a slow or shared disk: see \
             fencegate_raft_log_sync_seconds)",
            self.count,
            Self::SLOW.as_millis(),
            self.worst.as_millis()
        );
        *self = SlowSyncs {
            warned: Some(Instant::now()),
            ..SlowSyncs::default()
        };
    }
}

/// Group commit: `append` writes entries into the log's current segment without syncing and
/// queues its callback here; this thread syncs once for everything queued meanwhile and only
/// then tells raft the entries are durable. Under load one fsync covers many appends instead
/// of one each, and no entry is acknowledged before it is on disk.
///
/// The committed log id is written here too, so raft's core does not wait for it: openraft
/// awaits `save_committed` between learning that entries committed and applying them, and a
/// write there sat on every commit's path, on every node. It is written after the sync that
/// covers the entries below it (they were appended before raft saved it, and jobs are taken in
/// order), so the disk never holds a committed id without those entries.
fn spawn_flusher(
    db: Arc<Db>,
    wal: Arc<Mutex<Wal>>,
    sync_seconds: SyncTimer,
) -> std::sync::mpsc::Sender<FlushJob> {
    let (tx, rx) = std::sync::mpsc::channel::<FlushJob>();
    let spawned = std::thread::Builder::new()
        .name("raft-log-flusher".into())
        .spawn(move || {
            let mut committed = CommittedWriter::new(db);
            let mut slow = SlowSyncs::default();
            loop {
                // A committed id held back by `COMMITTED_EVERY` is written once it is due, even
                // if nothing else comes.
                let first = match committed.due_in() {
                    None => rx.recv().ok(),
                    Some(wait) => match rx.recv_timeout(wait) {
                        Ok(job) => Some(job),
                        Err(RecvTimeoutError::Timeout) => {
                            committed.write_if_due();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => None,
                    },
                };
                let Some(first) = first else { break };
                let mut waiting = Vec::new();
                for job in std::iter::once(first).chain(rx.try_iter()) {
                    match job {
                        FlushJob::Appended(callback) => waiting.push(callback),
                        FlushJob::Committed(value) => committed.pending = Some(value),
                    }
                }
                let synced = if waiting.is_empty() {
                    Ok(())
                } else {
                    // Syncing the segment appends go to covers every append so far: a finished
                    // segment was synced when the next one was started. The log's lock is let
                    // go first: raft's core appends the next entries meanwhile instead of
                    // waiting out the disk (their callbacks are queued after this round's, so
                    // the next sync covers them).
                    let file = lock(&wal).active_file();
                    match file {
                        Some(file) => {
                            let started = Instant::now();
                            let synced = file.sync_data();
                            let took = started.elapsed();
                            if let Some(histogram) = sync_seconds.get() {
                                histogram.observe(took.as_secs_f64());
                            }
                            slow.saw(took);
                            synced
                        }
                        None => Ok(()),
                    }
                };
                if synced.is_ok() {
                    committed.write_if_due();
                }
                for callback in waiting {
                    let result = match (&synced, &committed.failed) {
                        (Err(e), _) => Err(io::Error::other(format!("log fsync failed: {e}"))),
                        // The database holding the vote cannot be written any more (fjall
                        // stops taking writes after one failed): raft must stop now, not at
                        // its next vote or snapshot, while the node looks healthy meanwhile.
                        (Ok(()), Some(e)) => Err(io::Error::other(format!(
                            "the node's database cannot be written: {e}"
                        ))),
                        (Ok(()), None) => Ok(()),
                    };
                    callback.log_io_completed(result);
                }
            }
            // The store is gone: whatever was held back goes to disk now.
            committed.write();
        });
    if let Err(e) = spawned {
        // Without the thread every callback is dropped unanswered and raft stalls; say why.
        tracing::error!(error = %e, "could not start the log flusher thread");
    }
    tx
}

/// The flusher's writes of the committed log id (see [`COMMITTED_EVERY`]).
struct CommittedWriter {
    db: Arc<Db>,
    /// The newest id, encoded, not written yet.
    pending: Option<Vec<u8>>,
    last_write: Option<Instant>,
    writes: u32,
    /// Why the database refused a write, once it did.
    failed: Option<String>,
}

impl CommittedWriter {
    fn new(db: Arc<Db>) -> Self {
        CommittedWriter {
            db,
            pending: None,
            last_write: None,
            writes: 0,
            failed: None,
        }
    }

    /// How long until a pending id is due (zero if it is); `None` if nothing is pending.
    fn due_in(&self) -> Option<Duration> {
        self.pending.as_ref()?;
        Some(match self.last_write {
            Some(at) => COMMITTED_EVERY.saturating_sub(at.elapsed()),
            None => Duration::ZERO,
        })
    }

    fn write_if_due(&mut self) {
        if self.due_in() == Some(Duration::ZERO) {
            self.write();
        }
    }

    /// Writes the pending id, unsynced: the next synced write to the database (a vote, a purge
    /// marker, a snapshot) carries it. A failure here poisons the database: it is kept in
    /// `failed`, and the appends synced after it are answered with it, which stops raft.
    fn write(&mut self) {
        let Some(value) = self.pending.take() else {
            return;
        };
        self.last_write = Some(Instant::now());
        let mut batch = self.db.db.batch().durability(None);
        batch.insert(&self.db.meta, COMMITTED_KEY, value);
        if let Err(e) = batch.commit() {
            if self.failed.is_none() {
                tracing::error!(error = %e, "could not write the committed log id");
            }
            self.failed = Some(e.to_string());
            return;
        }
        self.writes += 1;
        if self.writes.is_multiple_of(META_WRITES_PER_FLUSH) {
            if let Err(e) = self.db.meta.rotate_memtable() {
                tracing::warn!(error = %e, "could not hand the meta keyspace's memtable to flushing");
            }
        }
    }
}

/// Deletes segment files that hold only purged entries, off raft's path: openraft awaits
/// `purge` inside its core loop. Once the purge marker is durable those entries are never read
/// again, and `open` deletes any such file still there after a restart.
fn spawn_purger() -> std::sync::mpsc::Sender<Vec<PathBuf>> {
    let (tx, rx) = std::sync::mpsc::channel::<Vec<PathBuf>>();
    let spawned = std::thread::Builder::new()
        .name("raft-log-purger".into())
        .spawn(move || {
            while let Ok(paths) = rx.recv() {
                for path in paths {
                    if let Err(e) = fs::remove_file(&path) {
                        tracing::error!(error = %e, path = %path.display(), "could not delete a purged raft log segment");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        // Purged segments then stay on disk until `open` deletes them at the next restart.
        tracing::error!(error = %e, "could not start the log purger thread");
    }
    tx
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

fn key_index(key: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| StoreError::Corrupt {
        what: "log key",
        detail: format!("{} bytes, expected 8", key.len()),
    })?;
    Ok(u64::from_be_bytes(bytes))
}

/// `range` as `from..to`.
fn span(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let from = match range.start_bound() {
        Bound::Included(&i) => i,
        Bound::Excluded(&i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let to = match range.end_bound() {
        Bound::Included(&i) => i.saturating_add(1),
        Bound::Excluded(&i) => i,
        Bound::Unbounded => u64::MAX,
    };
    (from, to)
}

/// Earlier versions kept the log in fjall's `log` keyspace, one key per index. Its entries past
/// the purge marker are copied, as stored, into segment files in a directory of their own,
/// which is synced and then renamed to the log's: the log directory exists only once it is
/// complete. The keyspace is emptied afterwards (also when a crash came between the rename and
/// that).
fn migrate_fjall_log(db: &Db, dir: &Path, purged: Option<u64>) -> Result<(), StoreError> {
    let Some(first) = db.log.first_key_value() else {
        return Ok(());
    };
    let target = dir.join(LOG_DIR);
    if !target.exists() {
        let staging = dir.join(MIGRATING_DIR);
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(wal::io_err(&staging))?;
        }
        let from = purged.map_or(key_index(&first.key()?)?, |p| p + 1);
        let mut wal = Wal::open(&staging, purged, wal::SEGMENT_BYTES, Preallocate::No)?;
        let mut run = Vec::new();
        let mut copied = 0u64;
        for guard in db.log.range::<[u8; 8], _>(from.to_be_bytes()..) {
            let (key, value) = guard.into_inner()?;
            run.push((key_index(&key)?, value.to_vec()));
            if run.len() == 1024 {
                copied += run.len() as u64;
                wal.append(&std::mem::take(&mut run))?;
            }
        }
        copied += run.len() as u64;
        wal.append(&run)?;
        if let Some(file) = wal.active_file() {
            file.sync_data().map_err(wal::io_err(&staging))?;
        }
        drop(wal);
        fs::rename(&staging, &target).map_err(wal::io_err(&target))?;
        wal::sync_dir(dir)?;
        tracing::info!(
            entries = copied,
            "moved the raft log out of fjall into segment files"
        );
    }
    let mut keys = Vec::new();
    for guard in db.log.iter() {
        keys.push(guard.key()?);
    }
    for chunk in keys.chunks(1024) {
        let mut batch = db.db.batch().durability(None);
        for key in chunk {
            batch.remove(&db.log, key.clone());
        }
        batch.commit()?;
    }
    Ok(())
}

/// Writes `value` (an encoded vote) as the vote file, replacing the old one atomically, and
/// syncs it.
fn write_vote_file(path: &Path, value: &[u8]) -> Result<(), StoreError> {
    let failed = |source| StoreError::VoteFile {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp).map_err(failed)?;
    io::Write::write_all(&mut f, value).map_err(failed)?;
    f.sync_all().map_err(failed)?;
    fs::rename(&tmp, path).map_err(failed)?;
    wal::sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Refuses a database whose vote is behind the vote file (see [`VOTE_FILE`]); writes the file
/// from the database's vote where there is none yet (a directory of an earlier version, or a
/// crash before the first one was written).
fn vote_file_not_ahead(db: &Db, path: &Path) -> Result<(), StoreError> {
    let saved = read_meta::<Vote<u64>>(db, VOTE_KEY, "vote")?;
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return match saved {
                Some(vote) => write_vote_file(path, &encode("vote", &vote)?),
                None => Ok(()),
            };
        }
        Err(source) => {
            return Err(StoreError::VoteFile {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mirrored: Vote<u64> = decode("vote file", &bytes)?;
    if vote_covers(saved.as_ref(), &mirrored) {
        return Ok(());
    }
    let said = saved.map_or_else(|| "no vote".to_string(), |v| format!("vote {v}"));
    Err(StoreError::Corrupt {
        what: "raft vote",
        detail: format!(
            "the database holds {said}, but {} holds the later vote {mirrored}: the database \
             lost writes it had synced (a damaged or missing fjall journal), and this node \
             could vote twice in a term. Delete all of the data directory and start the node \
             again: it rejoins from the leader's snapshot",
            path.display()
        ),
    })
}

/// Whether the database's vote is at least the mirrored one: a later term, or the same vote
/// (committed or not: a vote is committed after it is saved, for the same candidate).
fn vote_covers(saved: Option<&Vote<u64>>, mirrored: &Vote<u64>) -> bool {
    let Some(saved) = saved else {
        return false;
    };
    let (s, m) = (saved.leader_id(), mirrored.leader_id());
    s.term > m.term || s == m
}

/// Refuses a log that ends below its committed id. The committed id is written only after
/// the entries up to it were synced, so such a log lost files after the fact (deleted by hand,
/// a damaged disk); a node that went on with it would vote and serve as if it still held
/// entries it acknowledged.
fn missing_committed_entries(
    wal: &Mutex<Wal>,
    purged: Option<LogId<u64>>,
    committed: Option<LogId<u64>>,
    dir: &Path,
) -> Result<(), StoreError> {
    let Some(committed) = committed else {
        return Ok(());
    };
    let last = lock(wal).last().max(purged.map(|p| p.index));
    if last.is_some_and(|last| last >= committed.index) {
        return Ok(());
    }
    let after = last.map_or(0, |l| l + 1);
    Err(StoreError::Corrupt {
        what: "raft log",
        detail: format!(
            "entries {after} to {} are missing from {}, although this node saw them \
             committed; it must not vote or serve without them. If this data directory was \
             damaged, delete all of it and start the node again: it rejoins from the leader's \
             snapshot",
            committed.index,
            dir.join(LOG_DIR).display()
        ),
    })
}

impl LogStore {
    pub(crate) fn open(db: Arc<Db>, dir: &Path) -> Result<Self, StoreError> {
        let purged = read_meta::<LogId<u64>>(&db, PURGED_KEY, "purged log id")?;
        migrate_fjall_log(&db, dir, purged.map(|p| p.index))?;
        let wal = Wal::open(
            &dir.join(LOG_DIR),
            purged.map(|p| p.index),
            wal::SEGMENT_BYTES,
            Preallocate::Spares,
        )?;
        let wal = Arc::new(Mutex::new(wal));
        // Stored as `Option<LogId>`, so a saved `None` reads back as `None` too.
        let committed =
            read_meta::<Option<LogId<u64>>>(&db, COMMITTED_KEY, "committed log id")?.flatten();
        missing_committed_entries(&wal, purged, committed, dir)?;
        let vote_file: Arc<Path> = dir.join(VOTE_FILE).into();
        vote_file_not_ahead(&db, &vote_file)?;
        let sync_seconds = SyncTimer::default();
        let store = LogStore {
            flusher: spawn_flusher(db.clone(), wal.clone(), sync_seconds.clone()),
            sync_seconds,
            purger: spawn_purger(),
            db,
            wal,
            tail: Arc::default(),
            committed: Arc::new(Mutex::new(committed)),
            vote_file,
        };
        store.vote_not_behind(&[purged, committed])?;
        Ok(store)
    }

    /// Refuses a saved vote older than the log. A node saves a leader's term as its vote
    /// before it takes entries of that term (or a snapshot of them), so its vote is never
    /// behind its newest entry, nor any of `also` (its purge point, its committed id, its
    /// snapshot). One that is was lost or rolled back (fjall drops a damaged journal's end
    /// silently; a data directory that kept only its snapshot), and a node that went on with
    /// it could vote twice in a term, or as if it held entries it lost.
    pub(super) fn vote_not_behind(&self, also: &[Option<LogId<u64>>]) -> Result<(), StoreError> {
        let vote = self.read_meta::<Vote<u64>>(VOTE_KEY, "vote")?;
        let vote_term = vote.map_or(0, |v| v.leader_id().term);
        let newest = std::iter::once(self.last_entry_id()?)
            .chain(also.iter().copied())
            .flatten()
            .map(|id| id.leader_id.term)
            .max()
            .unwrap_or(0);
        if vote_term >= newest {
            return Ok(());
        }
        Err(StoreError::Corrupt {
            what: "raft vote",
            detail: format!(
                "the saved vote is for term {vote_term}, but the log or the snapshot holds \
                 entries of term {newest}: the vote was lost or rolled back (a damaged or \
                 missing fjall journal or raft log in the data directory), and this node could \
                 vote twice in a term or as if it held entries it lost. Delete all of the data \
                 directory and start the node again: it rejoins from the leader's snapshot"
            ),
        })
    }

    /// Records how long each sync of the log takes in `histogram` (the first one set stays).
    pub fn observe_sync_with(&self, histogram: prometheus::Histogram) {
        let _ = self.sync_seconds.set(histogram);
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

    /// Writes entries into the log, not yet synced (the flusher syncs).
    fn write_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<(), StoreError> {
        let entries: Vec<_> = entries.into_iter().collect();
        let mut records = Vec::with_capacity(entries.len());
        for entry in &entries {
            let value = encode_compressed("log entry", entry)?;
            records.push((entry.log_id.index, value));
        }
        let written = lock(&self.wal).append(&records);
        let mut tail = lock(&self.tail);
        match written {
            Ok(()) => tail.push(entries),
            // Some of the records may be in the files and some not: read them from there.
            Err(_) => tail.clear(),
        }
        written
    }

    fn read_entries(&self, from: u64, to: u64) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        if let Some(entries) = lock(&self.tail).get(from, to) {
            return Ok(entries);
        }
        // Read under the lock, decoded without it.
        let stretches = lock(&self.wal).read(from, to)?;
        let mut entries = Vec::new();
        for stretch in stretches {
            stretch.records(|index, bytes| {
                let entry: Entry<TypeConfig> = decode("log entry", bytes)?;
                if entry.log_id.index != index {
                    return Err(StoreError::Corrupt {
                        what: "log entry",
                        detail: format!("entry {} stored under index {index}", entry.log_id),
                    });
                }
                entries.push(entry);
                Ok(())
            })?;
        }
        Ok(entries)
    }

    fn last_entry_id(&self) -> Result<Option<LogId<u64>>, StoreError> {
        let Some(last) = lock(&self.wal).last() else {
            return Ok(None);
        };
        Ok(self.read_entries(last, last + 1)?.pop().map(|e| e.log_id))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        let (from, to) = span(&range);
        self.read_entries(from, to)
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
            let db = self.db.clone();
            let file = self.vote_file.clone();
            blocking(move || {
                let mut batch = db.db.batch().durability(Some(PersistMode::SyncAll));
                batch.insert(&db.meta, VOTE_KEY, value.as_slice());
                batch.commit()?;
                write_vote_file(&file, &value)
            })
            .await
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
        // it to fjall, and it rides along with fjall's next synced write (a vote, a purge
        // marker, a snapshot), as fjall has one journal for all keyspaces; raft's core goes on
        // to apply meanwhile.
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
        // Out of the tail first: it never holds an entry the files do not.
        lock(&self.tail).truncate(log_id.index);
        let wal = self.wal.clone();
        blocking(move || lock(&wal).truncate(log_id.index))
            .await
            .map_err(|e| e.into_raft(StorageIOError::write_logs))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let this = self.clone();
        let purge = async move {
            let value = encode("purged log id", &log_id)?;
            // The marker first: once it is durable, get_log_state no longer reports the purged
            // entries, and open() deletes what is left of them if we crash before that.
            this.write_meta(PURGED_KEY, value).await?;
            lock(&this.tail).purge(log_id.index);
            let doomed = lock(&this.wal).purge(log_id.index);
            if !doomed.is_empty() {
                // Without the thread the files stay, unread, until `open` deletes them.
                let _ = this.purger.send(doomed);
            }
            Ok::<(), StoreError>(())
        };
        purge
            .await
            .map_err(|e| e.into_raft(StorageIOError::write_logs))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn in_term(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn blank(index: u64) -> Entry<TypeConfig> {
        in_term(3, index)
    }

    /// A data directory of an earlier version: the log in fjall's `log` keyspace, entries 1..=5
    /// purged.
    fn legacy_dir() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = Db::open(tmp.path()).expect("open");
        let mut batch = db.db.batch().durability(Some(PersistMode::SyncAll));
        for index in 1..=40 {
            let value = encode_compressed("log entry", &blank(index)).expect("encode");
            batch.insert(&db.log, index.to_be_bytes(), value);
        }
        let purged = encode("purged", &blank(5).log_id).expect("encode");
        batch.insert(&db.meta, PURGED_KEY, purged);
        // The vote of the term that wrote the entries, as raft saved it before them.
        let vote = encode("vote", &Vote::new_committed(3, 1)).expect("encode");
        batch.insert(&db.meta, VOTE_KEY, vote);
        batch.commit().expect("write");
        tmp
    }

    async fn check_migrated(dir: &Path) {
        let db = Arc::new(Db::open(dir).expect("open"));
        let mut store = LogStore::open(db.clone(), dir).expect("log store");
        let read = store.try_get_log_entries(..).await.expect("read");
        assert_eq!(read, (6..=40).map(blank).collect::<Vec<_>>());
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_log_id, Some(blank(40).log_id));
        assert_eq!(state.last_purged_log_id, Some(blank(5).log_id));
        assert!(
            db.log.first_key_value().is_none(),
            "the keyspace is emptied"
        );
        assert!(!dir.join(MIGRATING_DIR).exists());
    }

    /// Entries read back right after they were written (from memory) are the ones the files
    /// hold, and a truncation or purge is seen at once by every reader, in memory or not.
    #[tokio::test]
    async fn reads_of_the_newest_entries_follow_truncation_and_purge() {
        use openraft::storage::RaftLogStorageExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = Arc::new(Db::open(tmp.path()).expect("open"));
        let mut store = LogStore::open(db, tmp.path()).expect("log store");
        // Raft saves a term's vote before it takes entries of that term.
        store
            .save_vote(&Vote::new_committed(3, 1))
            .await
            .expect("vote");
        let mut reader = store.get_log_reader().await;
        let all: Vec<_> = (1..=10).map(|i| in_term(2, i)).collect();
        store.blocking_append(all.clone()).await.expect("append");
        let read = reader.try_get_log_entries(4..8).await.expect("read");
        assert_eq!(read, all[3..7]);

        store
            .truncate(in_term(2, 8).log_id)
            .await
            .expect("truncate");
        let read = reader.try_get_log_entries(8..9).await.expect("read");
        assert!(read.is_empty(), "truncated entry 8 read back: {read:?}");
        store
            .blocking_append([in_term(3, 8)])
            .await
            .expect("append");
        let read = reader.try_get_log_entries(7..9).await.expect("read");
        assert_eq!(read, [in_term(2, 7), in_term(3, 8)]);

        store.purge(in_term(2, 5).log_id).await.expect("purge");
        let read = reader.try_get_log_entries(5..6).await.expect("read");
        assert!(read.is_empty(), "purged entry 5 read back: {read:?}");

        // What a restarted node reads from the files alone.
        drop((store, reader));
        let reopened = loop {
            match Db::open(tmp.path()) {
                Ok(db) => break Arc::new(db),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut store = LogStore::open(reopened, tmp.path()).expect("reopen");
        let read = store.try_get_log_entries(6..9).await.expect("read");
        assert_eq!(read, [in_term(2, 6), in_term(2, 7), in_term(3, 8)]);
    }

    /// Every append raft hears is durable was covered by a sync the histogram timed; the
    /// first histogram set stays.
    #[test]
    fn slow_syncs_are_warned_of_at_most_every_ten_seconds() {
        let mut slow = SlowSyncs::default();
        slow.saw(Duration::from_millis(50));
        assert!(slow.warned.is_none(), "a fast sync warned");
        slow.saw(Duration::from_millis(150));
        assert!(
            slow.warned.is_some() && slow.count == 0,
            "the first slow one warns"
        );
        slow.saw(Duration::from_millis(300));
        slow.saw(Duration::from_millis(120));
        assert_eq!((slow.count, slow.worst), (2, Duration::from_millis(300)));
    }

    #[tokio::test]
    async fn syncs_that_acknowledge_appends_are_timed() {
        use openraft::storage::RaftLogStorageExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = Arc::new(Db::open(tmp.path()).expect("open"));
        let mut store = LogStore::open(db, tmp.path()).expect("log store");
        let hist = || prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("s", "s"));
        let (timed, ignored) = (hist().expect("histogram"), hist().expect("histogram"));
        store.observe_sync_with(timed.clone());
        store.observe_sync_with(ignored.clone());
        for index in 1..=3 {
            store.blocking_append([blank(index)]).await.expect("append");
        }
        // One sync per acknowledged append here: each waited for its own.
        assert_eq!(timed.get_sample_count(), 3);
        assert!(timed.get_sample_sum() > 0.0);
        assert_eq!(ignored.get_sample_count(), 0);
    }

    /// The database (the vote, the committed id) on a disk that fills up while the log's own
    /// file still has room: the first write the database refuses fails the appends after it,
    /// which stops raft at once. (It went on leading, and answering its health checks, until
    /// its next vote or snapshot.) Needs root to mount a small tmpfs; elsewhere it says so.
    #[tokio::test]
    async fn appends_fail_once_the_database_refused_a_write() {
        use openraft::storage::RaftLogStorageExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let db_dir = tmp.path().join("db");
        fs::create_dir_all(&db_dir).expect("mkdir");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
            .arg(&db_dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.0)
                    .status();
            }
        }
        let _unmount = Unmount(db_dir.clone());
        let db = Arc::new(Db::open(&db_dir).expect("open"));
        let mut store = LogStore::open(db, &tmp.path().join("log")).expect("log store");
        store
            .save_vote(&Vote::new_committed(3, 1))
            .await
            .expect("vote");
        store.blocking_append([blank(1)]).await.expect("append");

        // Fill the database's file system.
        let mut filler = fs::File::create(db_dir.join("filler")).expect("filler");
        while std::io::Write::write_all(&mut filler, &[0xA5; 64 * 1024]).is_ok() {}
        let _ = filler.sync_all();

        let mut refused = None;
        for index in 2..=400 {
            store
                .save_committed(Some(blank(index - 1).log_id))
                .await
                .expect("save");
            if let Err(e) = store.blocking_append([blank(index)]).await {
                refused = Some(e.to_string());
                break;
            }
            tokio::time::sleep(COMMITTED_EVERY / 4).await;
        }
        let refused = refused.expect("appends went on with a database that refuses writes");
        assert!(refused.contains("database cannot be written"), "{refused}");
    }

    /// Committed ids saved faster than they are written: the newest one reaches the disk once
    /// it is due, and when the store is dropped.
    #[tokio::test]
    async fn the_newest_committed_id_is_written_when_due_and_when_the_store_closes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let open = || {
            let db = Arc::new(Db::open(tmp.path()).expect("open"));
            (
                LogStore::open(db.clone(), tmp.path()).expect("log store"),
                db,
            )
        };
        let (mut store, db) = open();
        let stored =
            |db: &Db| read_meta::<Option<LogId<u64>>>(db, COMMITTED_KEY, "c").expect("read");
        for index in 1..=3 {
            store
                .save_committed(Some(blank(index).log_id))
                .await
                .expect("save");
        }
        // The first is written at once, the rest held back, then the newest once due.
        tokio::time::sleep(COMMITTED_EVERY * 3).await;
        assert_eq!(stored(&db), Some(Some(blank(3).log_id)));
        for index in 4..=6 {
            store
                .save_committed(Some(blank(index).log_id))
                .await
                .expect("save");
        }
        drop((store, db));
        // The flusher thread writes what it held back and lets go of the database.
        let reopened = loop {
            match Db::open(tmp.path()) {
                Ok(db) => break db,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        assert_eq!(stored(&reopened), Some(Some(blank(6).log_id)));
    }

    #[tokio::test]
    async fn a_log_kept_in_fjall_by_an_earlier_version_is_moved_into_segments() {
        let tmp = legacy_dir();
        check_migrated(tmp.path()).await;
        // And the moved log is what opens the next time.
        check_migrated(tmp.path()).await;

        // A move cut short (the staging directory half written) is started over.
        let tmp = legacy_dir();
        let staging = tmp.path().join(MIGRATING_DIR);
        fs::create_dir_all(&staging).expect("mkdir");
        fs::write(staging.join(format!("{:020}.seg", 6)), b"FGRLOG01 half").expect("write");
        check_migrated(tmp.path()).await;
    }
}
