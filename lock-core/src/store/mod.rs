//! Durable storage for the raft group: the log's entries in segment files of their own
//! (`raft-log/`, see `wal.rs`), the snapshot file in `snapshots/`, and everything else in one
//! fjall [`Database`]:
//!
//! | keyspace   | key                          | value                                   |
//! |------------|------------------------------|-----------------------------------------|
//! | `meta`     | `vote`, `committed`, `purged`| the encoded `Vote` / `LogId`            |
//! | `idempotency` | record, purge index, applied marker | see `idempotency.rs`      |
//! | `log`      | log index, 8 bytes big-endian| only in data dirs of earlier versions, moved to `raft-log/` at open |
//! | `snapshot` | `header`, `chunk/<u32 BE>`   | only in data dirs of earlier versions   |
//!
//! Durability: every write openraft must be able to rely on is synced before openraft hears it
//! is done: log appends with `sync_data` on their `raft-log/` segment file, the vote, the purge
//! marker and a snapshot's records with fjall's [`PersistMode::SyncAll`]. The lock
//! state machine itself lives in memory and is persisted only through snapshots; after a
//! restart openraft re-applies the committed log entries that follow the snapshot, which is why
//! the committed log id is stored too (unsynced: a lost one only means fewer entries are
//! re-applied before the leader says how far the log is committed).
//!
//! Syncs can block for milliseconds, so they run on a thread of the log store's own or on
//! tokio's blocking pool rather than on the async worker that drives raft.
//!
//! Errors: any fjall or decoding failure is reported to openraft as a `StorageError`, which stops
//! the raft node. That is deliberate: after a failed write the on-disk state is unknown, and a
//! node that limps on could vote or acknowledge twice.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod backup;
mod idempotency;
mod log_store;
mod log_tail;
mod snapshot_file;
mod state_machine;
mod wal;

use std::path::Path;
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions};
use openraft::{AnyError, StorageError, StorageIOError};

pub use idempotency::UnknownPage;
pub use log_store::LogStore;
pub use state_machine::{BackupSource, SharedMachine, SnapshotBuilder, StateMachineStore};

use crate::machine::Effect;

/// Receives the effects of each applied log entry (the `u64` is the entry's log index), after the
/// state-machine lock has been released. Called on every replica, and again for entries that are
/// re-applied after a restart, so receivers must tolerate effects nobody waits for.
pub type EffectSink = Arc<dyn Fn(u64, &[Effect]) + Send + Sync>;

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The storage engine failed; the on-disk state may be unknown.
    #[error("fjall storage error: {0}")]
    Fjall(#[from] fjall::Error),
    /// Bytes read from disk (or received as a snapshot) do not decode.
    #[error("cannot decode {what}: {detail}")]
    Decode { what: &'static str, detail: String },
    /// A value could not be encoded for writing.
    #[error("cannot encode {what}: {detail}")]
    Encode { what: &'static str, detail: String },
    /// A snapshot file could not be written or read.
    #[error("snapshot file {path}: {source}")]
    SnapshotFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file mirroring the raft vote could not be written or read.
    #[error("raft vote file {path}: {source}")]
    VoteFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A raft log segment file could not be written or read.
    #[error("raft log file {path}: {source}")]
    LogFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Data that decodes but contradicts itself (e.g. a log entry stored under another index).
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    /// A sound file that cannot be used for what was asked (a backup restored onto a node it
    /// was not prepared for, say).
    #[error("cannot use this {what}: {detail}")]
    Refused { what: &'static str, detail: String },
    /// A blocking storage task panicked or was cancelled.
    #[error("storage task failed: {0}")]
    Task(String),
    /// The in-memory state machine lock was poisoned by a panic during apply.
    #[error("state machine lock poisoned by an earlier panic")]
    Poisoned,
}

impl StoreError {
    /// Converts into openraft's error, naming what was being done (`make` is one of the
    /// `StorageIOError` constructors such as `StorageIOError::write_logs`).
    fn into_raft(self, make: impl FnOnce(AnyError) -> StorageIOError<u64>) -> StorageError<u64> {
        StorageError::from(make(AnyError::new(&self)))
    }
}

/// The database and its keyspaces, shared by the log store and the state machine store.
pub(crate) struct Db {
    pub(crate) db: Database,
    pub(crate) log: Keyspace,
    pub(crate) meta: Keyspace,
    pub(crate) snapshot: Keyspace,
    /// The fencing proxy's idempotency records (on disk, not in the in-memory machine).
    pub(crate) idem: Keyspace,
}

const LOG_KEYSPACE: &str = "log";
const META_KEYSPACE: &str = "meta";
const SNAPSHOT_KEYSPACE: &str = "snapshot";
const IDEM_KEYSPACE: &str = "idempotency";
/// Block cache of the node's database (see `Db::open`).
const BLOCK_CACHE_BYTES: u64 = 8 << 20;
/// Most disk fjall's journals (`*.jnl` in the data directory) may hold before fjall flushes the
/// memtables that keep the oldest one alive. A journal is rotated at 64 MB, and one can be
/// deleted only once every keyspace has flushed what it wrote there: idempotency records
/// trickling into their 64 MiB memtable kept every journal alive, up to fjall's default bound
/// of 512 MiB, while the raft metadata's writes went on. The smallest bound fjall accepts that
/// leaves room for one full journal besides the current one.
const MAX_JOURNAL_BYTES: u64 = 128 << 20;
/// Memtable size of the idempotency keyspace.
const IDEM_MEMTABLE_BYTES: u64 = 64 << 20;

/// Opens (or creates) the node's storage in `dir` and returns the two halves openraft needs.
///
/// If a snapshot was persisted, the state machine is restored from it; openraft then re-applies
/// the committed log entries after it when the raft node starts.
pub fn open(dir: &Path, effects: EffectSink) -> Result<(LogStore, StateMachineStore), StoreError> {
    let db = Arc::new(Db::open(dir)?);
    let log_store = LogStore::open(db.clone(), dir)?;
    let sm_store = StateMachineStore::open(db, dir, effects)?;
    // A directory that kept its snapshot but lost its log and database would otherwise start
    // as a voter with no vote and the snapshot's state.
    log_store.vote_not_behind(&[sm_store.shared().last_applied()])?;
    Ok((log_store, sm_store))
}

impl Db {
    fn open(dir: &Path) -> Result<Self, StoreError> {
        // The block cache holds blocks read back from disk. Little is: the machine lives in
        // memory, replication reads recent entries from the memtable, and what a purge scans
        // or a lagging follower reads once gains nothing from staying cached (the OS page
        // cache has it too). A heap profile found fjall's default 32 MiB full of such blocks.
        let db = Database::builder(dir)
            .cache_size(BLOCK_CACHE_BYTES)
            .max_journaling_size(MAX_JOURNAL_BYTES)
            .open()?;
        // Earlier versions kept the raft log here; it is moved into segment files when the
        // node opens (see `log_store.rs`), and stays empty afterwards.
        let log = db.keyspace(LOG_KEYSPACE, KeyspaceCreateOptions::default)?;
        let meta = db.keyspace(META_KEYSPACE, KeyspaceCreateOptions::default)?;
        // Earlier versions kept snapshots here as large chunks (key-value separated so
        // compaction did not rewrite them); it is read until the first snapshot file replaces it.
        let snapshot = db.keyspace(SNAPSHOT_KEYSPACE, || {
            KeyspaceCreateOptions::default()
                .with_kv_separation(Some(KvSeparationOptions::default()))
        })?;
        let idem = db.keyspace(IDEM_KEYSPACE, || {
            KeyspaceCreateOptions::default().max_memtable_size(IDEM_MEMTABLE_BYTES)
        })?;
        Ok(Db {
            db,
            log,
            meta,
            snapshot,
            idem,
        })
    }
}

/// Runs blocking fjall work off the async worker threads.
async fn blocking<T, F>(f: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
}

/// The first byte of every value this version writes: MessagePack with field names follows.
/// Values written by earlier versions are JSON, which never starts with this byte, so both
/// decode and existing data directories keep working without a migration.
const FORMAT_MSGPACK: u8 = 1;

/// The first byte of a log entry that compresses: the uncompressed length (u32, little endian)
/// and an lz4 block of the [`FORMAT_MSGPACK`] encoding follow.
const FORMAT_MSGPACK_LZ4: u8 = 2;

/// lz4 never expands data by more than this factor, so a larger announced length is damage.
const LZ4_MAX_RATIO: usize = 255;

/// Encodes a log entry: like [`encode`], lz4-compressed when that is smaller. A batch of
/// commands repeats its field names and resource prefixes, so entries at load compress about
/// 2:1; the log's memtable, journal writes, fsyncs and flushes shrink with them.
fn encode_compressed<T: serde::Serialize>(
    what: &'static str,
    value: &T,
) -> Result<Vec<u8>, StoreError> {
    let plain = encode(what, value)?;
    let packed = lz4_flex::block::compress_prepend_size(&plain[1..]);
    if packed.len() + 1 >= plain.len() {
        return Ok(plain);
    }
    let mut out = Vec::with_capacity(packed.len() + 1);
    out.push(FORMAT_MSGPACK_LZ4);
    out.extend_from_slice(&packed);
    Ok(out)
}

/// Encodes a stored value: a format byte, then named MessagePack (field names keep
/// `#[serde(default)]` additions readable both ways). About half the size of JSON and several
/// times cheaper to produce and parse for log entries and snapshots.
fn encode<T: serde::Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    let mut out = vec![FORMAT_MSGPACK];
    rmp_serde::encode::write_named(&mut out, value).map_err(|e| StoreError::Encode {
        what,
        detail: e.to_string(),
    })?;
    Ok(out)
}

/// [`encode`] into a writer, for values too large to hold encoded in memory (snapshots).
fn encode_into<T: serde::Serialize, W: std::io::Write + ?Sized>(
    what: &'static str,
    value: &T,
    out: &mut W,
) -> Result<(), StoreError> {
    let failed = |detail: String| StoreError::Encode { what, detail };
    out.write_all(&[FORMAT_MSGPACK])
        .map_err(|e| failed(e.to_string()))?;
    rmp_serde::encode::write_named(out, value).map_err(|e| failed(with_causes(&e)))
}

/// An error's message followed by those of its causes: an encoder's "error while writing a
/// value" alone hides that the disk was full.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        cause = c.source();
    }
    text
}

/// [`decode`] for a value that must use up exactly the next `len` bytes of `input` (a
/// snapshot's payload, decoded as it is read from its file): fewer or more is an error. About
/// half the speed of decoding from memory (a call per field), without a copy of the encoding
/// in memory next to what it decodes into.
fn decode_read<T: serde::de::DeserializeOwned>(
    what: &'static str,
    input: impl std::io::Read,
    len: u64,
) -> Result<T, StoreError> {
    use std::io::Read;
    let failed = |detail: String| StoreError::Decode { what, detail };
    let mut input = input.take(len);
    let mut format = [0u8; 1];
    input
        .read_exact(&mut format)
        .map_err(|e| failed(format!("empty: {e}")))?;
    let value = if format[0] == FORMAT_MSGPACK {
        let mut de = rmp_serde::Deserializer::new(&mut input);
        T::deserialize(&mut de).map_err(|e| failed(e.to_string()))?
    } else {
        // Earlier versions wrote JSON, whose first byte is part of the value.
        serde_json::from_reader(std::io::Cursor::new(format).chain(&mut input))
            .map_err(|e| failed(e.to_string()))?
    };
    match input.limit() {
        0 => Ok(value),
        extra => Err(failed(format!("{extra} bytes after the value"))),
    }
}

/// Decodes a value written by [`encode`], or the JSON of earlier versions.
fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    let decoded = match bytes.split_first() {
        Some((&FORMAT_MSGPACK, rest)) => rmp_serde::from_slice(rest).map_err(|e| e.to_string()),
        Some((&FORMAT_MSGPACK_LZ4, rest)) => decompress(rest)
            .and_then(|plain| rmp_serde::from_slice(&plain).map_err(|e| e.to_string())),
        _ => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
    };
    decoded.map_err(|detail| StoreError::Decode { what, detail })
}

/// The MessagePack inside a [`FORMAT_MSGPACK_LZ4`] value. The announced length is checked
/// against what the compressed bytes could hold before anything is allocated for it.
fn decompress(packed: &[u8]) -> Result<Vec<u8>, String> {
    let Some(len) = packed
        .first_chunk::<4>()
        .map(|b| u32::from_le_bytes(*b) as usize)
    else {
        return Err("compressed value shorter than its length".into());
    };
    if len > (packed.len() - 4).saturating_mul(LZ4_MAX_RATIO) {
        return Err(format!(
            "compressed value announces {len} bytes from {} (damaged)",
            packed.len()
        ));
    }
    lz4_flex::block::decompress(&packed[4..], len).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Raft's metadata written on and on while idempotency records trickle in (each journal
    /// then holds some of them, unflushed): the journals stay under the bound instead of
    /// growing to fjall's default 512 MiB. Writes ~850 MB.
    ///
    /// Flushing and deleting the oldest journal run in fjall's background workers, which a busy
    /// machine holds back, so the journals may pass the bound for a while. Whenever they are past
    /// it (and the journal being written), the writes pause until they come back under: with the
    /// bound working they do, at any speed; without it nothing flushes the keyspace that holds
    /// the old journals, and they stay past it.
    #[test]
    fn journals_stay_bounded_while_a_keyspace_holds_old_ones() {
        const SETTLE: Duration = Duration::from_secs(60);
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = Db::open(tmp.path()).expect("open");
        let journals = || db.db.journal_disk_space().expect("journal size");
        let allowed = MAX_JOURNAL_BYTES + (64 << 20);
        let value = vec![7u8; 1_000];
        let mut pauses = 0;
        for i in 0..850_000u64 {
            if i % 1_000 == 0 {
                db.idem.insert(i.to_be_bytes(), b"record").expect("idem");
                if journals() > allowed {
                    pauses += 1;
                    let since = Instant::now();
                    while journals() > allowed {
                        assert!(
                            since.elapsed() < SETTLE,
                            "journals stayed at {} bytes (bound {allowed}) for {SETTLE:?} \
                             after {i} writes",
                            journals()
                        );
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
            db.meta.insert(b"probe", &value[..]).expect("meta");
        }
        eprintln!("paused {pauses} times for fjall's background flush");
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Value {
        index: u64,
        name: String,
        #[serde(default)]
        added_later: Option<u64>,
    }

    /// A writer on a full disk: the first byte fits, nothing after it.
    struct Full(usize);

    impl std::io::Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.0 -= 1;
            Ok(buf.len().min(1))
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_encoding_cut_short_by_a_full_disk_says_so() {
        let v = Value {
            index: 7,
            name: "x".repeat(100),
            added_later: None,
        };
        let err = encode_into("snapshot", &v, &mut Full(1)).expect_err("the disk is full");
        let said = err.to_string();
        assert!(
            said.contains("snapshot") && said.contains("No space left on device"),
            "{said}"
        );
    }

    #[test]
    fn values_round_trip_and_json_of_earlier_versions_still_decodes() {
        let v = Value {
            index: 7,
            name: "kv:a".into(),
            added_later: Some(3),
        };
        let bytes = encode("value", &v).unwrap();
        assert_eq!(bytes[0], FORMAT_MSGPACK);
        assert_eq!(decode::<Value>("value", &bytes).unwrap(), v);

        let json = br#"{"index":7,"name":"kv:a"}"#;
        let old: Value = decode("value", json).unwrap();
        assert_eq!(old.added_later, None);
        assert_eq!(old.name, "kv:a");

        assert!(matches!(
            decode::<Value>("value", &[FORMAT_MSGPACK, 0xc1]),
            Err(StoreError::Decode { what: "value", .. })
        ));

        // A value that compresses is stored compressed and reads back; one that does not is
        // stored plain.
        let long = Value {
            name: "kv:".repeat(200),
            ..v
        };
        let packed = encode_compressed("value", &long).unwrap();
        assert_eq!(packed[0], FORMAT_MSGPACK_LZ4);
        assert!(packed.len() < encode("value", &long).unwrap().len() / 4);
        assert_eq!(decode::<Value>("value", &packed).unwrap(), long);
        assert_eq!(encode_compressed("value", &v).unwrap(), bytes);
        // A damaged length is refused before anything is allocated for it.
        let mut lying = packed.clone();
        lying[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode::<Value>("value", &lying),
            Err(StoreError::Decode { what: "value", .. })
        ));

        // The streaming forms agree with the in-memory ones, both ways.
        let mut streamed = Vec::new();
        encode_into("value", &v, &mut streamed).unwrap();
        assert_eq!(streamed, bytes);
        let read = |b: &[u8]| decode_read::<Value>("value", b, b.len() as u64);
        assert_eq!(read(&bytes).unwrap(), v);
        assert_eq!(read(json).unwrap(), old);
        assert!(read(&[]).is_err());
        // A value must fill its bytes: anything after it is damage, and so is a value cut
        // short; what follows the value's bytes in the input is left alone.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            read(&longer),
            Err(StoreError::Decode { what: "value", .. })
        ));
        assert!(read(&bytes[..bytes.len() - 1]).is_err());
        let mut rest: &[u8] = &longer;
        assert_eq!(
            decode_read::<Value>("value", &mut rest, bytes.len() as u64).unwrap(),
            v
        );
        assert_eq!(rest, &[0]);
    }
}

/// What the store reads back from disk — log entries, the vote, snapshots, idempotency
/// records — decodes or fails with a `StoreError`, whatever the bytes (a damaged or foreign
/// file must stop the node with a clear error, never panic it).
#[cfg(test)]
mod fuzz {
    use openraft::Entry;
    use proptest::prelude::*;

    use super::*;
    use crate::machine::{Batch, Command, IdemRecord};
    use crate::raft::TypeConfig;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testkit::fuzz_cases(1_000)))]

        #[test]
        fn random_bytes_decode_or_fail(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Entry<TypeConfig>>("log entry", &bytes);
            let packed: Vec<u8> = std::iter::once(FORMAT_MSGPACK_LZ4).chain(bytes.iter().copied()).collect();
            let _ = decode::<Entry<TypeConfig>>("log entry", &packed);
            let _ = decode::<openraft::Vote<u64>>("vote", &bytes);
            let _ = decode::<IdemRecord>("idempotency record", &bytes);
            let _ = decode::<state_machine::SnapshotPayload>("snapshot", &bytes);
        }

        /// A stored log entry, damaged byte by byte.
        #[test]
        fn damaged_log_entries_decode_or_fail(cut in 0usize..64, flip in 0usize..4096, to in any::<u8>()) {
            let entry = Entry::<TypeConfig> {
                log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(2, 1), 7),
                payload: openraft::EntryPayload::Normal(Batch::new(
                    1_700_000_000_000,
                    1_000,
                    vec![Command::Tick { max_items: 3 }; 20],
                )),
            };
            let mut bytes = encode_compressed("log entry", &entry).expect("encode");
            prop_assert_eq!(bytes[0], FORMAT_MSGPACK_LZ4);
            let at = flip % bytes.len();
            bytes[at] = to;
            bytes.truncate(bytes.len().saturating_sub(cut));
            if let Ok(back) = decode::<Entry<TypeConfig>>("log entry", &bytes) {
                // Whatever decodes is a well-formed entry that encodes again.
                prop_assert!(encode("log entry", &back).is_ok());
            }
        }
    }
}
