//! The raft log's entries on disk: append-only segment files.
//!
//! A raft log is appended at its end, cut at its front after each snapshot and, rarely, cut at
//! its end when a new leader overrules entries that never committed. Files that are only
//! appended to fit that exactly: an append is one positional write of all its records, a
//! purge deletes whole files, a truncation shortens one file and deletes the ones after it.
//! Nothing is held in memory but each record's offset. (The log used to be a fjall keyspace:
//! its two memtables were a fifth of a node's heap, each flush wrote a segment that the log's
//! fsyncs queued behind, and a purge wrote a tombstone per entry for compaction to clean up.)
//!
//! A segment is named after the index of its first record (`<index, 20 digits>.seg`) and holds
//! a header (magic and that index) and then records:
//!
//! ```text
//! len: u32 LE | index: u64 LE | payload (len bytes) | xxh3-64 of the preceding bytes: u64 LE
//! ```
//!
//! Records in a segment have consecutive indexes, and each segment starts right after the one
//! before it. Durability is the caller's: [`Wal::append`] only writes, and an entry is durable
//! once [`Wal::active_file`] has been synced after it (a new segment is created, and a full one
//! finished, synced). At open, a damaged or half-written tail of the last segment is what a
//! crash during a write leaves: it is cut off (those records were never acknowledged). Damage
//! anywhere else is reported, never skipped.
//!
//! Segments are made from spare files that a background thread allocates at the segment's
//! full size ahead of time (`<n>.spare`, `fallocate`, synced; renamed once the header is in).
//! An append then writes into blocks the file already has and leaves its size alone, so the
//! sync that follows has less of the filesystem's metadata to commit: at the seed workload a
//! sync took 17 % less time on average. Allocated blocks read as zeros until written, so a
//! segment ends at its last record *or where only zeros follow*: a record never starts with
//! zeros (its length and checksum are not all zero). When no spare is ready (or the filesystem
//! cannot allocate ahead), a segment is created empty and grows as before; a cut (a torn tail
//! at open, a truncation) shortens the file, so that no old record can follow new ones.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use super::StoreError;

const MAGIC: &[u8; 8] = b"FGRLOG01";
const HEADER_LEN: u64 = 16;
/// Length and index before a record's payload, checksum after it.
const RECORD_HEAD: usize = 12;
const RECORD_TAIL: usize = 8;
const SUFFIX: &str = ".seg";
/// A spare segment file being allocated or waiting to become a segment; any found at open are
/// left over from an earlier process and deleted.
const SPARE_SUFFIX: &str = ".spare";
/// A segment is finished and a new one started once it holds this many bytes.
pub(super) const SEGMENT_BYTES: u64 = 64 << 20;
/// A larger length than this in a record is damage: an entry is one batch of commands, which
/// the batcher keeps far below it.
const MAX_PAYLOAD: usize = 256 << 20;

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::LogFile {
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(path: &Path, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        what: "raft log segment",
        detail: format!("{}: {detail}", path.display()),
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

struct Segment {
    /// The index of its first record.
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    /// Where each record starts; record `i` holds index `first + i`.
    offsets: Vec<u64>,
    /// Where the next record goes.
    end: u64,
    /// Whether the file grows with each append (not made from a spare, or cut since): such a
    /// segment is finished as soon as a spare is ready.
    grows: bool,
}

impl Segment {
    fn last(&self) -> Option<u64> {
        (!self.offsets.is_empty()).then(|| self.first + self.offsets.len() as u64 - 1)
    }

    /// Byte range of the records `from..to` (indexes inside this segment).
    fn bytes(&self, from: u64, to: u64) -> Range<u64> {
        let at = |i: u64| match self.offsets.get((i - self.first) as usize) {
            Some(&o) => o,
            None => self.end,
        };
        at(from)..at(to)
    }
}

/// Records read back: one contiguous stretch of a segment, checked as it is parsed.
pub(super) struct Stretch {
    path: PathBuf,
    /// The index of its first record.
    first: u64,
    /// Where it starts in the file.
    start: u64,
    bytes: Vec<u8>,
}

impl Stretch {
    /// Hands each record's index and payload to `each`, in order.
    pub(super) fn records(
        &self,
        mut each: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut at = 0;
        let mut expect = self.first;
        while at < self.bytes.len() {
            match parse_record(&self.bytes[at..], expect) {
                Parsed::Record { payload, len } => {
                    each(expect, payload)?;
                    at += len;
                    expect += 1;
                }
                Parsed::Short | Parsed::Damaged(_) => {
                    let offset = self.start + at as u64;
                    return Err(corrupt(
                        &self.path,
                        format!("record {expect} at byte {offset} does not read back"),
                    ));
                }
            }
        }
        Ok(())
    }
}

enum Parsed<'a> {
    Record {
        payload: &'a [u8],
        len: usize,
    },
    /// The bytes end inside the record.
    Short,
    Damaged(String),
}

fn parse_record(bytes: &[u8], expect: u64) -> Parsed<'_> {
    let Some(head) = bytes.first_chunk::<RECORD_HEAD>() else {
        return Parsed::Short;
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len > MAX_PAYLOAD {
        return Parsed::Damaged(format!("a record of {len} bytes"));
    }
    let total = RECORD_HEAD + len + RECORD_TAIL;
    if bytes.len() < total {
        return Parsed::Short;
    }
    let sum = u64::from_le_bytes(
        bytes[total - RECORD_TAIL..total]
            .try_into()
            .unwrap_or([0; 8]),
    );
    if xxh3_64(&bytes[..total - RECORD_TAIL]) != sum {
        return Parsed::Damaged("checksum mismatch".into());
    }
    let index = u64::from_le_bytes(head[4..12].try_into().unwrap_or([0; 8]));
    if index != expect {
        return Parsed::Damaged(format!("record {index} where {expect} belongs"));
    }
    Parsed::Record {
        payload: &bytes[RECORD_HEAD..RECORD_HEAD + len],
        len: total,
    }
}

fn put_record(out: &mut Vec<u8>, index: u64, payload: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(payload);
    let sum = xxh3_64(&out[start..]);
    out.extend_from_slice(&sum.to_le_bytes());
}

/// The log's segment files. Not synchronised: the log store keeps it behind a mutex.
pub(super) struct Wal {
    dir: PathBuf,
    /// In index order, each starting right after the one before. Only the last may be empty.
    segments: Vec<Segment>,
    /// Entries at or below this are purged: never read, whatever a file still holds.
    purged: Option<u64>,
    segment_bytes: u64,
    /// Files allocated ahead for the next segments, if the log makes them.
    spares: Option<Spares>,
}

/// Whether a log makes its segments from spare files allocated ahead.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Preallocate {
    /// A spare is allocated in the background while the current segment fills up.
    Spares,
    /// Segments are created empty and grow (a log written once, as a migration does).
    No,
}

/// A spare file, allocated to the segment size and synced.
struct Spare {
    path: PathBuf,
    file: File,
}

/// The thread that makes spare files, one when asked: the log asks for the next once the
/// current segment holds [`ASK_AT`] bytes (so a log that stays small, as in a test, never
/// holds 64 MiB it does not use) and takes it when the segment is full, or at once if the
/// current one was not made from a spare.
struct Spares {
    /// Let go when the log closes: the thread then stops waiting to be asked.
    ask: Option<SyncSender<()>>,
    ready: Receiver<Spare>,
    /// Whether a spare was asked for and not taken yet.
    asked: bool,
    /// A spare taken for a test, used before asking the thread.
    #[cfg(test)]
    held: Option<Spare>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The next spare is asked for once the current segment holds this many bytes (or half of a
/// smaller segment size).
const ASK_AT: u64 = 1 << 20;

impl Spares {
    fn start(dir: &Path, bytes: u64) -> Option<Spares> {
        let (ask, asked) = std::sync::mpsc::sync_channel(1);
        let (done, ready) = std::sync::mpsc::sync_channel(1);
        let dir = dir.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("raft-log-spares".into())
            .spawn(move || make_spares(&dir, bytes, &asked, &done));
        match spawned {
            Ok(thread) => Some(Spares {
                ask: Some(ask),
                ready,
                asked: false,
                #[cfg(test)]
                held: None,
                thread: Some(thread),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "could not start the thread that prepares raft log segments; segments grow as they are written");
                None
            }
        }
    }

    /// Asks for the next spare, unless one is asked for already. Once the thread is gone
    /// (making one failed), nothing is ever ready.
    fn ask(&mut self) {
        if !self.asked {
            if let Some(ask) = &self.ask {
                let _ = ask.try_send(());
            }
            self.asked = true;
        }
    }

    /// A spare if one is ready; never waits.
    fn take(&mut self) -> Option<Spare> {
        #[cfg(test)]
        if let Some(spare) = self.held.take() {
            return Some(spare);
        }
        let spare = self.ready.try_recv().ok()?;
        self.asked = false;
        Some(spare)
    }
}

impl Drop for Spares {
    /// Stops the thread and deletes the spare files, so that a log reopened in the same
    /// directory does not meet a file still being made (it deletes the spares it finds).
    fn drop(&mut self) {
        self.ask = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        #[cfg(test)]
        let held = self.held.take();
        #[cfg(not(test))]
        let held = None;
        for spare in held.into_iter().chain(self.ready.try_iter()) {
            let _ = fs::remove_file(&spare.path);
        }
    }
}

/// Makes a spare file in `dir` each time it is asked to, until the log is closed or making
/// one fails (segments then grow as they are written, as without spares).
fn make_spares(dir: &Path, bytes: u64, asked: &Receiver<()>, done: &SyncSender<Spare>) {
    for n in 0u64.. {
        if asked.recv().is_err() {
            return;
        }
        // Allocating ahead takes a whole segment at once: on a nearly full disk that could
        // leave the current segment's appends (and the snapshots) without room. With less than
        // two segments' worth free, segments grow as they are written instead.
        match free_bytes(dir) {
            Ok(free) if free < bytes.saturating_mul(2) => {
                tracing::warn!(
                    free_mib = free >> 20,
                    dir = %dir.display(),
                    "little free disk space: raft log segments are no longer allocated ahead"
                );
                return;
            }
            _ => {}
        }
        let path = dir.join(format!("{n}{SPARE_SUFFIX}"));
        let file = match allocate(&path, bytes) {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "could not allocate a raft log segment ahead; segments grow as they are written from now on");
                let _ = fs::remove_file(&path);
                return;
            }
        };
        // One spare is asked for at a time, so this never waits.
        if let Err(unsent) = done.send(Spare { path, file }) {
            let _ = fs::remove_file(&unsent.0.path);
            return;
        }
    }
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: statvfs is plain data, zero is a valid value of it, and the call only writes it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a valid, writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Creates a file at `path` with `bytes` allocated (reading as zeros) and syncs it, size and
/// allocation included. Writing the zeros instead would make a later sync write data alone,
/// but 64 MiB of zeros per segment, written by every replica at about the same time, tripled
/// the syncs over 8 ms at the seed workload on a shared disk.
fn allocate(path: &Path, bytes: u64) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    let len = libc::off_t::try_from(bytes).map_err(io::Error::other)?;
    // SAFETY: the descriptor is the open file's and outlives the call; fallocate reads no
    // memory of ours.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    file.sync_all()?;
    Ok(file)
}

impl Wal {
    /// Opens the segments in `dir` (created if missing), cutting off a torn tail of the last
    /// one and deleting segments that hold only entries at or below `purged` (and spare files
    /// an earlier process left).
    pub(super) fn open(
        dir: &Path,
        purged: Option<u64>,
        segment_bytes: u64,
        preallocate: Preallocate,
    ) -> Result<Self, StoreError> {
        if !dir.exists() {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        // A directory the node cannot write would only fail at the next segment, perhaps
        // 64 MiB of log later: find out now.
        let probe = dir.join("probe.tmp");
        fs::write(&probe, b"")
            .and_then(|()| fs::remove_file(&probe))
            .map_err(io_err(&probe))?;
        let mut found = Vec::new();
        for item in fs::read_dir(dir).map_err(io_err(dir))? {
            let item = item.map_err(io_err(dir))?;
            let name = item.file_name();
            if name.to_str().is_some_and(|n| n.ends_with(SPARE_SUFFIX)) {
                match fs::remove_file(item.path()) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(io_err(&item.path())(e));
                    }
                    _ => continue,
                }
            }
            let Some(first) = name
                .to_str()
                .and_then(|n| n.strip_suffix(SUFFIX))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            found.push((first, item.path()));
        }
        found.sort();
        let count = found.len();
        let mut segments: Vec<Segment> = Vec::with_capacity(count);
        for (n, (first, path)) in found.into_iter().enumerate() {
            let Some(segment) = scan(first, path, n + 1 == count)? else {
                continue;
            };
            // Segments holding nothing but purged entries are what a purge left for deletion.
            let dead = purged.is_some_and(|p| segment.last().unwrap_or(segment.first) <= p);
            if dead {
                fs::remove_file(&segment.path).map_err(io_err(&segment.path))?;
                continue;
            }
            if let Some(prev) = segments.last() {
                let next = prev.last().map_or(prev.first, |l| l + 1);
                if segment.first != next {
                    return Err(corrupt(
                        &segment.path,
                        format!("starts at {} where {next} belongs", segment.first),
                    ));
                }
            }
            segments.push(segment);
        }
        if let (Some(p), Some(first)) = (purged, segments.first()) {
            if first.first > p + 1 {
                return Err(corrupt(
                    &first.path,
                    format!("the log resumes at {} after purging up to {p}", first.first),
                ));
            }
        }
        let spares = match preallocate {
            Preallocate::Spares => Spares::start(dir, segment_bytes),
            Preallocate::No => None,
        };
        let wal = Wal {
            dir: dir.to_path_buf(),
            segments,
            purged,
            segment_bytes,
            spares,
        };
        Ok(wal)
    }

    /// The lowest index still readable.
    fn first_live(&self) -> Option<u64> {
        let first = self.segments.first()?.first;
        Some(self.purged.map_or(first, |p| first.max(p + 1)))
    }

    /// The index of the last record, purged or not.
    fn last_stored(&self) -> Option<u64> {
        self.segments.iter().rev().find_map(Segment::last)
    }

    /// The index of the last entry that can be read (none if all are purged).
    pub(super) fn last(&self) -> Option<u64> {
        let last = self.last_stored()?;
        (self.purged.is_none_or(|p| last > p)).then_some(last)
    }

    /// The file that appends go to: syncing it makes every append so far durable (earlier
    /// segments were synced when they were finished).
    pub(super) fn active_file(&self) -> Option<Arc<File>> {
        self.segments.last().map(|s| s.file.clone())
    }

    /// Writes `records` (index, payload), whose indexes must continue the log: right after its
    /// last entry, or anywhere when every entry is purged (a follower that installed a snapshot
    /// ahead of its log resumes past it; entries at or below the purge point are stored but
    /// never read). Not synced.
    pub(super) fn append(&mut self, records: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
        let Some(&(first, _)) = records.first() else {
            return Ok(());
        };
        for (n, (index, _)) in records.iter().enumerate() {
            if *index != first + n as u64 {
                return Err(StoreError::Corrupt {
                    what: "raft log append",
                    detail: format!("entry {index} at position {n} of a run from {first}"),
                });
            }
        }
        let next = self.last_stored().map(|l| l + 1);
        if next != Some(first) {
            if self.last().is_some() {
                return Err(StoreError::Corrupt {
                    what: "raft log append",
                    detail: format!(
                        "entry {first} does not follow the log (last entry {:?}, purged up to {:?})",
                        self.last_stored(),
                        self.purged
                    ),
                });
            }
            // Everything stored is purged (or nothing is): start over at `first`.
            for segment in std::mem::take(&mut self.segments) {
                fs::remove_file(&segment.path).map_err(io_err(&segment.path))?;
            }
        }
        let current = self.segments.last();
        let full = current.is_none_or(|s| s.end >= self.segment_bytes);
        // A growing segment with no record yet (its first append failed, or a crash came
        // between its header and its first record) is written into: a spare for the same
        // first index would need its file name.
        if full || current.is_some_and(|s| s.grows && s.last().is_some()) {
            let spare = self.spares.as_mut().and_then(Spares::take);
            if full || spare.is_some() {
                self.start_segment(first, spare)?;
            }
        }
        let Some(segment) = self.segments.last_mut() else {
            return Err(StoreError::Task("no segment to append to".into()));
        };
        let mut buf = Vec::with_capacity(
            records
                .iter()
                .map(|(_, p)| p.len() + RECORD_HEAD + RECORD_TAIL)
                .sum(),
        );
        let mut offsets = Vec::with_capacity(records.len());
        for (index, payload) in records {
            offsets.push(segment.end + buf.len() as u64);
            put_record(&mut buf, *index, payload);
        }
        if let Err(e) = segment.file.write_all_at(&buf, segment.end) {
            // Whatever part of it landed lies past `end`: cut it, so that it cannot be read as
            // a tail at the next open.
            let _ = segment.file.set_len(segment.end);
            return Err(io_err(&segment.path)(e));
        }
        segment.offsets.extend(offsets);
        segment.end += buf.len() as u64;
        if segment.end >= (self.segment_bytes / 2).min(ASK_AT) {
            if let Some(spares) = &mut self.spares {
                spares.ask();
            }
        }
        Ok(())
    }

    /// Finishes the current segment (synced) and starts a new one at `first`, made from
    /// `spare` if there is one: its header is synced and so is the directory entry, so that
    /// entries acknowledged in it are found.
    fn start_segment(&mut self, first: u64, spare: Option<Spare>) -> Result<(), StoreError> {
        if let Some(done) = self.segments.last() {
            done.file.sync_data().map_err(io_err(&done.path))?;
        }
        let path = segment_path(&self.dir, first);
        let header = segment_header(first);
        let grows = spare.is_none();
        let file = match spare {
            Some(spare) => {
                // A rename would replace a file of that name where creating one refuses to.
                if path.exists() {
                    let _ = fs::remove_file(&spare.path);
                    return Err(io_err(&path)(io::ErrorKind::AlreadyExists.into()));
                }
                spare
                    .file
                    .write_all_at(&header, 0)
                    .and_then(|()| spare.file.sync_data())
                    .and_then(|()| fs::rename(&spare.path, &path))
                    .map_err(io_err(&path))?;
                spare.file
            }
            None => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(io_err(&path))?;
                file.write_all_at(&header, 0)
                    .and_then(|()| file.sync_data())
                    .map_err(io_err(&path))?;
                file
            }
        };
        sync_dir(&self.dir)?;
        self.segments.push(Segment {
            first,
            path,
            file: Arc::new(file),
            offsets: Vec::new(),
            end: HEADER_LEN,
            grows,
        });
        Ok(())
    }

    /// Reads the entries `from..to` (purged entries and those past the end are left out), one
    /// stretch per segment, to be parsed with [`Stretch::records`]. The bytes are read while
    /// the caller holds the log, so that a truncation cannot cut them short meanwhile (a leader
    /// that steps down may still be reading for replication when the new leader's entries
    /// replace its own); parsing and decoding can wait until it is let go.
    pub(super) fn read(&self, from: u64, to: u64) -> Result<Vec<Stretch>, StoreError> {
        let (Some(live), Some(last)) = (self.first_live(), self.last()) else {
            return Ok(Vec::new());
        };
        let (from, to) = (from.max(live), to.min(last + 1));
        let mut out = Vec::new();
        if from >= to {
            return Ok(out);
        }
        for segment in &self.segments {
            let Some(seg_last) = segment.last() else {
                continue;
            };
            let (a, b) = (from.max(segment.first), to.min(seg_last + 1));
            if a < b {
                let range = segment.bytes(a, b);
                let mut bytes = vec![0u8; (range.end - range.start) as usize];
                segment
                    .file
                    .read_exact_at(&mut bytes, range.start)
                    .map_err(io_err(&segment.path))?;
                out.push(Stretch {
                    path: segment.path.clone(),
                    first: a,
                    start: range.start,
                    bytes,
                });
            }
        }
        Ok(out)
    }

    /// Removes the entries from `from` on, durably: the segment holding `from` is cut there and
    /// synced, the ones after it are deleted and the directory synced.
    pub(super) fn truncate(&mut self, from: u64) -> Result<(), StoreError> {
        let mut deleted = false;
        while let Some(segment) = self.segments.last_mut() {
            if segment.first >= from {
                fs::remove_file(&segment.path).map_err(io_err(&segment.path))?;
                self.segments.pop();
                deleted = true;
                continue;
            }
            if segment.last().is_some_and(|l| l >= from) {
                let keep = (from - segment.first) as usize;
                let end = segment.offsets[keep];
                segment
                    .file
                    .set_len(end)
                    .and_then(|()| segment.file.sync_data())
                    .map_err(io_err(&segment.path))?;
                segment.offsets.truncate(keep);
                segment.end = end;
                segment.grows = true;
            }
            break;
        }
        if deleted {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Marks the entries up to `upto` purged and lets go of the segments that hold nothing
    /// else: their paths are returned for the caller to delete (no hurry: they are never read
    /// again, and `open` deletes them if they are still there).
    pub(super) fn purge(&mut self, upto: u64) -> Vec<PathBuf> {
        let upto = self.purged.map_or(upto, |p| p.max(upto));
        self.purged = Some(upto);
        let done = self
            .segments
            .iter()
            .take_while(|s| s.last().is_some_and(|l| l <= upto))
            .count();
        self.segments.drain(..done).map(|s| s.path).collect()
    }

    /// How many segment files there are (for tests and diagnostics).
    #[cfg(test)]
    fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Asks for a spare and waits until it is filled, so that the next segment is made from
    /// it.
    #[cfg(test)]
    fn wait_for_spare(&mut self) {
        let spares = self.spares.as_mut().expect("this log makes spares");
        if spares.held.is_none() {
            spares.ask();
            let spare = spares
                .ready
                .recv()
                .expect("the spare thread hands one over");
            spares.asked = false;
            spares.held = Some(spare);
        }
    }
}

/// The file of the segment whose first entry is `first`: names sort in index order.
fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}{SUFFIX}"))
}

/// A segment's header: the magic, then the index of its first entry.
fn segment_header(first: u64) -> Vec<u8> {
    let mut header = MAGIC.to_vec();
    header.extend_from_slice(&first.to_le_bytes());
    header
}

/// Reads a segment's records, which end where the file does or where only zeros follow (the
/// unused part of a segment made from a spare). A torn or damaged tail of the `last` segment is
/// cut off (and the cut synced); anywhere else it is an error. A last segment too short for its
/// header (a crash while it was being created) is deleted: `None`.
fn scan(first: u64, path: PathBuf, last: bool) -> Result<Option<Segment>, StoreError> {
    let bytes = fs::read(&path).map_err(io_err(&path))?;
    let Some(header) = bytes.first_chunk::<{ HEADER_LEN as usize }>() else {
        if last {
            tracing::warn!(path = %path.display(), "removing a raft log segment cut off while it was created");
            fs::remove_file(&path).map_err(io_err(&path))?;
            return Ok(None);
        }
        return Err(corrupt(&path, "shorter than its header"));
    };
    if &header[..8] != MAGIC || header[8..] != first.to_le_bytes() {
        return Err(corrupt(&path, "not a raft log segment for its name"));
    }
    let mut offsets = Vec::new();
    let mut at = HEADER_LEN as usize;
    let mut end = bytes.len();
    let mut file_cut = false;
    while at < end {
        let index = first + offsets.len() as u64;
        match parse_record(&bytes[at..], index) {
            Parsed::Record { len, .. } => {
                offsets.push(at as u64);
                at += len;
            }
            Parsed::Short | Parsed::Damaged(_) if bytes[at..].iter().all(|&b| b == 0) => {
                end = at;
            }
            Parsed::Short | Parsed::Damaged(_) if last => {
                // A write cut short by a crash is the log's last: a whole record of a later
                // index after it means the damage is inside the log, and cutting there would
                // drop entries this node acknowledged.
                if let Some((later, offset)) = record_after(&bytes[at..], index) {
                    return Err(corrupt(
                        &path,
                        format!(
                            "record {index} at byte {at} is damaged, but record {later} follows \
                             at byte {}: the damage is inside the log, not an unfinished write \
                             at its end",
                            at + offset
                        ),
                    ));
                }
                tracing::warn!(
                    path = %path.display(),
                    at,
                    bytes = bytes.len() - at,
                    "cutting off an unfinished write at the end of the raft log"
                );
                keep_cut_tail(&path, at, &bytes[at..])?;
                file_cut = true;
                break;
            }
            Parsed::Short => {
                return Err(corrupt(&path, format!("record {index} is cut short")));
            }
            Parsed::Damaged(why) => {
                return Err(corrupt(
                    &path,
                    format!("record {index} at byte {at}: {why}"),
                ));
            }
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    if file_cut {
        file.set_len(at as u64)
            .and_then(|()| file.sync_data())
            .map_err(io_err(&path))?;
    }
    Ok(Some(Segment {
        first,
        path,
        file: Arc::new(file),
        offsets,
        end: at as u64,
        // Unless the records end in a spare's unused space (a cut tail is gone with the cut).
        grows: end == bytes.len(),
    }))
}

/// The first whole record after a damaged one at the start of `bytes` (which should have held
/// record `index`): its index and offset. Runs only when a segment's last record is damaged, so
/// it may look at every offset (runs of zeros, the unused end of a segment, are skipped).
fn record_after(bytes: &[u8], index: u64) -> Option<(u64, usize)> {
    let mut at = 1;
    while at + RECORD_HEAD + RECORD_TAIL <= bytes.len() {
        if bytes[at] == 0 && bytes[at..].iter().take(4096).all(|&b| b == 0) {
            at += 4096;
            continue;
        }
        let rest = &bytes[at..];
        if let Some(head) = rest.first_chunk::<RECORD_HEAD>() {
            let found = u64::from_le_bytes(head[4..12].try_into().unwrap_or([0; 8]));
            // A later record carries a later index, not too far ahead to have been written.
            let plausible = found > index && found - index <= bytes.len() as u64;
            if plausible {
                if let Parsed::Record { .. } = parse_record(rest, found) {
                    return Some((found, at));
                }
            }
        }
        at += 1;
    }
    None
}

/// Before a torn tail is cut off, its bytes go to `<segment>.cut-<offset>` next to it: should
/// the cut turn out to drop entries after all (the start's checks name them), they are still
/// there to look at.
fn keep_cut_tail(path: &Path, at: usize, tail: &[u8]) -> Result<(), StoreError> {
    let end = tail.len() - tail.iter().rev().take_while(|&&b| b == 0).count();
    if end == 0 {
        return Ok(());
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".cut-{at}"));
    let kept = PathBuf::from(name);
    let mut file = File::create(&kept).map_err(io_err(&kept))?;
    file.write_all(&tail[..end])
        .and_then(|()| file.sync_data())
        .map_err(io_err(&kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(index: u64) -> Vec<u8> {
        format!("entry {index} ")
            .repeat(1 + (index % 7) as usize)
            .into_bytes()
    }

    fn records(range: Range<u64>) -> Vec<(u64, Vec<u8>)> {
        range.map(|i| (i, payload(i))).collect()
    }

    fn read_all(wal: &Wal, from: u64, to: u64) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for stretch in wal.read(from, to)? {
            stretch.records(|i, p| {
                out.push((i, p.to_vec()));
                Ok(())
            })?;
        }
        Ok(out)
    }

    /// Appends runs of `run` entries, one call each, starting at every `run`-th index of
    /// `starts` (the last run may end past it).
    fn append_in_runs(wal: &mut Wal, starts: Range<u64>, run: u64) {
        for start in starts.step_by(run as usize) {
            wal.append(&records(start..start + run)).unwrap();
        }
    }

    fn segment_files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == &SUFFIX[1..]))
            .collect();
        files.sort();
        files
    }

    #[test]
    fn appends_read_back_across_segments_and_after_reopening() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        let mut wal = Wal::open(&dir, None, 512, Preallocate::Spares).unwrap();
        assert_eq!(wal.last(), None);
        append_in_runs(&mut wal, 1..200, 9);
        assert!(wal.segment_count() > 5, "small segments roll over");
        assert_eq!(wal.last(), Some(207));
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(1..208));
        assert_eq!(read_all(&wal, 50, 61).unwrap(), records(50..61));
        drop(wal);

        let wal = Wal::open(&dir, None, 512, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(1..208));
        assert_eq!(read_all(&wal, 300, 400).unwrap(), vec![]);
    }

    #[test]
    fn appends_that_do_not_continue_the_log_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(tmp.path(), None, 4096, Preallocate::Spares).unwrap();
        wal.append(&records(1..5)).unwrap();
        for bad in [
            records(6..8),
            records(3..5),
            vec![(5, vec![1]), (7, vec![2])],
        ] {
            assert!(matches!(wal.append(&bad), Err(StoreError::Corrupt { .. })));
        }
        assert_eq!(read_all(&wal, 0, 100).unwrap(), records(1..5));
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_appends_continue_after_it() {
        let tmp = tempfile::tempdir().unwrap();
        // Segments that grow: the file's length is where the records end.
        let mut wal = Wal::open(tmp.path(), None, 1 << 20, Preallocate::No).unwrap();
        wal.append(&records(1..11)).unwrap();
        drop(wal);
        let file = segment_files(tmp.path()).pop().unwrap();
        let len = fs::metadata(&file).unwrap().len();
        // Half of the last record made it to disk.
        OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let mut wal = Wal::open(tmp.path(), None, 1 << 20, Preallocate::No).unwrap();
        assert_eq!(read_all(&wal, 0, 100).unwrap(), records(1..10));
        wal.append(&records(10..13)).unwrap();
        drop(wal);

        // A last record whose bytes are all there but damaged is cut off the same way.
        let len = fs::metadata(&file).unwrap().len();
        let f = OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(b"X", len - 10).unwrap();
        let wal = Wal::open(tmp.path(), None, 1 << 20, Preallocate::No).unwrap();
        assert_eq!(read_all(&wal, 0, 100).unwrap(), records(1..12));
    }

    /// Damage in the last segment with whole records after it is inside the log (a disk
    /// fault, not a crash): cutting there would drop acknowledged entries, so the open fails
    /// and the file is left as it was.
    #[test]
    fn damage_in_the_last_segment_with_records_after_it_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(tmp.path(), None, 1 << 20, Preallocate::Spares).unwrap();
        append_in_runs(&mut wal, 1..200, 7);
        drop(wal);
        let file = segment_files(tmp.path()).pop().unwrap();
        let before = fs::read(&file).unwrap();
        let f = OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&[0xAB; 64], HEADER_LEN + 2_000).unwrap();
        let err = Wal::open(tmp.path(), None, 1 << 20, Preallocate::Spares)
            .err()
            .expect("damage inside the log is reported");
        let msg = err.to_string();
        assert!(
            matches!(err, StoreError::Corrupt { .. }) && msg.contains("follows"),
            "{msg}"
        );
        assert_eq!(fs::metadata(&file).unwrap().len(), before.len() as u64);

        // Damage to the last record alone is a torn write: cut off, its bytes kept aside.
        f.write_all_at(&before, 0).unwrap();
        let wal = Wal::open(tmp.path(), None, 1 << 20, Preallocate::Spares).unwrap();
        let last = wal.last().unwrap();
        drop(wal);
        let end = fs::read(&file).unwrap();
        let records_end = end.len() - end.iter().rev().take_while(|&&b| b == 0).count();
        f.write_all_at(b"XX", records_end as u64 - 4).unwrap();
        let wal = Wal::open(tmp.path(), None, 1 << 20, Preallocate::Spares).unwrap();
        assert_eq!(wal.last(), Some(last - 1));
        let kept: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".seg.cut-"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
    }

    #[test]
    fn damage_before_the_tail_is_an_error_never_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(tmp.path(), None, 256, Preallocate::Spares).unwrap();
        wal.append(&records(1..40)).unwrap();
        append_in_runs(&mut wal, 40..80, 4);
        drop(wal);
        let files = segment_files(tmp.path());
        assert!(files.len() > 2);
        let f = OpenOptions::new().write(true).open(&files[1]).unwrap();
        f.write_all_at(b"XY", HEADER_LEN + 14).unwrap();
        let err = Wal::open(tmp.path(), None, 256, Preallocate::Spares)
            .err()
            .expect("damage is reported");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");

        // A missing segment in the middle is a gap: reported too.
        let tmp = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(tmp.path(), None, 256, Preallocate::Spares).unwrap();
        append_in_runs(&mut wal, 1..60, 3);
        drop(wal);
        fs::remove_file(&segment_files(tmp.path())[1]).unwrap();
        assert!(matches!(
            Wal::open(tmp.path(), None, 256, Preallocate::Spares),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_truncation_is_kept_and_appends_overwrite_the_cut_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(tmp.path(), None, 300, Preallocate::Spares).unwrap();
        append_in_runs(&mut wal, 1..100, 3);
        let before = segment_files(tmp.path()).len();
        // Inside a segment, then at a segment's first entry.
        wal.truncate(90).unwrap();
        assert_eq!(wal.last(), Some(89));
        let first_of_last = wal.segments.last().unwrap().first;
        wal.truncate(first_of_last).unwrap();
        assert_eq!(wal.last(), Some(first_of_last - 1));
        assert!(segment_files(tmp.path()).len() < before);
        let rewritten: Vec<(u64, Vec<u8>)> = (first_of_last..first_of_last + 5)
            .map(|i| (i, b"term 2".to_vec()))
            .collect();
        wal.append(&rewritten).unwrap();
        drop(wal);

        let wal = Wal::open(tmp.path(), None, 300, Preallocate::Spares).unwrap();
        let mut expected = records(1..first_of_last);
        expected.extend(rewritten);
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), expected);

        // Everything.
        let mut wal = wal;
        wal.truncate(0).unwrap();
        assert_eq!(wal.last(), None);
        assert!(segment_files(tmp.path()).is_empty());
        wal.append(&records(1..3)).unwrap();
        assert_eq!(read_all(&wal, 0, 10).unwrap(), records(1..3));
    }

    #[test]
    fn a_purge_hides_entries_and_frees_whole_segments() {
        let tmp = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(tmp.path(), None, 300, Preallocate::Spares).unwrap();
        append_in_runs(&mut wal, 1..100, 3);
        let files = segment_files(tmp.path()).len();
        let doomed = wal.purge(50);
        assert!(!doomed.is_empty() && doomed.len() < files);
        for path in &doomed {
            fs::remove_file(path).unwrap();
        }
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(51..100));
        assert_eq!(wal.last(), Some(99));
        drop(wal);

        // The marker is the caller's: reopened with it, the same entries show; a segment that
        // only holds purged entries and was not deleted yet is deleted now.
        let mut wal = Wal::open(tmp.path(), Some(50), 300, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(51..100));
        let left = wal.purge(60);
        assert!(!left.is_empty());
        drop(wal);
        let wal = Wal::open(tmp.path(), Some(70), 300, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(71..100));
        assert!(left.iter().all(|path| !path.exists()));
    }

    #[test]
    fn after_a_purge_past_the_end_the_log_starts_over_where_raft_resumes() {
        let tmp = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(tmp.path(), None, 300, Preallocate::Spares).unwrap();
        wal.append(&records(1..20)).unwrap();
        // A snapshot far ahead of this log was installed.
        let doomed = wal.purge(5_000);
        assert_eq!(wal.last(), None);
        // Entries at or below the purge point are never read.
        wal.append(&records(4_000..4_002)).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), vec![]);
        wal.append(&records(5_001..5_004)).unwrap();
        for path in doomed {
            let _ = fs::remove_file(path);
        }
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(5_001..5_004));
        drop(wal);
        let wal = Wal::open(tmp.path(), Some(5_000), 300, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(5_001..5_004));

        // A marker past a log that resumes later than right after it means entries are missing.
        assert!(matches!(
            Wal::open(tmp.path(), Some(4_000), 300, Preallocate::Spares),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_segment_cut_off_while_it_was_created_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(tmp.path(), None, 1 << 20, Preallocate::Spares).unwrap();
        wal.append(&records(1..4)).unwrap();
        drop(wal);
        fs::write(segment_path(tmp.path(), 4), b"FGR").unwrap();
        let mut wal = Wal::open(tmp.path(), None, 1 << 20, Preallocate::Spares).unwrap();
        assert_eq!(segment_files(tmp.path()).len(), 1);
        wal.append(&records(4..6)).unwrap();
        assert_eq!(read_all(&wal, 0, 10).unwrap(), records(1..6));
    }

    fn file_len(path: &Path) -> u64 {
        fs::metadata(path).unwrap().len()
    }

    #[test]
    fn a_segment_made_from_a_spare_ends_where_only_zeros_follow() {
        let tmp = tempfile::tempdir().unwrap();
        let size = 64 << 10;
        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        wal.wait_for_spare();
        wal.append(&records(1..50)).unwrap();
        let file = segment_files(tmp.path()).pop().unwrap();
        assert_eq!(
            file_len(&file),
            size,
            "the segment is the spare, allocated to full size"
        );
        drop(wal);

        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(1..50));
        assert_eq!(file_len(&file), size, "reopening keeps the unused part");
        wal.append(&records(50..60)).unwrap();
        drop(wal);
        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(1..60));

        // An append longer than what is left grows the file; the next segment is a spare again.
        let long: Vec<(u64, Vec<u8>)> = (60..62).map(|i| (i, vec![7u8; 40 << 10])).collect();
        wal.append(&long).unwrap();
        assert!(file_len(&file) > size);
        wal.wait_for_spare();
        wal.append(&records(62..70)).unwrap();
        assert_eq!(segment_files(tmp.path()).len(), 2);
        assert_eq!(file_len(&segment_files(tmp.path())[1]), size);
        drop(wal);
        let wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        let mut expected = records(1..60);
        expected.extend(long);
        expected.extend(records(62..70));
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), expected);
    }

    #[test]
    fn a_segment_that_grows_is_finished_once_a_spare_is_ready() {
        let tmp = tempfile::tempdir().unwrap();
        let size = 64 << 10;
        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        // Nothing is asked for before the first segment holds half its size: it grows.
        wal.append(&records(1..10)).unwrap();
        assert!(wal.spares.as_ref().is_some_and(|s| !s.asked));
        assert!(wal.segments[0].grows);
        let big: Vec<(u64, Vec<u8>)> = (10..12).map(|i| (i, vec![1u8; 20 << 10])).collect();
        wal.append(&big).unwrap();
        assert!(wal.spares.as_ref().is_some_and(|s| s.asked));
        wal.wait_for_spare();
        // Far from full, but made without a spare: the next append starts one.
        wal.append(&records(12..20)).unwrap();
        let files = segment_files(tmp.path());
        assert_eq!(files.len(), 2);
        assert_eq!(file_len(&files[1]), size);
        assert!(!wal.segments[1].grows);
        drop(wal);

        let wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        let mut expected = records(1..10);
        expected.extend(big);
        expected.extend(records(12..20));
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), expected);
        assert!(wal.segments[0].grows && !wal.segments[1].grows);
    }

    #[test]
    fn an_empty_segment_left_by_a_crash_takes_the_next_entries_even_with_a_spare_ready() {
        let tmp = tempfile::tempdir().unwrap();
        let size = 64 << 10;
        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::No).unwrap();
        wal.append(&records(1..5)).unwrap();
        // The crash came after the next segment's header was synced, before its first record.
        fs::write(segment_path(tmp.path(), 5), segment_header(5)).unwrap();
        drop(wal);

        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        assert!(wal.segments[1].grows && wal.segments[1].last().is_none());
        wal.wait_for_spare();
        wal.append(&records(5..9)).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(1..9));
        assert_eq!(segment_files(tmp.path()).len(), 2);
        // The spare is still there for the segment after it.
        assert!(wal.spares.as_ref().is_some_and(|s| s.held.is_some()));
        drop(wal);
        let wal = Wal::open(tmp.path(), None, size, Preallocate::No).unwrap();
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), records(1..9));
    }

    #[test]
    fn a_torn_write_inside_a_spare_is_cut_off() {
        let tmp = tempfile::tempdir().unwrap();
        let size = 64 << 10;
        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        wal.wait_for_spare();
        wal.append(&records(1..11)).unwrap();
        let end = wal.segments[0].end;
        drop(wal);
        // The first half of record 11 landed, zeros after it.
        let mut torn = Vec::new();
        put_record(&mut torn, 11, &payload(11));
        let file = segment_files(tmp.path()).pop().unwrap();
        let f = OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&torn[..torn.len() / 2], end).unwrap();

        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, 100).unwrap(), records(1..11));
        assert_eq!(
            file_len(&file),
            end,
            "the torn bytes are cut off with the rest"
        );
        wal.append(&records(11..14)).unwrap();
        drop(wal);
        let wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, 100).unwrap(), records(1..14));

        // Zeros where a record belongs, then bytes again (a later page of a write landed
        // before an earlier one): damage, not the end of a spare, so cut as well.
        let end = file_len(&file);
        let f = OpenOptions::new().write(true).open(&file).unwrap();
        f.set_len(end + 4096).unwrap();
        f.write_all_at(&torn[torn.len() / 2..], end + 100).unwrap();
        drop(wal);
        let wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        assert_eq!(read_all(&wal, 0, 100).unwrap(), records(1..14));
        assert_eq!(file_len(&file), end);
    }

    #[test]
    fn a_truncation_inside_a_spare_never_brings_cut_entries_back() {
        let tmp = tempfile::tempdir().unwrap();
        let size = 64 << 10;
        let mut wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        wal.wait_for_spare();
        let same_length = |range: Range<u64>, fill: u8| -> Vec<(u64, Vec<u8>)> {
            range.map(|i| (i, vec![fill; 100])).collect()
        };
        wal.append(&same_length(1..20, b'a')).unwrap();
        wal.truncate(10).unwrap();
        // The new entries 10..15 take exactly the bytes of the old ones: had the old 15..20
        // stayed in the file, they would read as the log's continuation.
        wal.append(&same_length(10..15, b'b')).unwrap();
        drop(wal);
        let wal = Wal::open(tmp.path(), None, size, Preallocate::Spares).unwrap();
        let mut expected = same_length(1..10, b'a');
        expected.extend(same_length(10..15, b'b'));
        assert_eq!(read_all(&wal, 0, u64::MAX).unwrap(), expected);
    }

    #[test]
    fn spares_an_earlier_process_left_are_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        let left = tmp.path().join(format!("3{SPARE_SUFFIX}"));
        fs::write(&left, vec![0u8; 1000]).unwrap();
        let mut wal = Wal::open(tmp.path(), None, 4096, Preallocate::No).unwrap();
        assert!(!left.exists());
        wal.append(&records(1..5)).unwrap();
        drop(wal);
        let wal = Wal::open(tmp.path(), None, 4096, Preallocate::No).unwrap();
        assert_eq!(read_all(&wal, 0, 10).unwrap(), records(1..5));
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }
}
