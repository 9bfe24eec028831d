//! The dedup table: what a retried acquire gets back, for the retry window.
//!
//! At the seed workload the 10-minute retry window holds over a million records, nearly all of
//! them granted acquires that are never looked at again and expire in the order they were
//! written. The table is shaped for that:
//!
//! - **Waiting** records (an acquire still queued) are few and change often: a small
//!   persistent set.
//! - **Granted** records are written into an *open* chunk (two small persistent maps) and,
//!   once it holds `chunk_len` records, frozen into a flat, immutable, shared array sorted by
//!   (expiry, key), with a key-ordered index and a one-word filter. A frozen record costs
//!   54 bytes instead of ~135 in a pair of B-trees (its numbers are 32-bit offsets from the
//!   chunk's smallest), and a snapshot's clone of the machine shares frozen chunks whole:
//!   applying commands while a snapshot is written copies nothing of them.
//! - The tick removes expired records in (expiry, key) order, as it always did: the removed
//!   records of a frozen chunk are always a prefix of it, so a chunk only keeps a count of
//!   them and is dropped once it is used up.
//!
//! Replacing or forgetting a granted record (neither happens in normal operation: a granted
//! record only ends by expiry) rebuilds its chunk. The layout never shows: lookups, the sweep
//! order and the image (in (expiry, key) order) are the same whatever the chunk boundaries,
//! so replicas that built the table differently still agree.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};

use super::state::{DedupGrant, DedupKey, DedupRecord, DedupState};

/// Records per frozen chunk. Larger chunks mean fewer filters to probe per lookup, but a larger
/// open chunk to copy into the flat array at once, and that copy runs inside one apply on every
/// replica. At the seed rate (2,000 acquires/s) a chunk fills every 8 s and its freeze takes
/// ~5 ms; with the retry window full (1.2 million records, 73 chunks) an acquire applies in
/// ~9 µs. Chunks of 65,536 applied in ~8 µs but stalled apply for ~17 ms every 33 s, which
/// showed in the latency of every such second.
pub const DEFAULT_CHUNK_LEN: usize = 16_384;

/// A granted record whole: what a frozen chunk is built from, and what its [`Packed`] records
/// are read back as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    /// When the record leaves the retry window.
    expires_at_ms: u64,
    key: DedupKey,
    grant: DedupGrant,
}

impl Kept {
    fn order(&self) -> (u64, DedupKey) {
        (self.expires_at_ms, self.key)
    }

    /// The numbers a frozen chunk stores as offsets: the record's expiry, and the grant's
    /// token, TTL and expiry.
    fn numbers(&self) -> [u64; 4] {
        [
            self.expires_at_ms,
            self.grant.fencing_token,
            self.grant.ttl_ms,
            self.grant.expires_at_ms,
        ]
    }
}

/// A granted record as a frozen chunk stores it: 48 bytes where a [`Kept`] takes 64. The
/// records of one chunk were granted within seconds of each other, so each of its numbers is
/// stored as a 32-bit offset from the chunk's smallest (`Frozen::base`); a run of records
/// whose numbers span more than that is cut into several chunks (see [`Frozen::build`]).
#[derive(Clone, Copy)]
struct Packed {
    key: DedupKey,
    lease_id: [u64; 2],
    /// [`Kept::numbers`] minus the chunk's base.
    offsets: [u32; 4],
}

const _: () = assert!(std::mem::size_of::<Packed>() == 48);

/// An immutable run of granted records.
struct Frozen {
    /// Sorted by (expiry, key): the order the tick removes them in.
    records: Box<[Packed]>,
    /// The smallest of each of [`Kept::numbers`] in the chunk.
    base: [u64; 4],
    /// Positions in `records`, sorted by key.
    by_key: Box<[u32]>,
    /// Three bits per key in one 64-bit word, about sixteen bits per record: a lookup of a key
    /// that is not here (the common case: a new request id) reads one word and needs a binary
    /// search in fewer than one chunk in a hundred. (Two bits in eight bits per record needed
    /// one in twenty: with the retry window full, four binary searches per lookup.)
    filter: Box<[u64]>,
}

impl Frozen {
    /// Frozen chunks holding `records` (sorted by (expiry, key), with distinct keys), in
    /// order: one, unless some number of theirs spans more than 32 bits, where the run is cut.
    /// That never happens at the retry window's scale; a chunk's numbers span seconds.
    fn build(records: Vec<Kept>) -> Vec<Frozen> {
        let mut chunks = Vec::new();
        let mut start = 0;
        let (mut lo, mut hi) = ([u64::MAX; 4], [0u64; 4]);
        for (i, r) in records.iter().enumerate() {
            let n = r.numbers();
            let fits = (0..4).all(|f| n[f].max(hi[f]) - n[f].min(lo[f]) <= u64::from(u32::MAX));
            if !fits {
                chunks.push(Frozen::new(&records[start..i], lo));
                start = i;
                (lo, hi) = (n, n);
            } else {
                for f in 0..4 {
                    lo[f] = lo[f].min(n[f]);
                    hi[f] = hi[f].max(n[f]);
                }
            }
        }
        if start < records.len() {
            chunks.push(Frozen::new(&records[start..], lo));
        }
        chunks
    }

    /// `records`' numbers minus `base` must fit 32 bits.
    fn new(records: &[Kept], base: [u64; 4]) -> Self {
        // Sorting the keys inline (not positions that point at them) keeps the sort in cache.
        let mut keyed: Vec<(DedupKey, u32)> = records
            .iter()
            .enumerate()
            .map(|(i, r)| (r.key, i as u32))
            .collect();
        keyed.sort_unstable();
        let by_key: Box<[u32]> = keyed.into_iter().map(|(_, i)| i).collect();
        let words = (records.len() / 4).next_power_of_two().max(1);
        let mut filter = vec![0u64; words].into_boxed_slice();
        for r in records {
            let (word, bits) = filter_slot(&r.key, words);
            filter[word] |= bits;
        }
        let pack = |r: &Kept| {
            let n = r.numbers();
            Packed {
                key: r.key,
                lease_id: r.grant.lease_words(),
                offsets: std::array::from_fn(|f| (n[f] - base[f]) as u32),
            }
        };
        Frozen {
            records: records.iter().map(pack).collect(),
            base,
            by_key,
            filter,
        }
    }

    fn len(&self) -> usize {
        self.records.len()
    }

    fn key(&self, i: usize) -> DedupKey {
        self.records[i].key
    }

    /// The (expiry, key) of the record at `i`, without unpacking the rest of it.
    fn order(&self, i: usize) -> (u64, DedupKey) {
        let r = &self.records[i];
        (self.base[0] + u64::from(r.offsets[0]), r.key)
    }

    /// The record at `i`, unpacked.
    fn kept(&self, i: usize) -> Kept {
        let r = &self.records[i];
        let [expires_at_ms, token, ttl_ms, granted_until] =
            std::array::from_fn(|f| self.base[f] + u64::from(r.offsets[f]));
        Kept {
            expires_at_ms,
            key: r.key,
            grant: DedupGrant::from_parts(r.lease_id, token, ttl_ms, granted_until),
        }
    }

    /// Whether the filter lets `key` through to a binary search (always, if it is here).
    fn may_hold(&self, key: &DedupKey) -> bool {
        let (word, bits) = filter_slot(key, self.filter.len());
        self.filter[word] & bits == bits
    }

    /// The position of `key`'s record, removed or not.
    fn position(&self, key: &DedupKey) -> Option<usize> {
        if !self.may_hold(key) {
            return None;
        }
        self.by_key
            .binary_search_by_key(key, |&i| self.key(i as usize))
            .ok()
            .map(|i| self.by_key[i] as usize)
    }
}

/// A key's place in a filter of `words` 64-bit words (a power of two): one word and three bits
/// in it, so a lookup touches one cache line per chunk. Keys are digests, so their words are
/// already uniform.
fn filter_slot(key: &DedupKey, words: usize) -> (usize, u64) {
    let word = (key[0] & (words as u64 - 1)) as usize;
    let bit = |shift: u64| 1u64 << ((key[1] >> shift) & 63);
    (word, bit(0) | bit(6) | bit(12))
}

/// A frozen chunk and how many of its records (a prefix) the tick has removed.
#[derive(Clone)]
struct Chunk {
    frozen: Arc<Frozen>,
    removed: usize,
}

impl Chunk {
    fn new(frozen: Frozen) -> Self {
        Chunk {
            frozen: Arc::new(frozen),
            removed: 0,
        }
    }

    fn live(&self) -> impl Iterator<Item = Kept> + '_ {
        (self.removed..self.frozen.len()).map(|i| self.frozen.kept(i))
    }

    fn used_up(&self) -> bool {
        self.removed == self.frozen.len()
    }

    /// The (expiry, key) of the earliest live record.
    fn head(&self) -> Option<(u64, DedupKey)> {
        (!self.used_up()).then(|| self.frozen.order(self.removed))
    }

    fn get(&self, key: &DedupKey) -> Option<Kept> {
        self.frozen
            .position(key)
            .filter(|&p| p >= self.removed)
            .map(|p| self.frozen.kept(p))
    }
}

/// The dedup records of the lock machine, by the digest of (resource, request id).
#[derive(Clone)]
pub struct DedupTable {
    chunk_len: usize,
    waiting: OrdSet<DedupKey>,
    /// The open chunk, by (expiry, key) and by key.
    open: OrdMap<(u64, DedupKey), DedupGrant>,
    open_keys: OrdMap<DedupKey, u64>,
    /// Frozen chunks, oldest first.
    chunks: VecDeque<Chunk>,
    /// Granted records in frozen chunks, not yet removed.
    frozen_len: usize,
}

impl Default for DedupTable {
    fn default() -> Self {
        DedupTable::with_chunk_len(DEFAULT_CHUNK_LEN)
    }
}

impl fmt::Debug for DedupTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedupTable")
            .field("waiting", &self.waiting.len())
            .field("open", &self.open.len())
            .field("chunks", &self.chunks.len())
            .field("frozen", &self.frozen_len)
            .finish()
    }
}

impl DedupTable {
    /// An empty table freezing `chunk_len` granted records at a time (tests use small chunks
    /// to exercise freezing and chunk boundaries).
    pub fn with_chunk_len(chunk_len: usize) -> Self {
        DedupTable {
            chunk_len: chunk_len.max(1),
            waiting: OrdSet::new(),
            open: OrdMap::new(),
            open_keys: OrdMap::new(),
            chunks: VecDeque::new(),
            frozen_len: 0,
        }
    }

    /// A table of the default chunk length holding `records` (one per key), as a snapshot
    /// lists them: granted records are laid out in expiry order, as if written over time.
    pub fn from_records(records: impl IntoIterator<Item = (DedupKey, DedupRecord)>) -> Self {
        DedupTable::default().rebuilt_with(records)
    }

    /// This (empty) table filled with `records` (see [`DedupBuilder`]).
    fn rebuilt_with(self, records: impl IntoIterator<Item = (DedupKey, DedupRecord)>) -> Self {
        let mut builder = DedupBuilder::new(self);
        for (key, rec) in records {
            builder.push(key, rec);
        }
        builder.finish()
    }

    /// Appends `records` (in (expiry, key) order, after every frozen record) as frozen chunks.
    fn append_frozen(&mut self, records: Vec<Kept>) {
        self.frozen_len += records.len();
        self.chunks
            .extend(Frozen::build(records).into_iter().map(Chunk::new));
    }

    pub fn len(&self) -> usize {
        self.waiting.len() + self.open.len() + self.frozen_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, key: &DedupKey) -> Option<DedupRecord> {
        if self.waiting.contains(key) {
            return Some(DedupRecord {
                state: DedupState::Waiting,
                expires_at_ms: u64::MAX,
            });
        }
        if let Some(&exp) = self.open_keys.get(key) {
            return self.open.get(&(exp, *key)).map(|g| granted(exp, g));
        }
        // Newest first: a key has at most one record, and a retry is most likely recent.
        self.chunks
            .iter()
            .rev()
            .find_map(|c| c.get(key))
            .map(|k| granted(k.expires_at_ms, &k.grant))
    }

    /// Stores `record` for `key`, replacing any record it had.
    pub fn insert(&mut self, key: DedupKey, record: DedupRecord) {
        self.remove(&key);
        self.store(key, record);
    }

    /// Stores `record` for `key`, which has none: the caller has just looked it up. This skips
    /// the search of every frozen chunk that replacing a record needs, which with the retry
    /// window full is most of what a new acquire's record costs.
    pub fn insert_new(&mut self, key: DedupKey, record: DedupRecord) {
        debug_assert!(
            self.get(&key).is_none(),
            "insert_new over an existing record"
        );
        self.store(key, record);
    }

    fn store(&mut self, key: DedupKey, record: DedupRecord) {
        match record.state {
            DedupState::Waiting => {
                self.waiting.insert(key);
            }
            DedupState::Granted(grant) => {
                self.open.insert((record.expires_at_ms, key), grant);
                self.open_keys.insert(key, record.expires_at_ms);
                if self.open.len() >= self.chunk_len {
                    self.freeze();
                }
            }
        }
    }

    /// Removes `key`'s record; whether it had one.
    pub fn remove(&mut self, key: &DedupKey) -> bool {
        if self.waiting.remove(key).is_some() {
            return true;
        }
        if let Some(exp) = self.open_keys.remove(key) {
            self.open.remove(&(exp, *key));
            return true;
        }
        let Some(at) = self.chunks.iter().position(|c| c.get(key).is_some()) else {
            return false;
        };
        // Not on any path of normal operation (granted records end by expiry): rebuild.
        let rest: Vec<Kept> = self.chunks[at].live().filter(|k| k.key != *key).collect();
        self.frozen_len -= 1;
        self.chunks.remove(at);
        for (i, frozen) in Frozen::build(rest).into_iter().enumerate() {
            self.chunks.insert(at + i, Chunk::new(frozen));
        }
        true
    }

    /// The earliest expiry of a granted record.
    pub fn next_expiry(&self) -> Option<u64> {
        self.heads().map(|(exp, _, _)| exp).min()
    }

    /// Removes up to `budget` granted records that expired at or before `now`, earliest
    /// (expiry, key) first. Returns how many it removed.
    pub fn expire(&mut self, now: u64, budget: usize) -> usize {
        let mut removed = 0;
        while removed < budget {
            let Some((exp, key, source)) = self.heads().min_by_key(|&(e, k, _)| (e, k)) else {
                break;
            };
            if exp > now {
                break;
            }
            match source {
                None => {
                    self.open.remove(&(exp, key));
                    self.open_keys.remove(&key);
                }
                Some(i) => {
                    let chunk = &mut self.chunks[i];
                    chunk.removed += 1;
                    self.frozen_len -= 1;
                    if chunk.used_up() {
                        self.chunks.remove(i);
                    }
                }
            }
            removed += 1;
        }
        removed
    }

    /// Moves every granted record that expires after `prev` later by `by` ms (a forward jump
    /// of log time at a leader change). Rare, so it simply rebuilds the table.
    pub fn shift(&mut self, prev: u64, by: u64) {
        if by == 0 {
            return;
        }
        let records: Vec<(DedupKey, DedupRecord)> = self
            .iter()
            .map(|(key, mut rec)| {
                if rec.expires_at_ms != u64::MAX && rec.expires_at_ms > prev {
                    rec.expires_at_ms = rec.expires_at_ms.saturating_add(by);
                }
                (key, rec)
            })
            .collect();
        *self = DedupTable::with_chunk_len(self.chunk_len).rebuilt_with(records);
    }

    /// Every record, in (expiry, key) order, waiting records (which never expire) last: the
    /// order the table keeps records in, so listing them merges a few sorted runs (the open
    /// chunk, each frozen chunk, the waiting set) instead of sorting. Keys are unique, so the
    /// order is total and every replica lists (and snapshots) the same records identically.
    pub fn iter(&self) -> impl Iterator<Item = (DedupKey, DedupRecord)> + '_ {
        let waiting = self.waiting.iter().map(|k| {
            (
                *k,
                DedupRecord {
                    state: DedupState::Waiting,
                    expires_at_ms: u64::MAX,
                },
            )
        });
        let open = self
            .open
            .iter()
            .map(|(&(exp, key), grant)| (key, granted(exp, grant)));
        let mut sources: Vec<Box<dyn Iterator<Item = (DedupKey, DedupRecord)> + '_>> =
            vec![Box::new(open)];
        for c in &self.chunks {
            sources.push(Box::new(
                c.live()
                    .map(|k| (k.key, granted(k.expires_at_ms, &k.grant))),
            ));
        }
        sources.push(Box::new(waiting));
        MergeByOrder::new(sources)
    }

    /// Checks the table's own bookkeeping. For tests.
    pub fn check(&self) -> Result<(), String> {
        if self.open.len() != self.open_keys.len()
            || self
                .open_keys
                .iter()
                .any(|(k, exp)| !self.open.contains_key(&(*exp, *k)))
        {
            return Err("open chunk's key index out of step".into());
        }
        let mut frozen = 0;
        for c in &self.chunks {
            let live: Vec<Kept> = c.live().collect();
            if live.is_empty() {
                return Err("a used-up chunk was kept".into());
            }
            if live.windows(2).any(|w| w[0].order() >= w[1].order()) {
                return Err("a chunk is not in (expiry, key) order".into());
            }
            let f = &c.frozen;
            if (0..f.len()).any(|i| f.position(&f.key(i)) != Some(i)) {
                return Err("a chunk's index or filter misses a key".into());
            }
            frozen += live.len();
        }
        if frozen != self.frozen_len {
            return Err("frozen record count out of step".into());
        }
        let listed: Vec<(u64, DedupKey)> = self.iter().map(|(k, r)| (r.expires_at_ms, k)).collect();
        if listed.windows(2).any(|w| w[0] >= w[1]) {
            return Err("records are not listed in (expiry, key) order".into());
        }
        let mut keys: Vec<DedupKey> = listed.into_iter().map(|(_, k)| k).collect();
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return Err("a key has two records".into());
        }
        if keys.len() != self.len() {
            return Err("record count out of step".into());
        }
        Ok(())
    }

    /// The earliest live granted record of the open chunk (`None`) and of each frozen chunk.
    fn heads(&self) -> impl Iterator<Item = (u64, DedupKey, Option<usize>)> + '_ {
        let open = self.open.get_min().map(|((e, k), _)| (*e, *k, None));
        let frozen = self
            .chunks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.head().map(|(e, k)| (e, k, Some(i))));
        open.into_iter().chain(frozen)
    }

    /// Turns the open chunk into a frozen one.
    fn freeze(&mut self) {
        let records: Vec<Kept> = self
            .open
            .iter()
            .map(|(&(expires_at_ms, key), &grant)| Kept {
                expires_at_ms,
                key,
                grant,
            })
            .collect();
        self.append_frozen(records);
        self.open = OrdMap::new();
        self.open_keys = OrdMap::new();
    }
}

/// Fills an empty table with records as a snapshot lists them, whole chunks frozen at once.
///
/// A snapshot lists its records in (expiry, key) order, so each run of `chunk_len` is frozen as
/// soon as it is complete, and a restore that decodes the records straight into a builder never
/// holds them in any other form. Records out of that order (images of earlier versions list
/// them by key) thaw what was frozen, and all of them are sorted at the end instead.
pub struct DedupBuilder {
    table: DedupTable,
    /// Granted records not frozen yet (all of them once out of order).
    run: Vec<Kept>,
    in_order: bool,
}

impl DedupBuilder {
    /// A builder filling `table`, which must be empty.
    pub fn new(table: DedupTable) -> Self {
        debug_assert_eq!(table.len(), 0, "a builder fills an empty table");
        let run = Vec::with_capacity(table.chunk_len);
        DedupBuilder {
            table,
            run,
            in_order: true,
        }
    }

    pub fn push(&mut self, key: DedupKey, rec: DedupRecord) {
        let kept = match rec.state {
            DedupState::Waiting => {
                self.table.waiting.insert(key);
                return;
            }
            DedupState::Granted(grant) => Kept {
                expires_at_ms: rec.expires_at_ms,
                key,
                grant,
            },
        };
        let table = &mut self.table;
        if self.in_order
            && self
                .run
                .last()
                .is_some_and(|last| kept.order() < last.order())
        {
            self.in_order = false;
            let mut all: Vec<Kept> = Vec::with_capacity(table.frozen_len + self.run.len());
            for chunk in table.chunks.drain(..) {
                all.extend(chunk.live());
            }
            table.frozen_len = 0;
            all.append(&mut self.run);
            self.run = all;
        }
        self.run.push(kept);
        if self.in_order && self.run.len() == table.chunk_len {
            let full = std::mem::replace(&mut self.run, Vec::with_capacity(table.chunk_len));
            table.append_frozen(full);
        }
    }

    /// The table: what did not fill a chunk is its open chunk.
    pub fn finish(self) -> DedupTable {
        let DedupBuilder {
            mut table,
            mut run,
            in_order,
        } = self;
        if !in_order {
            run.sort_unstable_by_key(Kept::order);
        }
        let whole = run.len() - run.len() % table.chunk_len;
        for k in run.drain(whole..) {
            table.open.insert((k.expires_at_ms, k.key), k.grant);
            table.open_keys.insert(k.key, k.expires_at_ms);
        }
        // Front to back, each chunk moved out once (splitting the rest off the front each
        // time would copy the whole remainder per chunk).
        let mut rest = run.into_iter();
        loop {
            let chunk: Vec<Kept> = rest.by_ref().take(table.chunk_len).collect();
            if chunk.is_empty() {
                break;
            }
            table.append_frozen(chunk);
        }
        table
    }
}

fn granted(expires_at_ms: u64, grant: &DedupGrant) -> DedupRecord {
    DedupRecord {
        state: DedupState::Granted(*grant),
        expires_at_ms,
    }
}

/// Merges iterators that are each in (expiry, key) order (and share no key) into one. With
/// the retry window full there are about 75 of them (one per frozen chunk), so the smallest
/// head is kept in a heap: a scan of every head per record was most of a snapshot's cost.
struct MergeByOrder<'a> {
    heads: BinaryHeap<Reverse<Head>>,
    pending: Vec<Option<DedupRecord>>,
    sources: Vec<Box<dyn Iterator<Item = (DedupKey, DedupRecord)> + 'a>>,
}

/// A source's next record's (expiry, key), and which source it is.
type Head = ((u64, DedupKey), usize);

impl<'a> MergeByOrder<'a> {
    fn new(sources: Vec<Box<dyn Iterator<Item = (DedupKey, DedupRecord)> + 'a>>) -> Self {
        let mut merge = MergeByOrder {
            heads: BinaryHeap::with_capacity(sources.len()),
            pending: vec![None; sources.len()],
            sources,
        };
        for i in 0..merge.sources.len() {
            merge.advance(i);
        }
        merge
    }

    /// Takes source `i`'s next record into the heap.
    fn advance(&mut self, i: usize) {
        if let Some((key, rec)) = self.sources[i].next() {
            self.heads.push(Reverse(((rec.expires_at_ms, key), i)));
            self.pending[i] = Some(rec);
        }
    }
}

impl Iterator for MergeByOrder<'_> {
    type Item = (DedupKey, DedupRecord);

    fn next(&mut self) -> Option<Self::Item> {
        let Reverse(((_, key), i)) = self.heads.pop()?;
        let rec = self.pending[i].take()?;
        self.advance(i);
        Some((key, rec))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::super::state::dedup_key;
    use super::*;

    fn grant(n: u64) -> DedupGrant {
        DedupGrant::from_parts([n, !n], n, 30_000, n + 30_000)
    }

    /// A grant whose token, TTL and expiry lie more than 32 bits apart from other grants',
    /// so chunks holding it and others are cut.
    fn wide_grant(n: u64) -> DedupGrant {
        DedupGrant::from_parts([n, n], n << 34, n << 33, u64::MAX - (n << 35))
    }

    #[derive(Clone, Debug)]
    enum Op {
        Grant(u8, u64),
        /// A grant whose numbers do not fit one chunk's 32-bit offsets beside others'.
        GrantWide(u8, u64),
        /// A grant through `insert_new` when the key has no record (as a new acquire's).
        GrantNew(u8, u64),
        Wait(u8),
        Remove(u8),
        Expire(u64, usize),
        Shift(u64, u64),
    }

    fn key(k: u8) -> DedupKey {
        // Spread the keys over both words, as digests are.
        let w = u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        [w, w.rotate_left(17)]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (any::<u8>(), 0u64..200).prop_map(|(k, e)| Op::Grant(k, e)),
            2 => (any::<u8>(), 0u64..200).prop_map(|(k, e)| Op::GrantNew(k, e)),
            1 => (any::<u8>(), 0u64..200).prop_map(|(k, e)| Op::GrantWide(k, e)),
            1 => any::<u8>().prop_map(Op::Wait),
            1 => any::<u8>().prop_map(Op::Remove),
            2 => (0u64..220, 0usize..20).prop_map(|(n, b)| Op::Expire(n, b)),
            1 => (0u64..200, 0u64..50).prop_map(|(p, b)| Op::Shift(p, b)),
        ]
    }

    proptest! {
        /// The table against a plain ordered map with the same rules, with chunks small
        /// enough that records cross freezes, chunk boundaries and partial sweeps.
        #[test]
        fn behaves_like_an_ordered_map(
            chunk_len in 1usize..9,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut table = DedupTable::with_chunk_len(chunk_len);
            let mut model: BTreeMap<DedupKey, DedupRecord> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Grant(k, exp) => {
                        let rec = granted(exp, &grant(exp));
                        table.insert(key(k), rec.clone());
                        model.insert(key(k), rec);
                    }
                    Op::GrantWide(k, exp) => {
                        let rec = granted(exp, &wide_grant(exp));
                        table.insert(key(k), rec.clone());
                        model.insert(key(k), rec);
                    }
                    Op::GrantNew(k, exp) => {
                        if let std::collections::btree_map::Entry::Vacant(e) = model.entry(key(k)) {
                            let rec = granted(exp, &grant(exp));
                            table.insert_new(key(k), rec.clone());
                            e.insert(rec);
                        }
                    }
                    Op::Wait(k) => {
                        let rec = DedupRecord { state: DedupState::Waiting, expires_at_ms: u64::MAX };
                        table.insert(key(k), rec.clone());
                        model.insert(key(k), rec);
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(table.remove(&key(k)), model.remove(&key(k)).is_some());
                    }
                    Op::Expire(now, budget) => {
                        let mut due: Vec<(u64, DedupKey)> = model
                            .iter()
                            .filter(|(_, r)| r.expires_at_ms != u64::MAX && r.expires_at_ms <= now)
                            .map(|(k, r)| (r.expires_at_ms, *k))
                            .collect();
                        due.sort();
                        due.truncate(budget);
                        for (_, k) in &due {
                            model.remove(k);
                        }
                        prop_assert_eq!(table.expire(now, budget), due.len());
                    }
                    Op::Shift(prev, by) => {
                        table.shift(prev, by);
                        for r in model.values_mut() {
                            if r.expires_at_ms != u64::MAX && r.expires_at_ms > prev {
                                r.expires_at_ms += by;
                            }
                        }
                    }
                }
                table.check().map_err(TestCaseError::fail)?;
                prop_assert_eq!(table.len(), model.len());
                let listed: Vec<_> = table.iter().collect();
                let mut expected: Vec<_> = model.iter().map(|(k, r)| (*k, r.clone())).collect();
                expected.sort_by_key(|(k, r)| (r.expires_at_ms, *k));
                prop_assert_eq!(&listed, &expected);
                for k in 0..=255u8 {
                    prop_assert_eq!(table.get(&key(k)), model.get(&key(k)).cloned());
                }
                let next = model
                    .values()
                    .map(|r| r.expires_at_ms)
                    .filter(|&e| e != u64::MAX)
                    .min();
                prop_assert_eq!(table.next_expiry(), next);
            }
        }
    }

    /// A full chunk's filter lets few absent keys through to a binary search: with the retry
    /// window full a lookup probes ~73 chunks, and each pass costs a search.
    #[test]
    fn the_filter_lets_under_one_absent_key_in_a_hundred_through() {
        let digest = |n: u64| dedup_key("kv:r", &n.to_string());
        let mut records: Vec<Kept> = (0..DEFAULT_CHUNK_LEN as u64)
            .map(|n| Kept {
                expires_at_ms: n,
                key: digest(n),
                grant: grant(n),
            })
            .collect();
        records.sort_unstable_by_key(Kept::order);
        let mut built = Frozen::build(records);
        assert_eq!(built.len(), 1, "a chunk of close numbers stays whole");
        let frozen = built.remove(0);
        let probes = 100_000u64;
        let passed = (0..probes)
            .map(|n| digest(1_000_000 + n))
            .filter(|k| frozen.may_hold(k))
            .count() as u64;
        assert!(
            passed * 100 < probes,
            "{passed} of {probes} absent keys passed the filter"
        );
        assert!((0..DEFAULT_CHUNK_LEN as u64).all(|n| frozen.position(&digest(n)).is_some()));
    }

    /// Records whose expiries lie more than 32 bits apart land in separate chunks and are
    /// found, listed and swept as if they shared one.
    #[test]
    fn numbers_too_far_apart_for_one_chunk_are_cut_into_several() {
        let far = [0u64, 1, 1 << 33, (1 << 33) + 5, 1 << 40, u64::MAX - 1];
        let mut table = DedupTable::with_chunk_len(far.len());
        for (n, &exp) in far.iter().enumerate() {
            table.insert_new(key(n as u8), granted(exp, &grant(n as u64)));
        }
        assert_eq!(table.chunks.len(), 4, "{table:?}");
        table.check().expect("consistent");
        for (n, &exp) in far.iter().enumerate() {
            assert_eq!(
                table.get(&key(n as u8)),
                Some(granted(exp, &grant(n as u64)))
            );
        }
        assert_eq!(table.expire(1 << 34, 100), 4);
        assert_eq!(table.next_expiry(), Some(1 << 40));
        assert_eq!(table.len(), 2);
        table.check().expect("consistent");
    }

    /// Snapshots of earlier versions list records in key order; they rebuild the same table
    /// as the (expiry, key) order this version writes.
    #[test]
    fn records_in_key_order_rebuild_the_same_table() {
        let mut table = DedupTable::default();
        for n in 0..40_000u64 {
            table.insert_new(
                dedup_key("kv:r", &n.to_string()),
                granted(1_000 + n, &grant(n)),
            );
        }
        table.insert(
            key(7),
            DedupRecord {
                state: DedupState::Waiting,
                expires_at_ms: u64::MAX,
            },
        );
        let listed: Vec<_> = table.iter().collect();
        let mut by_key = listed.clone();
        by_key.sort_by_key(|(k, _)| *k);
        assert_ne!(by_key, listed, "the two orders differ");
        let rebuilt = DedupTable::from_records(by_key);
        rebuilt.check().expect("consistent");
        assert_eq!(rebuilt.iter().collect::<Vec<_>>(), listed);
    }

    /// A restore freezes chunks while the records come in order; one out of order after some
    /// chunks were frozen thaws them, and the table is still the one the records describe.
    #[test]
    fn records_out_of_order_after_frozen_chunks_rebuild_the_same_table() {
        let records = |ns: &[u64]| -> Vec<(DedupKey, DedupRecord)> {
            ns.iter()
                .map(|&n| (key(n as u8), granted(100 + n, &grant(n))))
                .collect()
        };
        let in_order: Vec<u64> = (0..11).collect();
        let table = DedupTable::with_chunk_len(4).rebuilt_with(records(&in_order));
        table.check().expect("consistent");
        assert_eq!((table.chunks.len(), table.open.len()), (2, 3));
        assert_eq!(table.iter().collect::<Vec<_>>(), records(&in_order));
        // 0..9 in order (two chunks frozen on the way), then 9, 10 and 11 before them.
        let mut late: Vec<u64> = (0..9).collect();
        late.extend([11, 10, 9]);
        let rebuilt = DedupTable::with_chunk_len(4).rebuilt_with(records(&late));
        rebuilt.check().expect("consistent");
        let all: Vec<u64> = (0..12).collect();
        assert_eq!(rebuilt.iter().collect::<Vec<_>>(), records(&all));
        assert_eq!((rebuilt.chunks.len(), rebuilt.open.len()), (3, 0));
        assert_eq!(rebuilt.len(), 12);
    }

    /// A clone (a snapshot's) shares the frozen chunks and is unaffected by what the table
    /// does afterwards.
    #[test]
    fn a_clone_keeps_its_records() {
        let mut table = DedupTable::with_chunk_len(4);
        for n in 0..10u8 {
            table.insert(key(n), granted(u64::from(n), &grant(u64::from(n))));
        }
        let before: Vec<_> = table.iter().collect();
        let clone = table.clone();
        assert!(Arc::ptr_eq(
            &clone.chunks[0].frozen,
            &table.chunks[0].frozen
        ));
        assert_eq!(table.expire(5, 100), 6);
        table.insert(key(200), granted(50, &grant(50)));
        assert_eq!(clone.iter().collect::<Vec<_>>(), before);
        assert_eq!(table.len(), 5);
    }
}
