//! The lock state machine as openraft sees it (`RaftStateMachine`), and its snapshots.
//!
//! The machine lives in memory behind a [`SharedMachine`] so the API can read it between
//! applies. It is persisted only as snapshots: an encoded payload of
//! `{last_applied, last_membership, image}` in a snapshot file (see `snapshot_file.rs`),
//! encoded straight from the machine and decoded straight from the file.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockWriteGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::idempotency::{slot, IdemEntry, IdemStore, UnknownPage};
use super::snapshot_file::{Meta, SnapshotFiles, SnapshotReader};
use super::{blocking, encode_into, Db, EffectSink, StoreError};
use crate::machine::{
    Command, Effect, IdemRecord, IdemScope, LockMachine, Response, RestoredImage, SnapshotImage,
};
use crate::raft::{NodeInfo, SnapshotStream, TypeConfig};

type Membership = StoredMembership<u64, NodeInfo>;

/// The in-memory state: the lock machine plus what raft needs to know about it. Both are
/// updated under one lock so a snapshot always pairs an image with the log id it reflects.
struct Applied {
    machine: LockMachine,
    last_applied: Option<LogId<u64>>,
    last_membership: Membership,
}

/// A handle on the applied state, for readers outside raft (API handlers, metrics).
#[derive(Clone)]
pub struct SharedMachine {
    inner: Arc<RwLock<Applied>>,
    idem: IdemStore,
    counts: Arc<CommandCounts>,
}

/// How many commands the machine has applied, and how many the last snapshot built or
/// installed here holds: the node spaces its snapshots by the difference (see
/// `node::snapshots`). Read without the machine's lock.
#[derive(Default)]
struct CommandCounts {
    applied: AtomicU64,
    at_snapshot: AtomicU64,
}

impl SharedMachine {
    /// Runs `f` on the machine under the read lock. Keep `f` short: apply waits for it.
    pub fn read<R>(&self, f: impl FnOnce(&LockMachine) -> R) -> R {
        // A poisoned lock means apply panicked; raft has stopped by then, and reads of the last
        // state are still better than a second panic in an HTTP handler.
        let guard = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        f(&guard.machine)
    }

    /// The earliest time an idempotency record's tombstone window ends (the sweeper ticks
    /// then, so the record is forgotten), or `None` without records.
    pub fn next_idem_purge_ms(&self) -> Option<u64> {
        self.idem.next_purge_ms().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the idempotency purge index");
            None
        })
    }

    /// This node's copy of an idempotency record (as applied here: not a linearizable read).
    pub fn idem_record(&self, scope: &IdemScope) -> Result<Option<IdemRecord>, StoreError> {
        self.idem.get(scope)
    }

    /// Up to `limit` idempotency records that are `unknown` at log time `now_ms`, from the
    /// cursor `after` (as applied here: not a linearizable read). See
    /// [`UnknownPage`](super::idempotency::UnknownPage).
    pub fn idem_unknown(
        &self,
        now_ms: u64,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<UnknownPage, StoreError> {
        self.idem.unknown_page(now_ms, after, limit)
    }

    /// Commands applied since the log began (each command of a batch counts).
    pub fn commands_applied(&self) -> u64 {
        self.counts.applied.load(Ordering::Relaxed)
    }

    /// Commands the last snapshot built or installed on this node holds.
    pub fn commands_at_snapshot(&self) -> u64 {
        self.counts.at_snapshot.load(Ordering::Relaxed)
    }

    /// Index of the last applied log entry (0 before anything was applied).
    pub fn last_applied_index(&self) -> u64 {
        self.last_applied().map_or(0, |id| id.index)
    }

    /// The last applied log id.
    pub fn last_applied(&self) -> Option<LogId<u64>> {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .last_applied
    }

    fn write(&self) -> Result<RwLockWriteGuard<'_, Applied>, StoreError> {
        self.inner.write().map_err(|_| StoreError::Poisoned)
    }
}

/// What a snapshot's payload contains, as a node reads it (written by [`PayloadRef`]).
#[derive(Deserialize)]
pub(super) struct SnapshotPayload {
    last_applied: Option<LogId<u64>>,
    last_membership: Membership,
    image: RestoredImage,
    /// The proxy's idempotency records, as snapshots sent by earlier versions carried them
    /// (read, never written: they now follow the payload in the snapshot file).
    #[serde(default)]
    idempotency: Vec<IdemEntry>,
    #[serde(default)]
    idempotency_index: Option<u64>,
}

/// A [`SnapshotPayload`] serialised straight from the applied state.
#[derive(Serialize)]
struct PayloadRef<'a> {
    last_applied: Option<LogId<u64>>,
    last_membership: &'a Membership,
    image: SnapshotImage,
    idempotency: &'a [IdemEntry],
    idempotency_index: Option<u64>,
}

/// openraft's state machine: applies committed entries to the [`LockMachine`] and manages its
/// snapshots.
pub struct StateMachineStore {
    shared: SharedMachine,
    snapshots: Arc<SnapshotFiles>,
    effects: EffectSink,
    apply_seconds: Option<prometheus::Histogram>,
    idem_forgotten: Option<prometheus::IntCounter>,
}

impl StateMachineStore {
    pub(crate) fn open(
        db: Arc<Db>,
        data_dir: &Path,
        effects: EffectSink,
    ) -> Result<Self, StoreError> {
        let idem = IdemStore::new(db.clone());
        idem.upgrade()?;
        let snapshots = SnapshotFiles::open(data_dir, db)?;
        let applied = match snapshots.open_current()? {
            Some(mut reader) => {
                let mut payload = read_payload(&mut reader)?;
                // The records keyspace is normally at or past the snapshot (its journal is
                // synced before a snapshot becomes current). It is behind one that carries
                // records, or marked as half installed, only if a crash cut an install short:
                // then it is installed again from the snapshot.
                let index = payload.last_applied.map_or(0, |id| id.index);
                let unfinished = idem.install_unfinished()?;
                if unfinished || idem.applied_marker()? < slot(index, 0) {
                    let carried = install_records(&idem, &mut reader, &mut payload)?;
                    if unfinished && !carried {
                        return Err(StoreError::Corrupt {
                            what: "idempotency records",
                            detail: "an interrupted snapshot install left them incomplete, \
                                     and the current snapshot does not carry them"
                                .into(),
                        });
                    }
                }
                Applied::restored(payload.image, payload.last_applied, payload.last_membership)
            }
            None => Applied {
                machine: LockMachine::new(),
                last_applied: None,
                last_membership: Membership::default(),
            },
        };
        // The machine is as of the current snapshot (or empty) until raft replays the log.
        let commands = applied.machine.commands();
        let counts = CommandCounts {
            applied: AtomicU64::new(commands),
            at_snapshot: AtomicU64::new(commands),
        };
        Ok(StateMachineStore {
            shared: SharedMachine {
                inner: Arc::new(RwLock::new(applied)),
                idem,
                counts: Arc::new(counts),
            },
            snapshots: Arc::new(snapshots),
            effects,
            apply_seconds: None,
            idem_forgotten: None,
        })
    }

    /// Records how long each applied batch takes in `histogram`.
    pub fn observe_apply_with(&mut self, histogram: prometheus::Histogram) {
        self.apply_seconds = Some(histogram);
    }

    /// Counts the idempotency records forgotten after their tombstone window in `counter`.
    pub fn observe_idem_forgotten_with(&mut self, counter: prometheus::IntCounter) {
        self.idem_forgotten = Some(counter);
    }

    /// A read handle on the applied state.
    pub fn shared(&self) -> SharedMachine {
        self.shared.clone()
    }

    fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<Vec<Vec<Response>>, StoreError> {
        let mut responses = Vec::new();
        let mut effects: Vec<(u64, Vec<Effect>)> = Vec::new();
        {
            let mut st = self.shared.write()?;
            for entry in entries {
                st.last_applied = Some(entry.log_id);
                let response = match entry.payload {
                    EntryPayload::Blank => Vec::new(),
                    EntryPayload::Membership(m) => {
                        st.last_membership = StoredMembership::new(Some(entry.log_id), m);
                        Vec::new()
                    }
                    EntryPayload::Normal(batch) => {
                        let index = entry.log_id.index;
                        let (mut response, fx) =
                            st.machine.apply_batch(&batch, entry.log_id.leader_id.term);
                        if !fx.is_empty() {
                            effects.push((index, fx));
                        }
                        // Idempotency records are applied at the same log time the machine
                        // just reached, under the same lock, so a snapshot sees both at one
                        // index.
                        let now = st.machine.now_ms();
                        for (pos, cmd) in batch.cmds.iter().enumerate() {
                            let at = slot(index, pos);
                            match cmd {
                                Command::Idem(cmd) => {
                                    if let Some(r) = response.get_mut(pos) {
                                        *r = Response::Idem(self.shared.idem.apply(at, cmd, now)?);
                                    }
                                }
                                Command::Tick { max_items } => {
                                    let n = self.shared.idem.purge(at, now, *max_items)?;
                                    if let Some(c) = &self.idem_forgotten {
                                        c.inc_by(u64::from(n));
                                    }
                                }
                                _ => {}
                            }
                        }
                        response
                    }
                };
                responses.push(response);
            }
            let applied = st.machine.commands();
            self.shared.counts.applied.store(applied, Ordering::Relaxed);
        }
        // Outside the lock: receivers may read the machine.
        for (index, fx) in &effects {
            (self.effects)(*index, fx);
        }
        Ok(responses)
    }
}

impl Applied {
    fn restored(
        image: RestoredImage,
        last_applied: Option<LogId<u64>>,
        last_membership: Membership,
    ) -> Self {
        Applied {
            machine: LockMachine::from_restored(image),
            last_applied,
            last_membership,
        }
    }
}

/// The current snapshot as it goes to a follower: with a consistent copy of the idempotency
/// records, taken under the applied-state lock, so it is exactly the records after the last
/// applied entry (never behind the snapshot, which was built from an earlier or equal state).
/// The records are streamed from a fjall snapshot into the file being sent, never collected
/// in memory.
fn outgoing(
    snapshots: &SnapshotFiles,
    shared: &SharedMachine,
) -> Result<Option<(Meta, SnapshotStream)>, StoreError> {
    let (index, view, marker) = {
        let st = shared.inner.read().map_err(|_| StoreError::Poisoned)?;
        let marker = shared.idem.applied_marker()?;
        (
            st.last_applied.map_or(0, |id| id.index),
            shared.idem.snapshot(),
            marker,
        )
    };
    if marker == 0 {
        // No idempotency command was ever applied here: there are no records at any index,
        // and the snapshot goes out exactly as it was built.
        return snapshots.outgoing(None);
    }
    let mut entries = shared.idem.entries(&view);
    snapshots.outgoing(Some((index, &mut entries)))
}

/// A node's state as a backup takes it: see [`StateMachineStore::backup_source`].
#[derive(Clone)]
pub struct BackupSource {
    snapshots: Arc<SnapshotFiles>,
    shared: SharedMachine,
}

impl BackupSource {
    /// The current snapshot as one self-contained file, with the idempotency records as of the
    /// last applied entry (exactly what a lagging follower would be sent), and the log id it
    /// covers. `None` before the node has any snapshot.
    pub async fn current(
        &self,
    ) -> Result<Option<(Option<LogId<u64>>, SnapshotStream)>, StoreError> {
        let (snapshots, shared) = (self.snapshots.clone(), self.shared.clone());
        let current = blocking(move || outgoing(&snapshots, &shared)).await?;
        Ok(current.map(|(meta, stream)| (meta.last_log_id, stream)))
    }
}

/// A backup file, its state decoded and checked; its idempotency records are still to be
/// read from `reader`.
pub(super) struct BackupImage {
    pub(super) meta: Meta,
    pub(super) machine: LockMachine,
    pub(super) reader: SnapshotReader,
}

/// Opens the backup (a snapshot file) at `path` and decodes its state.
pub(super) fn read_backup(path: &Path) -> Result<BackupImage, StoreError> {
    let mut reader = super::snapshot_file::open_at(path)?;
    let mut payload = read_payload(&mut reader)?;
    if payload.idempotency_index.is_some() {
        return Err(StoreError::Corrupt {
            what: "backup",
            detail: "it carries its idempotency records in a form of earlier versions; \
                     take a new backup"
                .into(),
        });
    }
    let machine = LockMachine::from_restored(std::mem::take(&mut payload.image));
    Ok(BackupImage {
        meta: reader.header.meta.clone(),
        machine,
        reader,
    })
}

impl StateMachineStore {
    /// What a backup of this node's state reads from.
    pub fn backup_source(&self) -> BackupSource {
        BackupSource {
            snapshots: self.snapshots.clone(),
            shared: self.shared.clone(),
        }
    }

    /// Installs the prepared backup at `prepared` (a snapshot file of the restored state) as
    /// a follower installs a snapshot from its leader; returns what it covers.
    pub(super) async fn install_prepared(&mut self, prepared: &Path) -> Result<Meta, StoreError> {
        let meta = super::snapshot_file::open_at(prepared)?.header.meta;
        let (path, file) = self.snapshots.copy_in(prepared)?;
        let stream = Box::new(SnapshotStream::temporary(file, path));
        self.install_snapshot(&meta, stream)
            .await
            .map_err(|e| StoreError::Task(format!("install the restored snapshot: {e}")))?;
        Ok(meta)
    }
}

/// Writes `machine` as the state at `meta`, with `records` as the idempotency records, into the
/// snapshot file `out`: a prepared backup.
pub(super) fn write_prepared(
    out: &Path,
    meta: &Meta,
    machine: &LockMachine,
    records: Option<&mut dyn Iterator<Item = Result<IdemEntry, StoreError>>>,
) -> Result<(), StoreError> {
    let payload = PayloadRef {
        last_applied: meta.last_log_id,
        last_membership: &meta.last_membership,
        image: machine.snapshot_image(),
        idempotency: &[],
        idempotency_index: None,
    };
    super::snapshot_file::write_prepared(
        out,
        meta,
        move |w| encode_into("snapshot", &payload, w),
        records,
    )
}

/// Reads a snapshot's payload and checks it against the snapshot's meta.
fn read_payload(reader: &mut SnapshotReader) -> Result<SnapshotPayload, StoreError> {
    let payload: SnapshotPayload = reader.payload()?;
    check_payload(&reader.header.meta, &payload)?;
    Ok(payload)
}

/// Installs the idempotency records a snapshot carries: after its payload in the file, or
/// inside the payload in snapshots of earlier versions. Returns whether it carried any set.
fn install_records(
    idem: &IdemStore,
    reader: &mut SnapshotReader,
    payload: &mut SnapshotPayload,
) -> Result<bool, StoreError> {
    let index = payload.last_applied.map_or(0, |id| id.index);
    if let Some((at, records)) = reader.records() {
        idem.replace_all(records, at.max(index))?;
    } else if let Some(at) = payload.idempotency_index {
        let inline = std::mem::take(&mut payload.idempotency);
        idem.replace_all(inline.into_iter().map(Ok), at.max(index))?;
    } else {
        return Ok(false);
    }
    Ok(true)
}

/// The snapshot's own record of what it contains must agree with its meta.
fn check_payload(meta: &Meta, payload: &SnapshotPayload) -> Result<(), StoreError> {
    if payload.last_applied != meta.last_log_id || payload.last_membership != meta.last_membership {
        return Err(StoreError::Corrupt {
            what: "snapshot",
            detail: format!(
                "payload covers {:?}, meta says {:?}",
                payload.last_applied, meta.last_log_id
            ),
        });
    }
    Ok(())
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, Membership), StorageError<u64>> {
        let st = self
            .shared
            .inner
            .read()
            .map_err(|_| StoreError::Poisoned.into_raft(StorageIOError::read_state_machine))?;
        Ok((st.last_applied, st.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Response>>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = std::time::Instant::now();
        let applied = self
            .apply_entries(entries)
            .map_err(|e| e.into_raft(StorageIOError::write_state_machine));
        if let Some(h) = &self.apply_seconds {
            h.observe(started.elapsed().as_secs_f64());
        }
        applied
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
            snapshots: self.snapshots.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotStream>, StorageError<u64>> {
        self.snapshots
            .receiving()
            .map(Box::new)
            .map_err(|e| e.into_raft(|err| StorageIOError::write_snapshot(None, err)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        mut snapshot: Box<SnapshotStream>,
    ) -> Result<(), StorageError<u64>> {
        let failed = |e: StoreError| {
            e.into_raft(|err| StorageIOError::write_snapshot(Some(meta.signature()), err))
        };
        let path = match snapshot.keep() {
            Some(path) => path,
            // Not a transfer into a file of ours (openraft's API also lets a caller hand over
            // a snapshot it has): copy it into one.
            None => {
                let mut received = self.snapshots.receiving().map_err(failed)?;
                let copied = tokio::io::copy(&mut *snapshot, &mut received).await;
                let flushed = match copied {
                    Ok(_) => tokio::io::AsyncWriteExt::shutdown(&mut received).await,
                    Err(e) => Err(e),
                };
                flushed.map_err(|e| failed(StoreError::Task(format!("copy snapshot: {e}"))))?;
                received
                    .keep()
                    .ok_or_else(|| failed(StoreError::Task("no snapshot file".into())))?
            }
        };
        drop(snapshot);
        let meta = meta.clone();
        let snapshots = self.snapshots.clone();
        let shared = self.shared.clone();
        let install = blocking(move || {
            let started = std::time::Instant::now();
            // On disk first (checked, synced, current): once the machine is replaced, raft may
            // purge the log it replaces. If a crash follows, `open` finds this snapshot and
            // redoes the records install if it was cut short. The machine is decoded and
            // rebuilt while the file syncs, outside the lock: API reads go on meanwhile.
            let (mut reader, (mut payload, restored, decode, rebuild)) = snapshots
                .install_received(&path, &meta, |reader| {
                    let mut payload = read_payload(reader)?;
                    let decode = started.elapsed();
                    let image = std::mem::take(&mut payload.image);
                    let restored = Applied::restored(
                        image,
                        payload.last_applied,
                        payload.last_membership.clone(),
                    );
                    Ok((payload, restored, decode, started.elapsed() - decode))
                })?;
            let index = payload.last_applied.map_or(0, |id| id.index);
            // Decoded, rebuilt, synced and current (the sync ran beside the first two: when
            // `prepared` is well above their sum, the disk was the slower part).
            let prepared = started.elapsed();
            let mut st = shared.write()?;
            if !install_records(&shared.idem, &mut reader, &mut payload)? {
                // The sender had no records: none exist as of the snapshot.
                shared.idem.replace_all(std::iter::empty(), index)?;
            }
            let commands = restored.machine.commands();
            let stats = restored.machine.stats();
            let replaced = std::mem::replace(&mut *st, restored);
            drop(st);
            // Freeing the machine it replaces takes a while at scale: not under the lock.
            drop(replaced);
            shared.counts.applied.store(commands, Ordering::Relaxed);
            shared.counts.at_snapshot.store(commands, Ordering::Relaxed);
            tracing::info!(
                index,
                resources = stats.resources,
                active_locks = stats.active_locks,
                dedup_records = stats.dedup_records,
                decode_ms = decode.as_millis() as u64,
                rebuild_ms = rebuild.as_millis() as u64,
                prepared_ms = prepared.as_millis() as u64,
                total_ms = started.elapsed().as_millis() as u64,
                "installed a snapshot from the leader"
            );
            Ok(())
        });
        install.await.map_err(failed)
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let snapshots = self.snapshots.clone();
        let shared = self.shared.clone();
        let current = blocking(move || outgoing(&snapshots, &shared))
            .await
            .map_err(|e| e.into_raft(|err| StorageIOError::read_snapshot(None, err)))?;
        Ok(current.map(|(meta, stream)| Snapshot {
            meta,
            snapshot: Box::new(stream),
        }))
    }
}

/// Builds snapshots of the current state, concurrently with apply.
pub struct SnapshotBuilder {
    shared: SharedMachine,
    snapshots: Arc<SnapshotFiles>,
}

impl SnapshotBuilder {
    fn build(&self) -> Result<(Meta, std::fs::File), StoreError> {
        // Take the image under the read lock (O(1): the machine's collections are persistent)
        // and encode it outside, straight into the file, so apply is never blocked by a
        // snapshot and no second copy of the state is built in memory.
        let (last_applied, last_membership, image) = {
            let st = self.shared.inner.read().map_err(|_| StoreError::Poisoned)?;
            (
                st.last_applied,
                st.last_membership.clone(),
                st.machine.snapshot_image(),
            )
        };
        let commands = image.commands();
        let seq = self.snapshots.next_seq();
        let (term, index) = last_applied.map_or((0, 0), |id| (id.leader_id.term, id.index));
        let meta = Meta {
            last_log_id: last_applied,
            last_membership: last_membership.clone(),
            snapshot_id: format!("{term}-{index}-{seq}"),
        };
        let payload = PayloadRef {
            last_applied,
            last_membership: &last_membership,
            image,
            idempotency: &[],
            idempotency_index: None,
        };
        // The image goes as soon as it is written, before the file is synced and made current.
        let (_, file) = self.snapshots.persist_built(&meta, seq, move |out| {
            encode_into("snapshot", &payload, out)
        })?;
        self.shared
            .counts
            .at_snapshot
            .fetch_max(commands, Ordering::Relaxed);
        Ok((meta, file))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let builder = SnapshotBuilder {
            shared: self.shared.clone(),
            snapshots: self.snapshots.clone(),
        };
        let (meta, file) = in_background(move || builder.build())
            .await
            .map_err(|e| e.into_raft(|err| StorageIOError::write_snapshot(None, err)))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(SnapshotStream::durable(file)),
        })
    }
}

/// Runs `f` on a thread of its own at the lowest CPU priority. Building a snapshot (imaging,
/// encoding and writing tens of MB) is background work without a deadline, but on a small
/// machine it competes for the same cores as apply, raft and the API: at normal priority each
/// snapshot showed as a burst of slow commits. A thread of its own, because an unprivileged
/// process cannot raise a thread's priority back, so a pooled thread would stay lowered.
async fn in_background<T, F>(f: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("snapshot-build".into())
        .spawn(move || {
            lower_this_threads_priority();
            // The receiver is gone only if raft stopped waiting; nothing to report then.
            let _ = tx.send(f());
        })
        .map_err(|e| StoreError::Task(format!("cannot start the snapshot thread: {e}")))?;
    rx.await
        .map_err(|_| StoreError::Task("the snapshot thread ended without a result".into()))?
}

#[cfg(target_os = "linux")]
fn lower_this_threads_priority() {
    // On Linux a nice value set with PRIO_PROCESS and a thread id applies to that thread only.
    // SAFETY: plain syscalls on the calling thread's own id; no memory is shared.
    let failed = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19) != 0
    };
    if failed {
        tracing::debug!("could not lower the snapshot thread's priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_this_threads_priority() {}
