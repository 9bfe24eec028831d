//! The records the lock state is made of: leases, waiters, per-resource state, proxy
//! grants, dedup records, and the snapshot image. All of it is replicated and snapshotted, so
//! every field is part of the on-disk format: add fields with `#[serde(default)]`.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::dedup::{DedupBuilder, DedupTable};
use super::keys::ApiKeyRecord;
use super::quota::QuotaLedger;
use super::rare::Rare;
use super::types::Grant;
use crate::wire::LeaseId;

/// A granted lease as stored in the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub lease_id: LeaseId,
    pub fencing_token: u64,
    pub holder: Option<String>,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
    pub granted_at_ms: u64,
}

/// An acquire waiting in a resource's FIFO queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    pub request_id: String,
    pub holder: Option<String>,
    pub ttl_ms: u64,
    pub deadline_ms: u64,
    pub lease_id: LeaseId,
    pub retain_ms: u64,
}

/// Per-resource record. Kept while held or waited on, then for `retain_ms` after it went
/// idle so that reads (and the fencing proxy) still see its last token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceState {
    /// Boxed: most records at the seed workload are idle (four in five), and an inline lease
    /// would cost each of them 80 bytes; snapshots encode it exactly as an inline one.
    pub lease: Option<Box<Lease>>,
    /// Like the grants below, one pointer while empty, as it nearly always is.
    pub waiters: Rare<VecDeque<Waiter>>,
    /// Highest fencing token ever issued for this resource.
    pub last_token: u64,
    /// Highest token a fencing proxy was admitted to forward writes with.
    #[serde(default)]
    pub admitted: u64,
    /// Live proxy admission grants for the current token (see `Command::Admit`).
    #[serde(default)]
    pub grants: Rare<Vec<FenceGrant>>,
    /// Set when the lease ended while proxy grants were live: no new token is issued for the
    /// resource before this time, so writes already admitted under the old token have
    /// completed or timed out before a newer token can exist (the epoch barrier).
    #[serde(default)]
    pub reissue_at_ms: Option<u64>,
    /// When the record became idle (no lease, no waiters) and when it may be dropped.
    pub idle_until_ms: Option<u64>,
}

impl ResourceState {
    /// Marks the record idle until `until` (idle records are kept as long as retries may still
    /// refer to them) if nothing uses it and it is not marked yet. True when it was marked:
    /// the caller indexes it for dropping.
    pub(super) fn mark_idle(&mut self, until: u64) -> bool {
        if self.lease.is_some()
            || !self.waiters.is_empty()
            || self.idle_until_ms.is_some()
            || self.reissue_at_ms.is_some()
        {
            return false;
        }
        self.idle_until_ms = Some(until);
        true
    }
}

// A hundred thousand of these live in the nodes of a persistent map that apply copies while a
// snapshot is written: keep them small.
const _: () = assert!(std::mem::size_of::<ResourceState>() == 72);

/// A proxy's permission to forward writes with `fencing_token` until `until_ms` (log time).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceGrant {
    pub proxy: u64,
    pub fencing_token: u64,
    pub until_ms: u64,
}

/// What a retried acquire with the same `request_id` gets back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DedupState {
    Granted(DedupGrant),
    Waiting,
}

/// The grant a retried acquire gets back: the original lease and token. The resource is not
/// stored (the retry names it), which keeps a full retry window of records small; for the
/// same reason the lease id is held as two words (a `u128` would align every record, and the
/// map's nodes, to 16 bytes). Images of earlier versions stored the whole `Grant`; its extra
/// field is ignored on load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "GrantFields", into = "GrantFields")]
pub struct DedupGrant {
    lease_id: [u64; 2],
    pub fencing_token: u64,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
}

/// How a [`DedupGrant`] is written: the same fields as a `Grant` without the resource.
#[derive(Clone, Serialize, Deserialize)]
struct GrantFields {
    lease_id: LeaseId,
    fencing_token: u64,
    ttl_ms: u64,
    expires_at_ms: u64,
}

impl From<GrantFields> for DedupGrant {
    fn from(g: GrantFields) -> Self {
        DedupGrant {
            lease_id: [(g.lease_id.0 >> 64) as u64, g.lease_id.0 as u64],
            fencing_token: g.fencing_token,
            ttl_ms: g.ttl_ms,
            expires_at_ms: g.expires_at_ms,
        }
    }
}

impl From<DedupGrant> for GrantFields {
    fn from(g: DedupGrant) -> Self {
        GrantFields {
            lease_id: g.lease_id(),
            fencing_token: g.fencing_token,
            ttl_ms: g.ttl_ms,
            expires_at_ms: g.expires_at_ms,
        }
    }
}

impl DedupGrant {
    pub(super) fn of(grant: &Grant) -> Self {
        GrantFields {
            lease_id: grant.lease_id,
            fencing_token: grant.fencing_token,
            ttl_ms: grant.ttl_ms,
            expires_at_ms: grant.expires_at_ms,
        }
        .into()
    }

    pub(super) fn from_parts(
        lease_id: [u64; 2],
        fencing_token: u64,
        ttl_ms: u64,
        expires_at_ms: u64,
    ) -> Self {
        DedupGrant {
            lease_id,
            fencing_token,
            ttl_ms,
            expires_at_ms,
        }
    }

    /// The lease id's two words, as stored.
    pub(super) fn lease_words(&self) -> [u64; 2] {
        self.lease_id
    }

    pub fn lease_id(&self) -> LeaseId {
        LeaseId(u128::from(self.lease_id[0]) << 64 | u128::from(self.lease_id[1]))
    }

    pub(super) fn to_grant(self, resource: &str) -> Grant {
        Grant {
            resource: resource.to_string(),
            lease_id: self.lease_id(),
            fencing_token: self.fencing_token,
            ttl_ms: self.ttl_ms,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    pub state: DedupState,
    pub expires_at_ms: u64,
}

/// A dedup record as a snapshot image stores it: `(key, expires_at_ms, grant)`, the grant as
/// `(fencing_token, lease_id words, ttl_ms, expires_at_ms)` or none while the acquire waits.
///
/// A full retry window is over a million of these, so binary encodings (the snapshot's
/// MessagePack) store each as one byte string of little-endian words: the key's two, the
/// expiry, then for a grant its token, lease id words, TTL and expiry (24 bytes waiting,
/// 64 granted). That decodes as one token per record instead of fourteen, which made it the
/// larger part of a snapshot install. Text encodings (JSON) keep the plain tuple, and binary
/// decoding still reads the tuple form that earlier versions wrote; a version that only
/// knows the tuple refuses the byte form with a decode error rather than misreading it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupEntry(pub DedupKey, pub u64, pub Option<(u64, [u64; 2], u64, u64)>);

/// [`DedupEntry`]'s tuple form.
#[derive(Serialize, Deserialize)]
struct DedupTuple(DedupKey, u64, Option<(u64, [u64; 2], u64, u64)>);

impl From<DedupTuple> for DedupEntry {
    fn from(DedupTuple(key, expires_at_ms, grant): DedupTuple) -> Self {
        DedupEntry(key, expires_at_ms, grant)
    }
}

const PACKED_WAITING: usize = 3 * 8;
const PACKED_GRANTED: usize = 8 * 8;

impl Serialize for DedupEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            let DedupEntry(key, expires_at_ms, grant) = *self;
            return DedupTuple(key, expires_at_ms, grant).serialize(serializer);
        }
        let (bytes, len) = self.packed();
        serializer.serialize_bytes(&bytes[..len])
    }
}

impl<'de> Deserialize<'de> for DedupEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            return DedupTuple::deserialize(deserializer).map(DedupEntry::from);
        }
        deserializer.deserialize_any(DedupEntryVisitor)
    }
}

/// Reads either form of a [`DedupEntry`] from a binary encoding.
struct DedupEntryVisitor;

impl<'de> serde::de::Visitor<'de> for DedupEntryVisitor {
    type Value = DedupEntry;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "a dedup record: {PACKED_WAITING} or {PACKED_GRANTED} bytes, or a tuple"
        )
    }

    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<DedupEntry, E> {
        DedupEntry::unpacked(bytes).ok_or_else(|| E::invalid_length(bytes.len(), &self))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<DedupEntry, A::Error> {
        DedupTuple::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
            .map(DedupEntry::from)
    }
}

impl DedupEntry {
    /// The byte form: a buffer and how much of it is used.
    fn packed(&self) -> ([u8; PACKED_GRANTED], usize) {
        let DedupEntry([k0, k1], expires_at_ms, grant) = *self;
        let (token, [l0, l1], ttl_ms, granted_until) = grant.unwrap_or_default();
        let words = [k0, k1, expires_at_ms, token, l0, l1, ttl_ms, granted_until];
        let mut out = [0u8; PACKED_GRANTED];
        for (i, w) in words.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let len = if grant.is_some() {
            PACKED_GRANTED
        } else {
            PACKED_WAITING
        };
        (out, len)
    }

    fn unpacked(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != PACKED_WAITING && bytes.len() != PACKED_GRANTED {
            return None;
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let grant = (bytes.len() == PACKED_GRANTED)
            .then(|| (word(3), [word(4), word(5)], word(6), word(7)));
        Some(DedupEntry([word(0), word(1)], word(2), grant))
    }

    pub(super) fn of(key: DedupKey, rec: &DedupRecord) -> Self {
        let grant = match &rec.state {
            DedupState::Granted(g) => {
                Some((g.fencing_token, g.lease_id, g.ttl_ms, g.expires_at_ms))
            }
            DedupState::Waiting => None,
        };
        DedupEntry(key, rec.expires_at_ms, grant)
    }

    /// The record and its key, as the machine holds them.
    pub fn into_record(self) -> (DedupKey, DedupRecord) {
        let DedupEntry(key, expires_at_ms, grant) = self;
        let state = match grant {
            Some((fencing_token, lease_id, ttl_ms, granted_until)) => {
                DedupState::Granted(DedupGrant {
                    lease_id,
                    fencing_token,
                    ttl_ms,
                    expires_at_ms: granted_until,
                })
            }
            None => DedupState::Waiting,
        };
        (
            key,
            DedupRecord {
                state,
                expires_at_ms,
            },
        )
    }
}

/// A dedup record is found by a 128-bit digest of its (resource, request_id) rather than by
/// the two strings: at 2,000 acquires/s the 10-minute retry window holds over a million
/// records, and the strings (kept twice, in the map and in the expiry index) were most of
/// the machine's memory and snapshot size. A digest collision between two live records needs
/// about 2^64 of them. Two words rather than a `u128`, for the alignment reason above.
pub type DedupKey = [u64; 2];

/// The digest naming the dedup record of `request_id` on `resource`. Deterministic (every
/// replica computes the same key), length-prefixed so no two pairs share an input.
pub fn dedup_key(resource: &str, request_id: &str) -> DedupKey {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((resource.len() as u64).to_be_bytes());
    h.update(resource.as_bytes());
    h.update(request_id.as_bytes());
    let digest = h.finalize();
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&digest[i * 8..i * 8 + 8]);
        u64::from_be_bytes(w)
    };
    [word(0), word(1)]
}

/// The persistent part of the machine, as written into snapshots. `D` is how its dedup records
/// are held: a vector of them as written ([`MachineImage`]), or, as a node restores a snapshot,
/// the table built while they are decoded ([`RestoredImage`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineImage<D = Vec<DedupEntry>> {
    pub now_ms: u64,
    pub term: u64,
    pub last_token: u64,
    #[serde(default)]
    pub gc_floor: u64,
    #[serde(deserialize_with = "presized")]
    pub resources: Vec<(String, ResourceState)>,
    /// Dedup records, in (expiry, key) order (images of earlier versions: in key order).
    #[serde(default)]
    pub dedup_records: D,
    /// Dedup records as images of earlier versions stored them (by resource and request id);
    /// read on load, never written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dedup: Vec<(String, String, DedupRecord)>,
    /// Absent in snapshots taken before quotas existed.
    #[serde(default)]
    pub quotas: QuotaLedger,
    /// The API keys (digests only), in id order. Absent in snapshots taken before keys existed.
    #[serde(default)]
    pub keys: Vec<ApiKeyRecord>,
    /// Commands applied since the log began. Absent (so counted from 0) in snapshots taken
    /// before it was kept: after an upgrade, members restored from such snapshots at different
    /// indexes count differently until one installs another's snapshot. Only when each member
    /// snapshots depends on it.
    #[serde(default)]
    pub commands: u64,
}

/// A snapshot's image as a node restores it, its dedup records decoded straight into the
/// table's chunks. Decoded into a `MachineImage` first, a million records were a 70 MiB vector
/// next to the chunks built from it, the largest part of a follower's memory while it
/// installed a snapshot.
pub type RestoredImage = MachineImage<RestoredDedup>;

/// How an image holds its dedup records, and the machine's table made of them.
pub trait ImageDedup {
    fn into_table(self) -> DedupTable;
}

impl ImageDedup for Vec<DedupEntry> {
    fn into_table(self) -> DedupTable {
        DedupTable::from_records(self.into_iter().map(DedupEntry::into_record))
    }
}

impl ImageDedup for RestoredDedup {
    fn into_table(self) -> DedupTable {
        self.0
    }
}

/// The dedup table, built as a snapshot's sequence of [`DedupEntry`] is decoded.
#[derive(Default)]
pub struct RestoredDedup(pub DedupTable);

impl<'de> Deserialize<'de> for RestoredDedup {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Records;
        impl<'de> serde::de::Visitor<'de> for Records {
            type Value = RestoredDedup;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence of dedup records")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<RestoredDedup, A::Error> {
                let mut table = DedupBuilder::new(DedupTable::default());
                while let Some(entry) = seq.next_element::<DedupEntry>()? {
                    let (key, rec) = entry.into_record();
                    table.push(key, rec);
                }
                Ok(RestoredDedup(table.finish()))
            }
        }
        deserializer.deserialize_seq(Records)
    }
}

/// Elements [`presized`] reserves room for up front at most: above the seed state's million
/// dedup records, and a bound on what a damaged length in a snapshot can make it allocate.
const PRESIZE_LIMIT: usize = 1 << 21;

/// Deserialises a sequence into a vector sized by the length the encoding announces. serde's
/// own reserves at most a megabyte and then doubles: for a snapshot's million dedup records,
/// ~70 MB moved and twice that in fresh pages faulted in, most of a decode's time.
fn presized<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Presized<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Presized<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(PRESIZE_LIMIT));
            while let Some(item) = seq.next_element()? {
                out.push(item);
            }
            Ok(out)
        }
    }
    deserializer.deserialize_seq(Presized(std::marker::PhantomData))
}

/// How long an idle resource record is kept (it carries the resource's last token).
pub const DEFAULT_IDLE_RETAIN_MS: u64 = 10 * 60 * 1000;

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> [DedupEntry; 2] {
        [
            DedupEntry(
                [7, u64::MAX],
                1_700_000_600_000,
                Some((41, [3, 9], 30_000, 1_700_000_030_000)),
            ),
            DedupEntry([8, 1], u64::MAX, None),
        ]
    }

    /// The snapshot's binary form: one byte string per record, back to the same record.
    #[test]
    fn a_dedup_entry_is_one_byte_string_in_messagepack() {
        for (entry, len) in entries().into_iter().zip([PACKED_GRANTED, PACKED_WAITING]) {
            let bytes = rmp_serde::to_vec_named(&entry).expect("encode");
            assert_eq!(bytes.len(), 2 + len, "a bin 8 header and the words");
            let back: DedupEntry = rmp_serde::from_slice(&bytes).expect("decode");
            assert_eq!(back, entry);
        }
    }

    /// Snapshots written before the byte form store the tuple; they still install. JSON keeps
    /// the tuple both ways.
    #[test]
    fn the_tuple_form_still_decodes() {
        for entry in entries() {
            let DedupEntry(key, expires_at_ms, grant) = entry.clone();
            let old = rmp_serde::to_vec_named(&DedupTuple(key, expires_at_ms, grant)).expect("old");
            let back: DedupEntry = rmp_serde::from_slice(&old).expect("decode the tuple form");
            assert_eq!(back, entry);
            let json = serde_json::to_string(&entry).expect("json");
            assert!(json.starts_with('['), "{json}");
            assert_eq!(
                serde_json::from_str::<DedupEntry>(&json).expect("json back"),
                entry
            );
        }
    }

    #[test]
    fn a_byte_string_of_another_length_is_refused() {
        let bytes = rmp_serde::to_vec(&serde_bytes_of(&[0u8; 40])).expect("encode");
        let err = rmp_serde::from_slice::<DedupEntry>(&bytes).expect_err("40 bytes");
        assert!(err.to_string().contains("24 or 64 bytes"), "{err}");
    }

    /// Serialises as a byte string (not a sequence of numbers).
    fn serde_bytes_of(b: &[u8]) -> impl Serialize + '_ {
        struct B<'a>(&'a [u8]);
        impl Serialize for B<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        B(b)
    }
}
