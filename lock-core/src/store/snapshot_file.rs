//! The current state-machine snapshot, as one file in `<data dir>/snapshots/`.
//!
//! Why a file and not the fjall database: the log and the snapshot used to share one fjall
//! journal. A snapshot of the seed state is tens of megabytes, and writing it as one synced
//! batch held the journal while every log append (and so every commit) queued behind it: each
//! snapshot showed up as a few hundred milliseconds of commit stall. A plain file is written
//! beside the journal, synced on its own, and made current by an atomic rename — the same
//! scheme etcd uses for its `.snap` files.
//!
//! File format: `FGSNAP1\n`, the header length (u32, big-endian), the encoded
//! [`SnapshotHeader`], then the snapshot bytes. A file is written as `*.tmp`, synced, renamed
//! to `snapshot-<seq>.bin` and the directory synced, so a crash leaves either the old or the new
//! snapshot current, never half of one. Older files are deleted once the new one is durable.
//!
//! Data directories written before snapshot files existed keep their last snapshot in the
//! `snapshot` keyspace; it is read from there until the first snapshot file replaces it.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::SnapshotMeta;
use serde::{Deserialize, Serialize};

use super::{decode, encode, Db, StoreError};
use crate::raft::NodeInfo;

pub(super) type Meta = SnapshotMeta<u64, NodeInfo>;

const DIR: &str = "snapshots";
const MAGIC: &[u8; 8] = b"FGSNAP1\n";
const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".bin";

/// The description of a stored snapshot.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct SnapshotHeader {
    pub(super) meta: Meta,
    /// Length of the snapshot bytes.
    pub(super) len: u64,
    /// Chunk count in the legacy keyspace layout; unused in files.
    #[serde(default)]
    pub(super) chunks: u32,
    /// Build counter at the time it was written; restarts continue after it so snapshot ids
    /// (and file names) stay unique.
    pub(super) seq: u64,
}

/// The snapshot directory. Writes and reads of the current snapshot are serialised by
/// `current`, which also caches its header and file.
pub(super) struct SnapshotFiles {
    dir: PathBuf,
    db: Arc<Db>,
    current: Mutex<Option<Current>>,
    seq: AtomicU64,
}

#[derive(Clone)]
struct Current {
    header: SnapshotHeader,
    /// `None` while the current snapshot is still the legacy keyspace copy.
    path: Option<PathBuf>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::SnapshotFile {
        path: path.to_path_buf(),
        source,
    }
}

fn seq_of(name: &str) -> Option<u64> {
    name.strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)?
        .parse()
        .ok()
}

impl SnapshotFiles {
    /// Opens the snapshot directory under `data_dir`, removing leftovers of an interrupted
    /// write, and finds the current snapshot (the newest file, else the legacy keyspace copy).
    pub(super) fn open(data_dir: &Path, db: Arc<Db>) -> Result<Self, StoreError> {
        let dir = data_dir.join(DIR);
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let mut newest: Option<(u64, PathBuf)> = None;
        for item in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let path = item.map_err(io_err(&dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".tmp") {
                // A write that never reached its rename: never current, safe to drop.
                fs::remove_file(&path).map_err(io_err(&path))?;
            } else if let Some(seq) = seq_of(name) {
                if newest.as_ref().is_none_or(|(s, _)| seq > *s) {
                    newest = Some((seq, path));
                }
            }
        }
        let current = match newest {
            Some((_, path)) => Some(Current {
                header: read_header(&mut File::open(&path).map_err(io_err(&path))?, &path)?,
                path: Some(path),
            }),
            None => legacy_header(&db)?.map(|header| Current { header, path: None }),
        };
        let seq = current.as_ref().map_or(0, |c| c.header.seq);
        Ok(SnapshotFiles {
            dir,
            db,
            current: Mutex::new(current),
            seq: AtomicU64::new(seq),
        })
    }

    pub(super) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<Current>>, StoreError> {
        self.current.lock().map_err(|_| StoreError::Poisoned)
    }

    /// Makes `data` the current snapshot, synced to disk. Unless `force`, a snapshot older than
    /// the current one is not written: a build that raced with an installed snapshot must not
    /// replace it, or a restart would come back behind the purged log. Returns whether it wrote.
    pub(super) fn persist(
        &self,
        meta: &Meta,
        data: &[u8],
        seq: u64,
        force: bool,
    ) -> Result<bool, StoreError> {
        let mut current = self.lock()?;
        if let Some(cur) = current.as_ref() {
            if !force && cur.header.meta.last_log_id > meta.last_log_id {
                return Ok(false);
            }
        }
        let header = SnapshotHeader {
            meta: meta.clone(),
            len: data.len() as u64,
            chunks: 0,
            seq,
        };
        let path = self.dir.join(format!("{PREFIX}{seq:020}{SUFFIX}"));
        let tmp = path.with_extension("tmp");
        write_synced(&tmp, &header, data)?;
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(&self.dir)?;
        let previous = current.replace(Current {
            header,
            path: Some(path),
        });
        // The new file is durable and current: the previous copy is garbage now.
        match previous {
            Some(Current {
                path: Some(old), ..
            }) => fs::remove_file(&old).map_err(io_err(&old))?,
            Some(Current { path: None, header }) => remove_legacy(&self.db, header.chunks)?,
            None => {}
        }
        Ok(true)
    }

    /// Reads the current snapshot back from disk.
    pub(super) fn read_current(&self) -> Result<Option<(Meta, Vec<u8>)>, StoreError> {
        let current = self.lock()?;
        let Some(cur) = current.as_ref() else {
            return Ok(None);
        };
        let data = match &cur.path {
            Some(path) => {
                let mut file = File::open(path).map_err(io_err(path))?;
                read_header(&mut file, path)?;
                let mut data = Vec::with_capacity(usize::try_from(cur.header.len).unwrap_or(0));
                file.read_to_end(&mut data).map_err(io_err(path))?;
                data
            }
            None => legacy_data(&self.db, &cur.header)?,
        };
        if data.len() as u64 != cur.header.len {
            return Err(StoreError::Corrupt {
                what: "snapshot",
                detail: format!("{} bytes read, header says {}", data.len(), cur.header.len),
            });
        }
        Ok(Some((cur.header.meta.clone(), data)))
    }
}

/// Writeback is forced every this many bytes while a snapshot file is written...
const SYNC_EVERY: usize = 1 << 20;

/// ...so the disk never has the whole snapshot queued at once: the log's own fsyncs, which
/// every commit waits for, would queue behind tens of MB of it.
fn write_synced(path: &Path, header: &SnapshotHeader, data: &[u8]) -> Result<(), StoreError> {
    let header = encode("snapshot header", header)?;
    let header_len = u32::try_from(header.len()).map_err(|_| StoreError::Corrupt {
        what: "snapshot header",
        detail: format!("{} bytes is too large", header.len()),
    })?;
    let mut file = File::create(path).map_err(io_err(path))?;
    file.write_all(MAGIC)
        .and_then(|()| file.write_all(&header_len.to_be_bytes()))
        .and_then(|()| file.write_all(&header))
        .map_err(io_err(path))?;
    for piece in data.chunks(SYNC_EVERY) {
        file.write_all(piece)
            .and_then(|()| file.sync_data())
            .map_err(io_err(path))?;
    }
    file.sync_all().map_err(io_err(path))
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

fn read_header(file: &mut File, path: &Path) -> Result<SnapshotHeader, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        what: "snapshot file",
        detail: format!("{}: {detail}", path.display()),
    };
    let mut magic = [0u8; 8];
    let mut len = [0u8; 4];
    file.read_exact(&mut magic)
        .and_then(|()| file.read_exact(&mut len))
        .map_err(|e| corrupt(format!("truncated: {e}")))?;
    if &magic != MAGIC {
        return Err(corrupt("not a fencegate snapshot file".into()));
    }
    let mut header = vec![0u8; u32::from_be_bytes(len) as usize];
    file.read_exact(&mut header)
        .map_err(|e| corrupt(format!("truncated header: {e}")))?;
    decode("snapshot header", &header)
}

// The legacy layout: a header under `header` and the bytes in 1 MiB values `chunk/<u32 BE>`.
const LEGACY_HEADER_KEY: &[u8] = b"header";

fn legacy_chunk_key(n: u32) -> Vec<u8> {
    let mut key = b"chunk/".to_vec();
    key.extend_from_slice(&n.to_be_bytes());
    key
}

fn legacy_header(db: &Db) -> Result<Option<SnapshotHeader>, StoreError> {
    match db.snapshot.get(LEGACY_HEADER_KEY)? {
        Some(v) => Ok(Some(decode("snapshot header", &v)?)),
        None => Ok(None),
    }
}

fn legacy_data(db: &Db, header: &SnapshotHeader) -> Result<Vec<u8>, StoreError> {
    let mut data = Vec::with_capacity(usize::try_from(header.len).unwrap_or(0));
    for n in 0..header.chunks {
        let chunk = db
            .snapshot
            .get(legacy_chunk_key(n))?
            .ok_or_else(|| StoreError::Corrupt {
                what: "snapshot",
                detail: format!("chunk {n} of {} missing", header.chunks),
            })?;
        data.extend_from_slice(&chunk);
    }
    Ok(data)
}

fn remove_legacy(db: &Db, chunks: u32) -> Result<(), StoreError> {
    let mut batch = db.db.batch();
    for n in 0..chunks {
        batch.remove(&db.snapshot, legacy_chunk_key(n));
    }
    batch.remove(&db.snapshot, LEGACY_HEADER_KEY);
    batch.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId, StoredMembership};

    use super::*;

    fn meta(index: u64) -> Meta {
        Meta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("1-{index}"),
        }
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir.join(DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn keeps_one_current_file_and_survives_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(tmp.path()).unwrap());
        let files = SnapshotFiles::open(tmp.path(), db.clone()).unwrap();
        assert!(files.read_current().unwrap().is_none());
        assert!(files
            .persist(&meta(10), b"first", files.next_seq(), false)
            .unwrap());
        assert!(files
            .persist(&meta(20), b"second", files.next_seq(), false)
            .unwrap());
        // An older build racing with a newer snapshot is not written...
        assert!(!files
            .persist(&meta(15), b"older", files.next_seq(), false)
            .unwrap());
        // ...and only the current file remains.
        assert_eq!(files_in(tmp.path()).len(), 1);
        drop(files);

        // A torn write from a crash is ignored and removed on open.
        fs::write(tmp.path().join(DIR).join("snapshot-9.tmp"), b"torn").unwrap();
        let files = SnapshotFiles::open(tmp.path(), db).unwrap();
        let (m, data) = files.read_current().unwrap().unwrap();
        assert_eq!(m.last_log_id, meta(20).last_log_id);
        assert_eq!(data, b"second");
        assert_eq!(files_in(tmp.path()).len(), 1);
        // Sequence numbers continue after the stored one, so file names stay unique.
        assert!(files.next_seq() > 2);
    }

    #[test]
    fn a_truncated_file_is_an_error_not_an_older_state() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(tmp.path()).unwrap());
        let files = SnapshotFiles::open(tmp.path(), db.clone()).unwrap();
        files
            .persist(&meta(10), &[7u8; 4096], files.next_seq(), false)
            .unwrap();
        drop(files);
        let name = files_in(tmp.path()).remove(0);
        let path = tmp.path().join(DIR).join(name);
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
        let files = SnapshotFiles::open(tmp.path(), db).unwrap();
        assert!(matches!(
            files.read_current(),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn reads_the_legacy_keyspace_until_a_file_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(tmp.path()).unwrap());
        // The layout earlier versions wrote: a JSON header and 1 MiB chunks.
        let data: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
        let header = SnapshotHeader {
            meta: meta(30),
            len: data.len() as u64,
            chunks: 3,
            seq: 4,
        };
        for (n, chunk) in (0u32..).zip(data.chunks(1 << 20)) {
            db.snapshot.insert(legacy_chunk_key(n), chunk).unwrap();
        }
        db.snapshot
            .insert(LEGACY_HEADER_KEY, serde_json::to_vec(&header).unwrap())
            .unwrap();

        let files = SnapshotFiles::open(tmp.path(), db.clone()).unwrap();
        let (m, read) = files.read_current().unwrap().unwrap();
        assert_eq!(m.last_log_id, meta(30).last_log_id);
        assert_eq!(read, data);
        assert_eq!(files.next_seq(), 5);

        files.persist(&meta(40), b"new", 5, false).unwrap();
        assert!(db.snapshot.get(LEGACY_HEADER_KEY).unwrap().is_none());
        assert!(db.snapshot.get(legacy_chunk_key(0)).unwrap().is_none());
        drop(files);
        let files = SnapshotFiles::open(tmp.path(), db).unwrap();
        assert_eq!(files.read_current().unwrap().unwrap().1, b"new");
    }
}
