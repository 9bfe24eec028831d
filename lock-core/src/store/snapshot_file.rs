//! The current state-machine snapshot, as one file in `<data dir>/snapshots/`.
//!
//! Why a file and not the fjall database: the log and the snapshot used to share one fjall
//! journal. A snapshot of the seed state is tens of megabytes, and writing it as one synced
//! batch held the journal while every log append (and so every commit) queued behind it: each
//! snapshot showed up as a few hundred milliseconds of commit stall. A plain file is written
//! beside the journal, synced on its own, and made current by an atomic rename — the same
//! scheme etcd uses for its `.snap` files.
//!
//! The file is also what crosses the network: a leader sends its snapshot file chunk by chunk,
//! and a follower writes the chunks into a file of its own that becomes its snapshot once
//! checked. Nothing on either side holds a whole snapshot in memory, so there is no size
//! ceiling; the state machine is encoded straight into the file and decoded straight from it.
//!
//! File format (version 2):
//!
//! | bytes | content |
//! |---|---|
//! | 8 | `FGSNAP2\n` |
//! | 4 | header length, u32 big-endian |
//! | n | the encoded [`SnapshotHeader`] |
//! | 8 | payload length, u64 big-endian |
//! | m | the payload: the encoded state machine (see `state_machine.rs`) |
//! | … | only if the header names a records index: the proxy's idempotency records, each as a u32 big-endian length and the encoded record, ended by a zero length |
//!
//! A file is written as `*.tmp`, synced, renamed to `snapshot-<seq>.bin` and the directory
//! synced, so a crash leaves either the old or the new snapshot current, never half of one.
//! Older files are deleted once the new one is durable. `*.tmp` files (unfinished writes,
//! transfers in progress) are removed when the node opens its storage.
//!
//! Version 1 files (`FGSNAP1\n`: the header, then the payload whose length the header gives)
//! and the `snapshot` keyspace of still earlier versions are read until a new snapshot
//! replaces them.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, Cursor, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::SnapshotMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::idempotency::IdemEntry;
use super::{decode, decode_read, encode, Db, StoreError};
use crate::raft::{NodeInfo, SnapshotStream};

pub(super) type Meta = SnapshotMeta<u64, NodeInfo>;

const DIR: &str = "snapshots";
const MAGIC_V1: &[u8; 8] = b"FGSNAP1\n";
const MAGIC: &[u8; 8] = b"FGSNAP2\n";
const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".bin";
const TMP: &str = "tmp";

/// The description of a stored snapshot.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct SnapshotHeader {
    pub(super) meta: Meta,
    /// Length of the payload in version 1 files; 0 in version 2, which gives it after the
    /// header (it is known only once the payload is written).
    pub(super) len: u64,
    /// Chunk count in the legacy keyspace layout; unused in files.
    #[serde(default)]
    pub(super) chunks: u32,
    /// Build counter at the time it was written; restarts continue after it so snapshot ids
    /// (and file names) stay unique.
    pub(super) seq: u64,
    /// Set when the file carries the proxy's idempotency records after the payload: they are
    /// the records as of this log index (at or past the snapshot's own).
    #[serde(default)]
    pub(super) records_index: Option<u64>,
}

/// The snapshot directory. Changes of the current snapshot are serialised by `current`, which
/// also caches its header and where its payload lies.
pub(super) struct SnapshotFiles {
    dir: PathBuf,
    db: Arc<Db>,
    current: Mutex<Option<Current>>,
    seq: AtomicU64,
    /// Numbers temporary files (transfers and unfinished writes).
    temporaries: AtomicU64,
}

#[derive(Clone)]
struct Current {
    header: SnapshotHeader,
    /// `None` while the current snapshot is still the legacy keyspace copy.
    file: Option<Located>,
}

/// A snapshot file and where its payload lies in it.
#[derive(Clone)]
struct Located {
    path: PathBuf,
    payload_at: u64,
    payload_len: u64,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::SnapshotFile {
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(path: &Path, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        what: "snapshot file",
        detail: format!("{}: {detail}", path.display()),
    }
}

fn seq_of(name: &str) -> Option<u64> {
    name.strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)?
        .parse()
        .ok()
}

impl SnapshotFiles {
    /// Opens the snapshot directory under `data_dir`, removing leftovers of interrupted
    /// writes and transfers, and finds the current snapshot (the newest file, else the legacy
    /// keyspace copy).
    pub(super) fn open(data_dir: &Path, db: Arc<Db>) -> Result<Self, StoreError> {
        let dir = data_dir.join(DIR);
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        // A directory the node cannot write would stop it at its first snapshot, perhaps hours
        // later: find out now.
        let probe = dir.join(format!("probe.{TMP}"));
        fs::write(&probe, b"")
            .and_then(|()| fs::remove_file(&probe))
            .map_err(io_err(&probe))?;
        let mut newest: Option<(u64, PathBuf)> = None;
        for item in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let path = item.map_err(io_err(&dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.extension().is_some_and(|e| e == TMP) {
                // Never current, safe to drop.
                fs::remove_file(&path).map_err(io_err(&path))?;
            } else if let Some(seq) = seq_of(name) {
                if newest.as_ref().is_none_or(|(s, _)| seq > *s) {
                    newest = Some((seq, path));
                }
            }
        }
        let current = match newest {
            Some((name_seq, path)) => {
                let (header, located) = locate(path)?;
                let mut header = header;
                // A received file carries the sender's counter; the name carries ours.
                header.seq = header.seq.max(name_seq);
                Some(Current {
                    header,
                    file: Some(located),
                })
            }
            None => legacy_header(&db)?.map(|header| Current { header, file: None }),
        };
        let seq = current.as_ref().map_or(0, |c| c.header.seq);
        Ok(SnapshotFiles {
            dir,
            db,
            current: Mutex::new(current),
            seq: AtomicU64::new(seq),
            temporaries: AtomicU64::new(0),
        })
    }

    pub(super) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<Current>>, StoreError> {
        self.current.lock().map_err(|_| StoreError::Poisoned)
    }

    fn temporary_path(&self, kind: &str) -> PathBuf {
        let n = self.temporaries.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("{kind}-{n}.{TMP}"))
    }

    /// Writes a snapshot whose payload `write_payload` encodes, and makes it current unless a
    /// newer one became current meanwhile (a build that raced with an installed snapshot must
    /// not replace it, or a restart would come back behind the purged log). The file is
    /// written outside the lock, so sending the current snapshot never waits for a build.
    /// Returns whether it became current, and the file opened for reading.
    pub(super) fn persist_built(
        &self,
        meta: &Meta,
        seq: u64,
        write_payload: impl FnOnce(&mut dyn Write) -> Result<(), StoreError>,
    ) -> Result<(bool, File), StoreError> {
        let header = SnapshotHeader {
            meta: meta.clone(),
            len: 0,
            chunks: 0,
            seq,
            records_index: None,
        };
        let tmp = self.temporary_path("build");
        let written = write_file(&tmp, Pace::Background, &header, write_payload, None);
        let located = match written {
            Ok(located) => located,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        // Readable whatever happens to the path next.
        let file = File::open(&tmp).map_err(io_err(&tmp))?;
        // The idempotency records are in fjall, whose journal is synced with the vote and the
        // purge marker, not with each record write: their writes are
        // not synced one by one: a snapshot at index S stands for every record write up to S,
        // so those must be on disk before it is current (and the log before S can go).
        self.db.db.persist(fjall::PersistMode::SyncAll)?;
        let mut current = self.lock()?;
        if current
            .as_ref()
            .is_some_and(|cur| cur.header.meta.last_log_id > meta.last_log_id)
        {
            drop(current);
            fs::remove_file(&tmp).map_err(io_err(&tmp))?;
            return Ok((false, file));
        }
        self.make_current(&mut current, header, &tmp, located)?;
        Ok((true, file))
    }

    /// A copy of the snapshot file at `path` (a prepared backup) in a temporary file of this
    /// directory, to be installed as one received from a leader.
    pub(super) fn copy_in(&self, path: &Path) -> Result<(PathBuf, File), StoreError> {
        let tmp = self.temporary_path("restore");
        if let Err(e) = fs::copy(path, &tmp) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(path)(e));
        }
        let file = File::open(&tmp).map_err(io_err(&tmp))?;
        Ok((tmp, file))
    }

    /// A new temporary file for a snapshot being received.
    pub(super) fn receiving(&self) -> Result<SnapshotStream, StoreError> {
        let path = self.temporary_path("receiving");
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err(&path))?;
        Ok(SnapshotStream::temporary(file, path))
    }

    /// Makes the received file at `path` the current snapshot, after checking that it is a
    /// whole snapshot file for `expected` and that `read`, given a reader on it, accepts what
    /// it holds. The file is synced while `read` runs, so installing a large snapshot costs
    /// the longer of the two, not their sum. Returns the reader, where `read` left it, and
    /// what `read` returned. A file refused for any reason is removed.
    pub(super) fn install_received<T>(
        &self,
        path: &Path,
        expected: &Meta,
        read: impl FnOnce(&mut SnapshotReader) -> Result<T, StoreError>,
    ) -> Result<(SnapshotReader, T), StoreError> {
        let checked = self
            .check_received(path, expected)
            .and_then(|(header, located)| {
                // The transfer wrote through the page cache; the file must be on disk before
                // the log it replaces can be purged.
                let accepted = synced_while(path, || {
                    let mut reader = SnapshotReader::open_file(header.clone(), &located)?;
                    let value = read(&mut reader)?;
                    Ok((reader, value))
                })?;
                Ok((header, located, accepted))
            });
        let (header, located, accepted) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                let _ = fs::remove_file(path);
                return Err(e);
            }
        };
        let mut current = self.lock()?;
        self.make_current(&mut current, header, path, located)?;
        Ok(accepted)
    }

    fn check_received(
        &self,
        path: &Path,
        expected: &Meta,
    ) -> Result<(SnapshotHeader, Located), StoreError> {
        let (header, located) = locate(path.to_path_buf())?;
        if header.meta.last_log_id != expected.last_log_id
            || header.meta.last_membership != expected.last_membership
        {
            return Err(corrupt(
                path,
                format!(
                    "received a snapshot of {:?}, the leader announced {:?}",
                    header.meta.last_log_id, expected.last_log_id
                ),
            ));
        }
        Ok((header, located))
    }

    /// Renames the synced file `tmp` to the next snapshot name and makes it current; the
    /// previous snapshot is deleted once the new one is durable.
    fn make_current(
        &self,
        current: &mut Option<Current>,
        mut header: SnapshotHeader,
        tmp: &Path,
        located: Located,
    ) -> Result<Located, StoreError> {
        let seq = self.next_seq();
        header.seq = header.seq.max(seq);
        let path = self.dir.join(format!("{PREFIX}{seq:020}{SUFFIX}"));
        fs::rename(tmp, &path).map_err(io_err(&path))?;
        sync_dir(&self.dir)?;
        let located = Located { path, ..located };
        let previous = current.replace(Current {
            header,
            file: Some(located.clone()),
        });
        match previous {
            Some(Current {
                file: Some(old), ..
            }) => fs::remove_file(&old.path).map_err(io_err(&old.path))?,
            Some(Current { file: None, header }) => remove_legacy(&self.db, header.chunks)?,
            None => {}
        }
        Ok(located)
    }

    /// A reader on the current snapshot.
    pub(super) fn open_current(&self) -> Result<Option<SnapshotReader>, StoreError> {
        let current = self.lock()?;
        let Some(cur) = current.as_ref() else {
            return Ok(None);
        };
        // An open file stays readable even if a newer snapshot replaces (deletes) it.
        match &cur.file {
            Some(located) => SnapshotReader::open_file(cur.header.clone(), located).map(Some),
            None => {
                let data = legacy_data(&self.db, &cur.header)?;
                Ok(Some(SnapshotReader {
                    payload_len: data.len() as u64,
                    header: cur.header.clone(),
                    input: Box::new(Cursor::new(data)),
                    path: self.dir.clone(),
                }))
            }
        }
    }

    /// The current snapshot as it goes to a follower, with the proxy's idempotency records as
    /// of `records.0` when given. Without records the current file itself is sent; with them
    /// (or when the current snapshot is a legacy one) a temporary file is written for this
    /// transfer and removed with the stream.
    pub(super) fn outgoing(
        &self,
        records: Option<(u64, &mut dyn Iterator<Item = Result<IdemEntry, StoreError>>)>,
    ) -> Result<Option<(Meta, SnapshotStream)>, StoreError> {
        if records.is_none() {
            let current = self.lock()?;
            match current.as_ref() {
                None => return Ok(None),
                Some(Current {
                    header,
                    file: Some(located),
                }) => {
                    let file = File::open(&located.path).map_err(io_err(&located.path))?;
                    return Ok(Some((header.meta.clone(), SnapshotStream::durable(file))));
                }
                // A legacy snapshot is rewritten as a file below.
                Some(Current { file: None, .. }) => {}
            }
        }
        let Some(mut reader) = self.open_current()? else {
            return Ok(None);
        };
        let header = SnapshotHeader {
            meta: reader.header.meta.clone(),
            len: 0,
            chunks: 0,
            seq: reader.header.seq,
            records_index: records.as_ref().map(|(at, _)| *at),
        };
        let tmp = self.temporary_path("outgoing");
        let written = write_file(
            &tmp,
            Pace::Full,
            &header,
            |out| reader.copy_payload(out),
            records.map(|(_, entries)| entries),
        );
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        let file = File::open(&tmp).map_err(io_err(&tmp))?;
        Ok(Some((header.meta, SnapshotStream::temporary(file, tmp))))
    }
}

/// Reads a snapshot's header and finds its payload (version 1 or 2 file).
fn locate(path: PathBuf) -> Result<(SnapshotHeader, Located), StoreError> {
    let mut file = BufReader::new(File::open(&path).map_err(io_err(&path))?);
    let mut magic = [0u8; 8];
    let mut len = [0u8; 4];
    file.read_exact(&mut magic)
        .and_then(|()| file.read_exact(&mut len))
        .map_err(|e| corrupt(&path, format!("truncated: {e}")))?;
    let version =
        match &magic {
            m if m == MAGIC => 2,
            m if m == MAGIC_V1 => 1,
            _ => return Err(corrupt(
                &path,
                "not a fencegate snapshot file (a snapshot sent by a node of an older version?)",
            )),
        };
    let mut header = vec![0u8; u32::from_be_bytes(len) as usize];
    file.read_exact(&mut header)
        .map_err(|e| corrupt(&path, format!("truncated header: {e}")))?;
    let header: SnapshotHeader = decode("snapshot header", &header)?;
    let mut payload_at = 12 + u64::from(u32::from_be_bytes(len));
    let payload_len = if version == 1 {
        header.len
    } else {
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|e| corrupt(&path, format!("truncated: {e}")))?;
        payload_at += 8;
        u64::from_be_bytes(n)
    };
    let size = file.get_ref().metadata().map_err(io_err(&path))?.len();
    if payload_at.saturating_add(payload_len) > size {
        return Err(corrupt(
            &path,
            format!(
                "{size} bytes, the payload ends at {}",
                payload_at + payload_len
            ),
        ));
    }
    Ok((
        header,
        Located {
            path,
            payload_at,
            payload_len,
        },
    ))
}

/// Writes a whole snapshot of `meta` as the file `path` (a prepared backup): the payload
/// `write_payload` encodes and the idempotency `records` as of `meta`'s index. Written beside it
/// first and renamed once synced, so `path` is never half a file.
pub(super) fn write_prepared(
    path: &Path,
    meta: &Meta,
    write_payload: impl FnOnce(&mut dyn Write) -> Result<(), StoreError>,
    records: Option<&mut dyn Iterator<Item = Result<IdemEntry, StoreError>>>,
) -> Result<(), StoreError> {
    let header = SnapshotHeader {
        meta: meta.clone(),
        len: 0,
        chunks: 0,
        seq: 0,
        records_index: records
            .is_some()
            .then(|| meta.last_log_id.map_or(0, |id| id.index)),
    };
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let _ = fs::remove_file(&partial);
    let written = write_file(&partial, Pace::Full, &header, write_payload, records)
        .and_then(|_| fs::rename(&partial, path).map_err(io_err(path)))
        .and_then(|()| {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            sync_dir(dir)
        });
    if written.is_err() {
        let _ = fs::remove_file(&partial);
    }
    written
}

/// A reader on the snapshot file at `path` (a backup), after checking that it is whole.
pub(super) fn open_at(path: &Path) -> Result<SnapshotReader, StoreError> {
    let (header, located) = locate(path.to_path_buf())?;
    SnapshotReader::open_file(header, &located)
}

/// Reads one snapshot: its payload, then its idempotency records if it carries them.
pub(super) struct SnapshotReader {
    pub(super) header: SnapshotHeader,
    input: Box<dyn BufRead + Send>,
    payload_len: u64,
    /// For error messages.
    path: PathBuf,
}

impl SnapshotReader {
    fn open_file(header: SnapshotHeader, located: &Located) -> Result<Self, StoreError> {
        let path = &located.path;
        let mut file = File::open(path).map_err(io_err(path))?;
        file.seek(SeekFrom::Start(located.payload_at))
            .map_err(io_err(path))?;
        Ok(SnapshotReader {
            header,
            input: Box::new(BufReader::with_capacity(1 << 16, file)),
            payload_len: located.payload_len,
            path: path.clone(),
        })
    }

    /// Decodes the payload. Call once, before [`records`](Self::records). It is decoded as it
    /// is read (its length was checked against the file's when it was located): a payload read
    /// whole first was a second copy of the state, 75 MB at the seed workload, in memory while
    /// the machine was built from it.
    pub(super) fn payload<T: DeserializeOwned>(&mut self) -> Result<T, StoreError> {
        let len = std::mem::take(&mut self.payload_len);
        decode_read("snapshot", &mut self.input, len)
    }

    /// Copies the payload's bytes to `out`. Call once, instead of [`payload`](Self::payload).
    fn copy_payload(&mut self, out: &mut dyn Write) -> Result<(), StoreError> {
        let mut payload = (&mut self.input).take(self.payload_len);
        let copied = io::copy(&mut payload, out).map_err(io_err(&self.path))?;
        if copied != self.payload_len {
            return Err(corrupt(&self.path, "payload shorter than its header says"));
        }
        self.payload_len = 0;
        Ok(())
    }

    /// The idempotency records after the payload, if the file carries them (with the index
    /// they are as of). Call after the payload was read.
    pub(super) fn records(
        &mut self,
    ) -> Option<(
        u64,
        impl Iterator<Item = Result<IdemEntry, StoreError>> + '_,
    )> {
        let at = self.header.records_index?;
        let mut done = false;
        let frames = std::iter::from_fn(move || {
            if done {
                return None;
            }
            let frame = read_frame(&mut self.input, &self.path);
            match frame {
                Ok(Some(entry)) => Some(Ok(entry)),
                Ok(None) => {
                    done = true;
                    None
                }
                Err(e) => {
                    done = true;
                    Some(Err(e))
                }
            }
        });
        Some((at, frames))
    }
}

fn read_frame(input: &mut dyn BufRead, path: &Path) -> Result<Option<IdemEntry>, StoreError> {
    let mut len = [0u8; 4];
    input
        .read_exact(&mut len)
        .map_err(|e| corrupt(path, format!("records end without their terminator: {e}")))?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 {
        return Ok(None);
    }
    let mut bytes = vec![0u8; len];
    input
        .read_exact(&mut bytes)
        .map_err(|e| corrupt(path, format!("truncated record: {e}")))?;
    decode("snapshot idempotency record", &bytes).map(Some)
}

/// Writeback is forced every this many bytes while a snapshot file is written...
const SYNC_EVERY: u64 = 1 << 20;

/// ...and a snapshot built in the background is written no faster than this. The log's
/// fsyncs, which every commit waits for, queue behind whatever the disk has in flight: a
/// snapshot written at full speed (and every node builds one at the same log index, on a
/// small machine on one disk) showed as a burst of slow commits even in 1 MiB steps.
/// A profile showed the node doing *less* work during the build, waiting on the disk.
/// 32 MiB/s writes the seed state with a full retry window (~75 MB) in under 3 s, far
/// inside the time between snapshots.
const BACKGROUND_BYTES_PER_SEC: u64 = 32 << 20;

/// Forces writeback every [`SYNC_EVERY`] bytes, so the disk never has the whole snapshot
/// queued at once, and optionally paces the writes (see [`BACKGROUND_BYTES_PER_SEC`]).
struct SyncedWriter {
    file: File,
    written: u64,
    unsynced: u64,
    /// When writing started, if the writes are paced.
    paced_since: Option<std::time::Instant>,
}

impl Write for SyncedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        self.unsynced += n as u64;
        if self.unsynced >= SYNC_EVERY {
            self.file.sync_data()?;
            self.unsynced = 0;
            if let Some(since) = self.paced_since {
                let due = std::time::Duration::from_secs_f64(
                    self.written as f64 / BACKGROUND_BYTES_PER_SEC as f64,
                );
                if let Some(ahead) = due.checked_sub(since.elapsed()) {
                    std::thread::sleep(ahead);
                }
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Whether a file is written at the background pace or at full speed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// A snapshot built for compaction: nobody waits for it.
    Background,
    /// A snapshot a follower waits for.
    Full,
}

/// Writes a whole version 2 snapshot file at `path` and syncs it.
fn write_file(
    path: &Path,
    pace: Pace,
    header: &SnapshotHeader,
    write_payload: impl FnOnce(&mut dyn Write) -> Result<(), StoreError>,
    records: Option<&mut dyn Iterator<Item = Result<IdemEntry, StoreError>>>,
) -> Result<Located, StoreError> {
    let encoded = encode("snapshot header", header)?;
    let header_len = u32::try_from(encoded.len()).map_err(|_| {
        corrupt(
            path,
            format!("a {} byte header is too large", encoded.len()),
        )
    })?;
    let mut options = File::options();
    options.write(true).create_new(true);
    // Lease ids, stored answers and key digests: readable by the node's user only, also where
    // the file leaves the data directory (a prepared backup).
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(path).map_err(io_err(path))?;
    let mut out = BufWriter::with_capacity(
        1 << 18,
        SyncedWriter {
            file,
            written: 0,
            unsynced: 0,
            paced_since: (pace == Pace::Background).then(std::time::Instant::now),
        },
    );
    out.write_all(MAGIC)
        .and_then(|()| out.write_all(&header_len.to_be_bytes()))
        .and_then(|()| out.write_all(&encoded))
        // The payload's length, filled in once it is known.
        .and_then(|()| out.write_all(&[0u8; 8]))
        .map_err(io_err(path))?;
    let payload_at = 20 + u64::from(header_len);
    write_payload(&mut out)?;
    out.flush().map_err(io_err(path))?;
    let payload_len = out.get_ref().written - payload_at;
    if let Some(entries) = records {
        for entry in entries {
            let bytes = encode("snapshot idempotency record", &entry?)?;
            let len = u32::try_from(bytes.len())
                .map_err(|_| corrupt(path, "an idempotency record over 4 GiB"))?;
            out.write_all(&len.to_be_bytes())
                .and_then(|()| out.write_all(&bytes))
                .map_err(io_err(path))?;
        }
        out.write_all(&0u32.to_be_bytes()).map_err(io_err(path))?;
    }
    let mut file = out
        .into_inner()
        .map_err(|e| io_err(path)(e.into_error()))?
        .file;
    file.seek(SeekFrom::Start(payload_at - 8))
        .and_then(|_| file.write_all(&payload_len.to_be_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(io_err(path))?;
    Ok(Located {
        path: path.to_path_buf(),
        payload_at,
        payload_len,
    })
}

/// Runs `work` while a second thread syncs the file at `path` to disk; fails if either does.
fn synced_while<T>(
    path: &Path,
    work: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    std::thread::scope(|s| {
        let sync = s.spawn(|| {
            File::open(path)
                .and_then(|f| f.sync_all())
                .map_err(io_err(path))
        });
        let done = work();
        sync.join()
            .unwrap_or_else(|_| Err(StoreError::Task("syncing a snapshot failed".into())))?;
        done
    })
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
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

    /// The snapshot files of a data directory with a database of their own.
    fn open_files(dir: &Path) -> SnapshotFiles {
        SnapshotFiles::open(dir, Arc::new(Db::open(dir).unwrap())).unwrap()
    }

    fn persist(files: &SnapshotFiles, index: u64, value: &str) -> bool {
        files
            .persist_built(&meta(index), files.next_seq(), |out| {
                super::super::encode_into("test payload", &value, out)
            })
            .unwrap()
            .0
    }

    fn current_value(files: &SnapshotFiles) -> (Meta, String) {
        let mut reader = files.open_current().unwrap().expect("a current snapshot");
        let value: String = reader.payload().unwrap();
        (reader.header.meta.clone(), value)
    }

    fn record(key: &str, n: u64) -> IdemEntry {
        use crate::machine::{IdemRecord, IdemScope, IdemState};
        (
            IdemScope {
                tenant: "demo".into(),
                route: "/orders".into(),
                key: key.into(),
            },
            IdemRecord {
                fingerprint: format!("fp-{n}"),
                state: IdemState::Unknown { attempt: n },
                created_ms: n,
                expires_at_ms: n + 10,
                purge_at_ms: n + 20,
            },
        )
    }

    #[test]
    fn keeps_one_current_file_and_survives_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(tmp.path()).unwrap());
        let files = SnapshotFiles::open(tmp.path(), db.clone()).unwrap();
        assert!(files.open_current().unwrap().is_none());
        assert!(persist(&files, 10, "first"));
        assert!(persist(&files, 20, "second"));
        // An older build racing with a newer snapshot is not made current...
        assert!(!persist(&files, 15, "older"));
        // ...and only the current file remains.
        assert_eq!(files_in(tmp.path()).len(), 1);
        drop(files);

        // A torn write from a crash is ignored and removed on open.
        fs::write(tmp.path().join(DIR).join("build-9.tmp"), b"torn").unwrap();
        let files = SnapshotFiles::open(tmp.path(), db).unwrap();
        let (m, value) = current_value(&files);
        assert_eq!(m.last_log_id, meta(20).last_log_id);
        assert_eq!(value, "second");
        assert_eq!(files_in(tmp.path()).len(), 1);
        // Sequence numbers continue after the stored one, so file names stay unique.
        assert!(files.next_seq() > 2);
    }

    #[test]
    fn a_truncated_file_is_an_error_not_an_older_state() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(tmp.path()).unwrap());
        let files = SnapshotFiles::open(tmp.path(), db.clone()).unwrap();
        persist(&files, 10, &"x".repeat(4096));
        drop(files);
        let name = files_in(tmp.path()).remove(0);
        let path = tmp.path().join(DIR).join(name);
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
        assert!(matches!(
            SnapshotFiles::open(tmp.path(), db),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn reads_version_1_files() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(tmp.path()).unwrap());
        fs::create_dir_all(tmp.path().join(DIR)).unwrap();
        // What the previous version wrote: the header with the payload's length, the payload.
        let payload = encode("test payload", &"written by version 1").unwrap();
        let header = SnapshotHeader {
            meta: meta(30),
            len: payload.len() as u64,
            chunks: 0,
            seq: 6,
            records_index: None,
        };
        let header = encode("snapshot header", &header).unwrap();
        let mut file = MAGIC_V1.to_vec();
        file.extend_from_slice(&(header.len() as u32).to_be_bytes());
        file.extend_from_slice(&header);
        file.extend_from_slice(&payload);
        fs::write(
            tmp.path()
                .join(DIR)
                .join("snapshot-00000000000000000006.bin"),
            file,
        )
        .unwrap();

        let files = SnapshotFiles::open(tmp.path(), db).unwrap();
        let (m, value) = current_value(&files);
        assert_eq!(m.last_log_id, meta(30).last_log_id);
        assert_eq!(value, "written by version 1");
        assert_eq!(files.next_seq(), 7);
    }

    /// A leader's snapshot with records crosses to a follower as a file and becomes the
    /// follower's current snapshot, records included; the follower checks what it received.
    #[test]
    fn a_sent_snapshot_carries_its_records_and_is_checked_on_arrival() {
        let leader_dir = tempfile::tempdir().unwrap();
        let follower_dir = tempfile::tempdir().unwrap();
        let leader = open_files(leader_dir.path());
        let follower = open_files(follower_dir.path());
        persist(&leader, 40, "the state at 40");
        let records: Vec<IdemEntry> = (0..2_000).map(|n| record(&format!("k{n}"), n)).collect();

        let mut entries = records.iter().cloned().map(Ok);
        let (meta, mut stream) = leader.outgoing(Some((44, &mut entries))).unwrap().unwrap();
        assert_eq!(meta.last_log_id, self::meta(40).last_log_id);
        // What openraft does with the chunks, done with plain files here.
        let sent = stream.keep().unwrap();
        let mut received = follower.receiving().unwrap();
        let target = received.keep().unwrap();
        fs::copy(&sent, &target).unwrap();

        // A snapshot of another index than announced is refused.
        assert!(matches!(
            follower.install_received(&target, &self::meta(41), |r| r.payload::<String>()),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(!target.exists(), "a refused transfer leaves nothing behind");
        fs::copy(&sent, &target).unwrap();
        let (mut reader, state) = follower
            .install_received(&target, &meta, |r| r.payload::<String>())
            .unwrap();
        assert_eq!(state, "the state at 40");
        let (at, back) = reader.records().unwrap();
        assert_eq!(at, 44);
        let back: Vec<IdemEntry> = back.collect::<Result<_, _>>().unwrap();
        assert_eq!(back, records);
        drop(reader);

        // It is the follower's snapshot now, records and all, also after a restart.
        drop(follower);
        let follower = open_files(follower_dir.path());
        let mut reader = follower.open_current().unwrap().unwrap();
        assert_eq!(reader.payload::<String>().unwrap(), "the state at 40");
        assert_eq!(reader.records().unwrap().1.count(), records.len());
        assert_eq!(files_in(follower_dir.path()).len(), 1);
        let _ = fs::remove_file(sent);
    }

    #[test]
    fn received_bytes_that_are_no_whole_snapshot_are_refused() {
        let leader_dir = tempfile::tempdir().unwrap();
        let leader = open_files(leader_dir.path());
        persist(&leader, 40, "state");
        let records: Vec<IdemEntry> = (0..10).map(|n| record(&format!("k{n}"), n)).collect();
        let mut entries = records.into_iter().map(Ok);
        let (meta, mut stream) = leader.outgoing(Some((40, &mut entries))).unwrap().unwrap();
        let path = stream.keep().unwrap();
        let sent = fs::read(&path).unwrap();
        fs::remove_file(path).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let files = open_files(dir.path());
        let received = |bytes: &[u8]| {
            let mut stream = files.receiving().unwrap();
            let path = stream.keep().unwrap();
            fs::write(&path, bytes).unwrap();
            path
        };
        let install = |bytes: &[u8]| {
            files.install_received(&received(bytes), &meta, |r| r.payload::<String>())
        };
        // Bytes of an older sender (a bare payload) or of anything else.
        assert!(matches!(
            install(b"\x01raw payload bytes"),
            Err(StoreError::Corrupt { .. })
        ));
        // Whole, but its payload does not decode as what the reader expects: refused too, and
        // never made current.
        let path = received(&sent);
        assert!(matches!(
            files.install_received(&path, &meta, |r| r.payload::<u64>()),
            Err(StoreError::Decode { .. })
        ));
        assert!(!path.exists());
        assert!(files.open_current().unwrap().is_none());
        // Cut inside the payload.
        assert!(matches!(
            install(&sent[..40]),
            Err(StoreError::Corrupt { .. })
        ));
        // Cut inside the records: the payload reads, the records end in an error.
        let (mut reader, state) = install(&sent[..sent.len() - 6]).unwrap();
        assert_eq!(state, "state");
        let read: Vec<_> = reader.records().unwrap().1.collect();
        assert!(matches!(read.last(), Some(Err(StoreError::Corrupt { .. }))));
    }

    #[test]
    fn reads_the_legacy_keyspace_until_a_file_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(tmp.path()).unwrap());
        // The layout earlier versions wrote: a JSON header and 1 MiB chunks.
        let mut data = encode("test payload", &"legacy state").unwrap();
        data.resize(3 << 20, 0);
        let header = SnapshotHeader {
            meta: meta(30),
            len: data.len() as u64,
            chunks: 3,
            seq: 4,
            records_index: None,
        };
        for (n, chunk) in (0u32..).zip(data.chunks(1 << 20)) {
            db.snapshot.insert(legacy_chunk_key(n), chunk).unwrap();
        }
        db.snapshot
            .insert(LEGACY_HEADER_KEY, serde_json::to_vec(&header).unwrap())
            .unwrap();

        let files = SnapshotFiles::open(tmp.path(), db.clone()).unwrap();
        let mut reader = files.open_current().unwrap().unwrap();
        assert_eq!(reader.header.meta.last_log_id, meta(30).last_log_id);
        let mut read = Vec::new();
        reader.copy_payload(&mut read).unwrap();
        assert_eq!(read, data);
        assert_eq!(files.next_seq(), 5);

        persist(&files, 40, "new");
        assert!(db.snapshot.get(LEGACY_HEADER_KEY).unwrap().is_none());
        assert!(db.snapshot.get(legacy_chunk_key(0)).unwrap().is_none());
        drop(files);
        let files = SnapshotFiles::open(tmp.path(), db).unwrap();
        assert_eq!(current_value(&files).1, "new");
    }
}
