//! The proxy's idempotency records on disk: the `idempotency` keyspace, written while a committed
//! `Command::Idem` (or a `Tick`, for purging) is applied.
//!
//! Records do not live in memory (a day of keys can be tens of millions of them). The decision
//! is [`IdempotencyMachine::decide`]; this file reads the record it needs, and writes the result
//! in one fjall batch together with the *applied marker*, the index of the log entry the batch
//! belongs to. fjall's journal keeps batches atomic and in order, so after a crash the keyspace
//! is exactly the state after the marker's entry: re-applying the log after a restart skips
//! entries at or below it and redoes the rest, and no entry is applied twice.
//!
//! The journal is not synced per batch: the raft log is the source of truth. What makes that
//! safe is that the journal is synced before a snapshot at index S is made current (see
//! `SnapshotFiles::persist_built`), so by the time the log before S may be purged, every
//! record write up to S is durable too.
//!
//! Keys (all in one keyspace):
//!
//! | key                                   | value                 |
//! |---------------------------------------|-----------------------|
//! | `r` + scope                           | JSON `IdemRecord`     |
//! | `x` + purge time (8 bytes BE) + scope | empty (purge index)   |
//! | `u` + scope                           | empty (unsettled index: processing or unknown) |
//! | `m`                                   | applied marker (8 BE) |
//! | `v`                                   | index version (1: the unsettled index exists) |
//! | `i`                                   | present while a snapshot's records are installed |
//!
//! where scope is tenant, route and key, each prefixed by its length (2 bytes BE).
//!
//! The unsettled index lets operators list the `unknown` records without scanning every
//! record: it holds the records that are `processing` (an unknown one in waiting, once its
//! owner's lease ends) or `unknown`, normally few next to the settled ones.

use fjall::{Keyspace, OwnedWriteBatch as WriteBatch, Readable, Snapshot};

use super::{decode, encode, Db, StoreError};
use crate::machine::{
    IdemCommand, IdemOutcome, IdemRecord, IdemScope, IdemState, IdempotencyMachine, RecordWrite,
};

const RECORD: u8 = b'r';
const PURGE: u8 = b'x';
const UNSETTLED: u8 = b'u';
const MARKER: &[u8] = b"m";
const VERSION: &[u8] = b"v";
const INSTALLING: &[u8] = b"i";
/// Writes per batch while a snapshot's records are installed.
const INSTALL_STEP: usize = 10_000;
/// Bumped when a derived index is added; an older keyspace is re-indexed when opened.
const INDEX_VERSION: u8 = 1;

/// Commands per log entry the marker can tell apart: one entry is a batch of commands (at
/// most the leader's batch size), and each idempotency command in it commits on its own.
const SLOTS: u64 = 1_024;

/// The marker value of the command at `pos` in log entry `index`. Markers order commands the
/// way the log does, so re-applying after a restart skips exactly what was committed.
pub(crate) fn slot(index: u64, pos: usize) -> u64 {
    debug_assert!((pos as u64) < SLOTS, "batch larger than the marker's slots");
    index
        .saturating_mul(SLOTS)
        .saturating_add((pos as u64).min(SLOTS - 1))
}

fn scope_bytes(scope: &IdemScope) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + scope.tenant.len() + scope.route.len() + scope.key.len());
    for part in [&scope.tenant, &scope.route, &scope.key] {
        // Parts are bounded by the proxy (keys ≤ 255 bytes); a longer part is cut to keep
        // the framing unambiguous rather than panicking in apply.
        let bytes = &part.as_bytes()[..part.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

fn record_key(scope: &IdemScope) -> Vec<u8> {
    let mut k = vec![RECORD];
    k.extend_from_slice(&scope_bytes(scope));
    k
}

fn unsettled_key(scope: &IdemScope) -> Vec<u8> {
    let mut k = vec![UNSETTLED];
    k.extend_from_slice(&scope_bytes(scope));
    k
}

/// Whether a record may be (or become, once its owner's lease ends) `unknown`.
fn unsettled(rec: &IdemRecord) -> bool {
    matches!(
        rec.state,
        IdemState::Processing { .. } | IdemState::Unknown { .. }
    )
}

/// One page of the records an operator may resolve.
#[derive(Debug, Default)]
pub struct UnknownPage {
    pub records: Vec<(IdemScope, IdemRecord)>,
    /// Where the next page starts (an opaque cursor), if the index goes on.
    pub next: Option<Vec<u8>>,
}

fn purge_key(purge_at_ms: u64, scope: &IdemScope) -> Vec<u8> {
    let mut k = vec![PURGE];
    k.extend_from_slice(&purge_at_ms.to_be_bytes());
    k.extend_from_slice(&scope_bytes(scope));
    k
}

/// The stored records and their purge index; cheap to clone (fjall handles are shared).
#[derive(Clone)]
pub(crate) struct IdemStore {
    db: std::sync::Arc<Db>,
}

/// One record as it travels in a snapshot.
pub(crate) type IdemEntry = (IdemScope, IdemRecord);

impl IdemStore {
    pub(crate) fn new(db: std::sync::Arc<Db>) -> Self {
        IdemStore { db }
    }

    /// Builds the derived indexes of a keyspace written before they existed (once; a no-op
    /// afterwards). The indexes are local derivations of the records, so this changes no
    /// replicated state and leaves the applied marker alone.
    pub(crate) fn upgrade(&self) -> Result<(), StoreError> {
        if self.ks().get(VERSION)?.as_deref() == Some(&[INDEX_VERSION][..]) {
            return Ok(());
        }
        let mut batch = self
            .db
            .db
            .batch()
            .durability(Some(fjall::PersistMode::SyncAll));
        for item in self.ks().prefix([RECORD]) {
            let (key, value) = item.into_inner()?;
            let rec: IdemRecord = decode("idempotency record", &value)?;
            if unsettled(&rec) {
                let mut k = vec![UNSETTLED];
                k.extend_from_slice(&key[1..]);
                batch.insert(self.ks(), k, b"");
            }
        }
        batch.insert(self.ks(), VERSION, [INDEX_VERSION]);
        batch.commit()?;
        Ok(())
    }

    fn ks(&self) -> &Keyspace {
        &self.db.idem
    }

    /// Index of the last log entry whose record writes are on this keyspace.
    pub(crate) fn applied_marker(&self) -> Result<u64, StoreError> {
        Ok(match self.ks().get(MARKER)? {
            Some(v) => {
                u64::from_be_bytes(v.as_ref().try_into().map_err(|_| StoreError::Corrupt {
                    what: "idempotency marker",
                    detail: format!("{} bytes", v.len()),
                })?)
            }
            None => 0,
        })
    }

    pub(crate) fn get(&self, scope: &IdemScope) -> Result<Option<IdemRecord>, StoreError> {
        match self.ks().get(record_key(scope))? {
            Some(v) => Ok(Some(decode("idempotency record", &v)?)),
            None => Ok(None),
        }
    }

    /// Applies `cmd` (at marker position `index`, see [`slot`]; log time `now_ms`). A command at
    /// or below the marker was already applied before a restart: nothing is written, and the
    /// outcome (which nobody waits for any more) says so.
    pub(crate) fn apply(
        &self,
        index: u64,
        cmd: &IdemCommand,
        now_ms: u64,
    ) -> Result<IdemOutcome, StoreError> {
        if index <= self.applied_marker()? {
            return Ok(IdemOutcome::NotOwner);
        }
        let scope = cmd.scope();
        let prev = self.get(scope)?;
        let (write, outcome) = IdempotencyMachine::decide(prev.as_ref(), cmd, now_ms);
        let mut batch = self.db.db.batch();
        match write {
            RecordWrite::Keep => {}
            RecordWrite::Put(rec) => {
                if let Some(p) = &prev {
                    batch.remove(self.ks(), purge_key(p.purge_at_ms, scope));
                }
                if unsettled(&rec) {
                    batch.insert(self.ks(), unsettled_key(scope), b"");
                } else {
                    batch.remove(self.ks(), unsettled_key(scope));
                }
                batch.insert(self.ks(), purge_key(rec.purge_at_ms, scope), b"");
                batch.insert(
                    self.ks(),
                    record_key(scope),
                    encode("idempotency record", &rec)?,
                );
            }
            RecordWrite::Delete => {
                if let Some(p) = &prev {
                    batch.remove(self.ks(), purge_key(p.purge_at_ms, scope));
                }
                batch.remove(self.ks(), unsettled_key(scope));
                batch.remove(self.ks(), record_key(scope));
            }
        }
        self.commit(batch, index)?;
        Ok(outcome)
    }

    fn commit(&self, mut batch: WriteBatch, index: u64) -> Result<(), StoreError> {
        batch.insert(self.ks(), MARKER, index.to_be_bytes());
        batch.commit()?;
        Ok(())
    }

    /// Forgets up to `max_items` records whose tombstone window ended by `now_ms` (applied with
    /// each `Tick`, log entry `index`). Returns how many were forgotten.
    pub(crate) fn purge(&self, index: u64, now_ms: u64, max_items: u32) -> Result<u32, StoreError> {
        if index <= self.applied_marker()? {
            return Ok(0);
        }
        let mut batch = self.db.db.batch();
        let mut n = 0u32;
        // Every purge key with a time at or before `now_ms`.
        let mut end = vec![PURGE];
        end.extend_from_slice(&now_ms.saturating_add(1).to_be_bytes());
        for item in self.ks().range(vec![PURGE]..end) {
            if n >= max_items {
                break;
            }
            let (key, _) = item.into_inner()?;
            let Some(scope_part) = key.get(9..) else {
                continue;
            };
            let mut rk = vec![RECORD];
            rk.extend_from_slice(scope_part);
            let mut uk = vec![UNSETTLED];
            uk.extend_from_slice(scope_part);
            batch.remove(self.ks(), key.to_vec());
            batch.remove(self.ks(), rk);
            batch.remove(self.ks(), uk);
            n += 1;
        }
        if n > 0 {
            self.commit(batch, index)?;
        }
        Ok(n)
    }

    /// The earliest purge time of any record.
    pub(crate) fn next_purge_ms(&self) -> Result<Option<u64>, StoreError> {
        let Some(item) = self.ks().prefix([PURGE]).next() else {
            return Ok(None);
        };
        let (key, _) = item.into_inner()?;
        Ok(key
            .get(1..9)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes))
    }

    /// A consistent point-in-time view, taken while apply is held off.
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.db.db.snapshot()
    }

    /// Every record in `view`, in key order (for a snapshot's payload).
    pub(crate) fn entries<'a>(
        &'a self,
        view: &'a Snapshot,
    ) -> impl Iterator<Item = Result<IdemEntry, StoreError>> + 'a {
        view.prefix(self.ks(), [RECORD]).map(|item| {
            let (key, value) = item.into_inner()?;
            let rec: IdemRecord = decode("idempotency record", &value)?;
            Ok((parse_scope(&key[1..])?, rec))
        })
    }

    /// Replaces every record with `entries` as of log entry `index` (a snapshot install, or
    /// its recovery). A snapshot can carry millions of records, far more than one batch
    /// should hold, so this goes in steps: the keyspace is first marked as being installed
    /// (synced), then cleared and filled batch by batch, and the last, synced batch sets the
    /// applied marker and removes the mark. A crash halfway leaves the mark, and
    /// [`install_unfinished`](Self::install_unfinished) tells the next open to install again
    /// from the snapshot file.
    pub(crate) fn replace_all(
        &self,
        entries: impl IntoIterator<Item = Result<IdemEntry, StoreError>>,
        index: u64,
    ) -> Result<(), StoreError> {
        let synced = || {
            self.db
                .db
                .batch()
                .durability(Some(fjall::PersistMode::SyncAll))
        };
        let mut batch = synced();
        batch.insert(self.ks(), INSTALLING, index.to_be_bytes());
        batch.commit()?;

        let mut batch = self.db.db.batch();
        let mut pending = 0;
        let step = |batch: &mut WriteBatch, pending: &mut usize| -> Result<(), StoreError> {
            *pending += 1;
            if *pending >= INSTALL_STEP {
                std::mem::replace(batch, self.db.db.batch()).commit()?;
                *pending = 0;
            }
            Ok(())
        };
        for item in self.ks().iter() {
            let (key, _) = item.into_inner()?;
            // The mark stays, and so does the marker until the last batch moves it.
            if &*key != INSTALLING && &*key != MARKER {
                batch.remove(self.ks(), key.to_vec());
                step(&mut batch, &mut pending)?;
            }
        }
        for entry in entries {
            let (scope, rec) = entry?;
            if unsettled(&rec) {
                batch.insert(self.ks(), unsettled_key(&scope), b"");
            }
            batch.insert(self.ks(), purge_key(rec.purge_at_ms, &scope), b"");
            batch.insert(
                self.ks(),
                record_key(&scope),
                encode("idempotency record", &rec)?,
            );
            step(&mut batch, &mut pending)?;
        }
        batch.commit()?;

        let mut batch = synced();
        batch.insert(self.ks(), VERSION, [INDEX_VERSION]);
        batch.remove(self.ks(), INSTALLING);
        // Everything of entry `index` is in `entries`.
        self.commit(batch, slot(index, (SLOTS - 1) as usize))
    }

    /// Whether an install of a snapshot's records was interrupted (the records are then
    /// neither the old nor the new set, and must be installed again).
    pub(crate) fn install_unfinished(&self) -> Result<bool, StoreError> {
        Ok(self.ks().get(INSTALLING)?.is_some())
    }
}

impl IdemStore {
    /// Up to `limit` records that are `unknown` at log time `now_ms` (also those still stored
    /// as processing whose owner's lease has ended) and not expired, in index order from the
    /// cursor `after`. At most `limit * 8` index entries are read per page (in-flight records
    /// are skipped), so a page costs bounded work even while many requests are in flight; a
    /// short page with a `next` cursor means "more may follow".
    pub(crate) fn unknown_page(
        &self,
        now_ms: u64,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<UnknownPage, StoreError> {
        let mut page = UnknownPage::default();
        let start = match after {
            // Strictly after the cursor: the cursor is a scope, the next key appends a byte.
            Some(c) => {
                let mut k = vec![UNSETTLED];
                k.extend_from_slice(c);
                k.push(0);
                k
            }
            None => vec![UNSETTLED],
        };
        let end = vec![UNSETTLED + 1];
        let budget = limit.saturating_mul(8).max(1);
        let mut last: Option<Vec<u8>> = None;
        for (read, item) in self.ks().range(start..end).enumerate() {
            if read >= budget || page.records.len() >= limit {
                // More entries follow: the next page starts after the last one looked at.
                page.next = last;
                break;
            }
            let (key, _) = item.into_inner()?;
            let scope_part = &key[1..];
            last = Some(scope_part.to_vec());
            let scope = parse_scope(scope_part)?;
            let Some(rec) = self.get(&scope)? else {
                continue;
            };
            let unknown = matches!(
                IdempotencyMachine::effective(&rec, now_ms),
                IdemState::Unknown { .. }
            );
            if unknown && now_ms < rec.expires_at_ms {
                page.records.push((scope, rec));
            }
        }
        Ok(page)
    }
}

fn parse_scope(mut bytes: &[u8]) -> Result<IdemScope, StoreError> {
    let mut parts = Vec::with_capacity(3);
    for _ in 0..3 {
        let corrupt = || StoreError::Corrupt {
            what: "idempotency key",
            detail: "truncated scope".into(),
        };
        let len = bytes
            .get(..2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
            .ok_or_else(corrupt)?;
        let part = bytes.get(2..2 + len).ok_or_else(corrupt)?;
        parts.push(String::from_utf8_lossy(part).into_owned());
        bytes = &bytes[2 + len..];
    }
    let key = parts.pop().unwrap_or_default();
    let route = parts.pop().unwrap_or_default();
    let tenant = parts.pop().unwrap_or_default();
    Ok(IdemScope { tenant, route, key })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fjall::{Database, KeyspaceCreateOptions};

    use super::*;
    use crate::machine::{Completion, IdemState, StoredAnswer, StoredBody};

    fn open(dir: &std::path::Path) -> IdemStore {
        let db = Database::builder(dir).open().unwrap();
        let ks = |name: &str| db.keyspace(name, KeyspaceCreateOptions::default).unwrap();
        let (log, meta, snapshot, idem) = (ks("log"), ks("meta"), ks("snapshot"), ks("idem"));
        IdemStore::new(Arc::new(Db {
            db,
            log,
            meta,
            snapshot,
            idem,
        }))
    }

    fn scope(key: &str) -> IdemScope {
        IdemScope {
            tenant: "demo".into(),
            route: "/orders".into(),
            key: key.into(),
        }
    }

    fn claim(key: &str, attempt: u64) -> IdemCommand {
        IdemCommand::Claim {
            scope: scope(key),
            fingerprint: "fp".into(),
            owner: 1,
            attempt,
            lease_ms: 1_000,
            retain_ms: 10_000,
            tombstone_ms: 10_000,
        }
    }

    fn complete(key: &str, attempt: u64, outcome: Completion) -> IdemCommand {
        IdemCommand::Complete {
            scope: scope(key),
            attempt,
            outcome,
        }
    }

    fn created() -> Completion {
        Completion::Final(StoredAnswer {
            status: 201,
            headers: Vec::new(),
            body: StoredBody::Inline(String::new()),
            reconciled: false,
        })
    }

    #[test]
    fn entries_at_or_below_the_marker_are_not_applied_twice() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        assert_eq!(
            store.apply(3, &claim("a", 1), 0).unwrap(),
            IdemOutcome::Claimed { attempt: 1 }
        );
        store.apply(4, &claim("b", 2), 0).unwrap();
        store
            .apply(5, &complete("b", 2, Completion::NotRun), 10)
            .unwrap();
        assert_eq!(store.get(&scope("b")).unwrap(), None);
        drop(store);

        // A restart re-applies the log after the last snapshot: nothing may change.
        let store = open(dir.path());
        assert_eq!(store.applied_marker().unwrap(), 5);
        assert_eq!(
            store.apply(4, &claim("b", 2), 0).unwrap(),
            IdemOutcome::NotOwner
        );
        assert_eq!(store.get(&scope("b")).unwrap(), None, "b stays released");
        store.apply(3, &claim("a", 9), 0).unwrap();
        let a = store.get(&scope("a")).unwrap().unwrap();
        assert!(matches!(a.state, IdemState::Processing { attempt: 1, .. }));
        // The next entry applies as usual.
        store.apply(6, &complete("a", 1, created()), 20).unwrap();
        assert!(matches!(
            store.apply(7, &claim("a", 3), 30).unwrap(),
            IdemOutcome::Replay(_)
        ));
    }

    #[test]
    fn ticks_forget_records_whose_tombstone_window_ended() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        store.apply(1, &claim("a", 1), 0).unwrap();
        store.apply(2, &claim("b", 2), 5).unwrap();
        assert_eq!(store.next_purge_ms().unwrap(), Some(20_000));
        assert_eq!(store.purge(3, 19_999, 100).unwrap(), 0);
        assert_eq!(store.purge(4, 20_000, 100).unwrap(), 1);
        assert_eq!(store.get(&scope("a")).unwrap(), None);
        assert!(store.get(&scope("b")).unwrap().is_some());
        assert_eq!(store.next_purge_ms().unwrap(), Some(20_005));
        // Bounded per tick, and a re-applied tick does nothing.
        assert_eq!(store.purge(4, 99_999, 100).unwrap(), 0);
        assert_eq!(store.purge(5, 99_999, 0).unwrap(), 0);
        assert_eq!(store.purge(6, 99_999, 1).unwrap(), 1);
        assert_eq!(store.next_purge_ms().unwrap(), None);
    }

    #[test]
    fn unknown_records_are_listed_in_bounded_pages_from_the_unsettled_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        // Five claims (lease 1 s): "c" finishes, "d" is answered unknown, the others' owners
        // go silent.
        for (i, key) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            store.apply(i as u64 + 1, &claim(key, i as u64), 0).unwrap();
        }
        store.apply(6, &complete("c", 2, created()), 10).unwrap();
        store
            .apply(7, &complete("d", 3, Completion::Unknown), 10)
            .unwrap();
        let keys = |page: &UnknownPage| -> Vec<String> {
            page.records.iter().map(|(s, _)| s.key.clone()).collect()
        };
        // Before the leases end only the answered-unknown one is listed.
        let page = store.unknown_page(500, None, 10).unwrap();
        assert_eq!(keys(&page), ["d"]);
        assert_eq!(page.next, None);

        // After: every unsettled one, two to a page, the cursor carrying on.
        let first = store.unknown_page(1_000, None, 2).unwrap();
        assert_eq!(keys(&first), ["a", "b"]);
        let second = store.unknown_page(1_000, first.next.as_deref(), 2).unwrap();
        assert_eq!(keys(&second), ["d", "e"]);
        assert_eq!(second.next, None);

        // Settling, purging and installing keep the index in step with the records.
        store
            .apply(8, &complete("a", 0, Completion::NotRun), 1_100)
            .unwrap();
        assert_eq!(
            keys(&store.unknown_page(1_200, None, 10).unwrap()),
            ["b", "d", "e"]
        );
        assert_eq!(store.purge(9, 20_000, 100).unwrap(), 4);
        assert!(store
            .unknown_page(1_200, None, 10)
            .unwrap()
            .records
            .is_empty());
        let installed = IdemRecord {
            fingerprint: "fp".into(),
            state: IdemState::Unknown { attempt: 4 },
            created_ms: 0,
            expires_at_ms: 50_000,
            purge_at_ms: 60_000,
        };
        store
            .replace_all([Ok((scope("z"), installed))], 10)
            .unwrap();
        assert_eq!(keys(&store.unknown_page(30_000, None, 10).unwrap()), ["z"]);
        // Expired records are not offered for resolution.
        assert!(store
            .unknown_page(50_000, None, 10)
            .unwrap()
            .records
            .is_empty());
    }

    #[test]
    fn a_keyspace_written_before_the_index_is_indexed_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        store.apply(1, &claim("old", 1), 0).unwrap();
        // As an older version left it: records, no unsettled index, no version.
        let ks = store.ks().clone();
        ks.remove(unsettled_key(&scope("old"))).unwrap();
        ks.remove(VERSION).unwrap();
        assert!(store
            .unknown_page(5_000, None, 10)
            .unwrap()
            .records
            .is_empty());
        store.upgrade().unwrap();
        let page = store.unknown_page(5_000, None, 10).unwrap();
        assert_eq!(page.records.len(), 1);
        assert_eq!(
            store.applied_marker().unwrap(),
            1,
            "the marker is untouched"
        );
    }

    #[test]
    fn a_snapshot_view_moves_every_record_to_another_node() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (leader, follower) = (open(d1.path()), open(d2.path()));
        for (i, key) in ["x", "y/z", "ключ"].iter().enumerate() {
            leader
                .apply(i as u64 + 1, &claim(key, i as u64), 0)
                .unwrap();
        }
        let view = leader.snapshot();
        // Writes after the view are not in it.
        leader.apply(10, &claim("late", 7), 0).unwrap();
        let entries: Vec<IdemEntry> = leader.entries(&view).collect::<Result<_, _>>().unwrap();
        assert_eq!(entries.len(), 3);

        follower.apply(1, &claim("stale", 1), 0).unwrap();
        follower
            .replace_all(entries.iter().cloned().map(Ok), 3)
            .unwrap();
        assert_eq!(follower.get(&scope("stale")).unwrap(), None);
        assert_eq!(follower.applied_marker().unwrap(), slot(3, 1_023));
        for (scope, rec) in &entries {
            assert_eq!(follower.get(scope).unwrap().as_ref(), Some(rec));
        }
        assert_eq!(follower.next_purge_ms().unwrap(), Some(20_000));
    }

    /// Installing a snapshot's records goes in many batches; one cut short (here by a
    /// damaged record halfway) is visible afterwards, and installing again completes it.
    #[test]
    fn an_interrupted_install_is_seen_and_redone() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        store.apply(1, &claim("before", 1), 0).unwrap();
        let many = |n: u64| {
            (0..n).map(|i| {
                Ok((
                    scope(&format!("k{i:06}")),
                    IdemRecord {
                        fingerprint: format!("fp{i}"),
                        state: IdemState::Unknown { attempt: i },
                        created_ms: 0,
                        expires_at_ms: 50_000,
                        purge_at_ms: 60_000 + i,
                    },
                ))
            })
        };
        let damaged = many(25_000)
            .take(15_000)
            .chain(std::iter::once(Err(StoreError::Corrupt {
                what: "test",
                detail: "a damaged record".into(),
            })));
        assert!(store.replace_all(damaged, 40).is_err());
        assert!(store.install_unfinished().unwrap());
        assert_eq!(
            store.applied_marker().unwrap(),
            1,
            "the marker stays behind"
        );
        drop(store);

        let store = open(dir.path());
        assert!(store.install_unfinished().unwrap(), "seen after a restart");
        store.replace_all(many(25_000), 40).unwrap();
        assert!(!store.install_unfinished().unwrap());
        assert_eq!(store.applied_marker().unwrap(), slot(40, 1_023));
        assert_eq!(store.get(&scope("before")).unwrap(), None);
        assert!(store.get(&scope("k024999")).unwrap().is_some());
        let view = store.snapshot();
        assert_eq!(store.entries(&view).count(), 25_000);
        assert_eq!(store.next_purge_ms().unwrap(), Some(60_000));
    }
}
