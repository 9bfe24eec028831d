//! Snapshots: the machine as a plain image, and back (rebuilding the derived indexes).

use std::cell::RefCell;
use std::collections::HashSet;

use imbl::OrdMap;
use serde::ser::{Error as _, SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use super::dedup::DedupTable;
use super::keys::ApiKeyRecord;
use super::lock_machine::{count_up, LockMachine};
use super::name::ResName;
use super::quota::QuotaLedger;
use super::state::{
    dedup_key, DedupEntry, ImageDedup, MachineImage, ResourceState, RestoredImage,
    DEFAULT_IDLE_RETAIN_MS,
};

/// What a snapshot is written from: the parts of the machine its [`MachineImage`] holds,
/// taken in O(1) (the collections are persistent and share their nodes with the live
/// machine), without the derived indexes, which a restore rebuilds.
///
/// While the image shares a node with the machine, apply must copy that node before it changes
/// it. A snapshot of the seed state is written over a few seconds, and an image that held the
/// whole machine for that long made apply copy most of the resource map and every index once
/// per snapshot: tens of megabytes a node allocated and freed every few seconds, which the
/// allocator then kept. So this image holds no index at all, and writes the resources from a
/// consuming iterator that lets go of each node of the map as soon as its records are written;
/// apply changes such a node in place. (The dedup table's frozen chunks are immutable and
/// shared whole; apply never copies them.)
///
/// Serialised exactly as its `MachineImage` would be, straight from the collections: no second
/// copy of the state is built in memory. Decode it as a `MachineImage`. It can be serialised
/// once; a second attempt is an error.
pub struct SnapshotImage {
    now_ms: u64,
    term: u64,
    last_token: u64,
    gc_floor: u64,
    commands: u64,
    resources: RefCell<Option<OrdMap<ResName, ResourceState>>>,
    dedup: DedupTable,
    quotas: QuotaLedger,
    keys: OrdMap<String, ApiKeyRecord>,
}

impl SnapshotImage {
    /// Commands applied up to the state this image shows.
    pub fn commands(&self) -> u64 {
        self.commands
    }
}

impl Serialize for SnapshotImage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Field names, order and count as `MachineImage` derives them; `dedup` (read from
        // images of earlier versions only) is skipped there too when empty, as it always is.
        let mut image = serializer.serialize_struct("MachineImage", 9)?;
        image.serialize_field("now_ms", &self.now_ms)?;
        image.serialize_field("term", &self.term)?;
        image.serialize_field("last_token", &self.last_token)?;
        image.serialize_field("gc_floor", &self.gc_floor)?;
        image.serialize_field("resources", &Consumed(&self.resources))?;
        image.serialize_field(
            "dedup_records",
            &Seq(self.dedup.len(), || {
                self.dedup
                    .iter()
                    .map(|(key, rec)| DedupEntry::of(key, &rec))
            }),
        )?;
        image.skip_field("dedup")?;
        image.serialize_field("quotas", &self.quotas)?;
        image.serialize_field("keys", &Seq(self.keys.len(), || self.keys.values()))?;
        image.serialize_field("commands", &self.commands)?;
        image.end()
    }
}

/// A map serialised as a sequence of its entries, taken out of its cell and consumed as it is
/// written (see [`SnapshotImage`]).
struct Consumed<'a>(&'a RefCell<Option<OrdMap<ResName, ResourceState>>>);

impl Serialize for Consumed<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let map = self
            .0
            .borrow_mut()
            .take()
            .ok_or_else(|| S::Error::custom("a snapshot image can be written only once"))?;
        let mut seq = serializer.serialize_seq(Some(map.len()))?;
        for entry in map {
            seq.serialize_element(&entry)?;
        }
        seq.end()
    }
}

/// A sequence of `len` items produced by an iterator, serialised like a `Vec` of them.
struct Seq<F>(usize, F);

impl<F, I> Serialize for Seq<F>
where
    F: Fn() -> I,
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0))?;
        for item in (self.1)() {
            seq.serialize_element(&item)?;
        }
        seq.end()
    }
}

impl LockMachine {
    /// The image a snapshot is written from (see [`SnapshotImage`]).
    pub fn snapshot_image(&self) -> SnapshotImage {
        SnapshotImage {
            now_ms: self.now_ms,
            term: self.term,
            last_token: self.last_token,
            gc_floor: self.gc_floor,
            commands: self.commands,
            resources: RefCell::new(Some(self.resources.clone())),
            dedup: self.dedup.clone(),
            quotas: self.quotas.clone(),
            keys: self.keys.clone(),
        }
    }

    pub fn image(&self) -> MachineImage {
        // In (expiry, key) order, so every replica writes byte-identical snapshots.
        let dedup_records: Vec<_> = self
            .dedup
            .iter()
            .map(|(key, rec)| DedupEntry::of(key, &rec))
            .collect();
        MachineImage {
            now_ms: self.now_ms,
            term: self.term,
            last_token: self.last_token,
            gc_floor: self.gc_floor,
            resources: self
                .resources
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            dedup_records,
            dedup: Vec::new(),
            quotas: self.quotas.clone(),
            keys: self.keys.values().cloned().collect(),
            commands: self.commands,
        }
    }

    /// This state as a cluster restored from a backup must start from, given `token_floor`, a
    /// token above every one the lost cluster can have issued after the backup.
    ///
    /// The lost cluster may have ended any lease of the backup and granted a newer token since,
    /// which the restored state cannot know. So every lease is ended and every token up to the
    /// floor is stale for every resource (a proxy refuses it, a renew answers lease lost), the
    /// token counter starts at the floor, and the waiters are dropped with their request ids
    /// (their callers' long polls ended with the lost cluster). Request ids of granted acquires
    /// are kept: a retry gets its original, ended, lease, as after any release.
    pub fn restored_after_loss(&self, token_floor: u64) -> Self {
        let mut image = self.image();
        image.last_token = image.last_token.max(token_floor);
        image.gc_floor = image.gc_floor.max(token_floor);
        let idle_until = image.now_ms.saturating_add(DEFAULT_IDLE_RETAIN_MS);
        let mut dropped = HashSet::new();
        for (name, res) in &mut image.resources {
            res.lease = None;
            while let Some(w) = res.waiters.pop_front() {
                dropped.insert(dedup_key(name, &w.request_id));
            }
            res.admitted = res.admitted.max(token_floor);
            res.grants = Default::default();
            res.reissue_at_ms = None;
            res.idle_until_ms.get_or_insert(idle_until);
        }
        image.dedup_records.retain(|e| !dropped.contains(&e.0));
        Self::from_image(image)
    }

    /// The machine an image describes, its indexes rebuilt.
    pub fn from_image(image: MachineImage) -> Self {
        Self::from_parts(image)
    }

    /// The machine a snapshot decoded for restoring describes, its indexes rebuilt.
    pub fn from_restored(image: RestoredImage) -> Self {
        Self::from_parts(image)
    }

    fn from_parts<D: ImageDedup>(image: MachineImage<D>) -> Self {
        let mut m = LockMachine {
            now_ms: image.now_ms,
            term: image.term,
            last_token: image.last_token,
            commands: image.commands,
            gc_floor: image.gc_floor,
            quotas: image.quotas,
            keys: image.keys.into_iter().map(|k| (k.id.clone(), k)).collect(),
            ..Default::default()
        };
        for (name, res) in image.resources {
            let name = ResName::from(name);
            if let Some(l) = &res.lease {
                m.lease_expiry.insert((l.expires_at_ms, name.clone()));
                count_up(&mut m.tenant_leases, &name);
            }
            for w in res.waiters.iter() {
                count_up(&mut m.tenant_waiters, &name);
                m.waiter_deadlines
                    .insert((w.deadline_ms, name.clone(), w.request_id.clone()));
            }
            m.total_waiters += res.waiters.len() as u64;
            if let Some(until) = res.idle_until_ms {
                m.idle_expiry.insert((until, name.clone()));
            }
            if let Some(at) = res.reissue_at_ms {
                m.reissue_index.insert((at, name.clone()));
            }
            m.resources.insert(name, res);
        }
        let table = image.dedup_records.into_table();
        m.dedup = if image.dedup.is_empty() {
            table
        } else {
            // Images of earlier versions: records by resource and request id, merged in.
            let legacy = image
                .dedup
                .into_iter()
                .map(|(resource, request_id, rec)| (dedup_key(&resource, &request_id), rec));
            DedupTable::from_records(table.iter().chain(legacy))
        };
        m
    }

    /// Verifies that the derived indexes agree with the primary state. For tests.
    pub fn check_indexes(&self) -> Result<(), String> {
        let rebuilt = LockMachine::from_image(self.image());
        if rebuilt.lease_expiry != self.lease_expiry {
            return Err("lease_expiry index out of step".into());
        }
        if rebuilt.waiter_deadlines != self.waiter_deadlines {
            return Err("waiter_deadlines index out of step".into());
        }
        self.dedup.check()?;
        if !self.dedup.iter().eq(rebuilt.dedup.iter()) {
            return Err("dedup records differ from their image".into());
        }
        if rebuilt.idle_expiry != self.idle_expiry {
            return Err("idle_expiry index out of step".into());
        }
        if rebuilt.reissue_index != self.reissue_index {
            return Err("reissue_index out of step".into());
        }
        if rebuilt.total_waiters != self.total_waiters {
            return Err("total_waiters out of step".into());
        }
        if rebuilt.tenant_leases != self.tenant_leases {
            return Err("tenant_leases out of step".into());
        }
        if rebuilt.tenant_waiters != self.tenant_waiters {
            return Err("tenant_waiters out of step".into());
        }
        Ok(())
    }
}
