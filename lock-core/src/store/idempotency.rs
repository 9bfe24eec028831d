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
//! safe is that the snapshot keyspace is written with `SyncAll` in the same database, so by the
//! time a snapshot at index S is durable (and the log before S may be purged), every record
//! write up to S is durable too.
//!
//! Keys (all in one keyspace):
//!
//! | key                                   | value                 |
//! |---------------------------------------|-----------------------|
//! | `r` + scope                           | JSON `IdemRecord`     |
//! | `x` + purge time (8 bytes BE) + scope | empty (purge index)   |
//! | `m`                                   | applied marker (8 BE) |
//!
//! where scope is tenant, route and key, each prefixed by its length (2 bytes BE).

use fjall::{Keyspace, OwnedWriteBatch as WriteBatch, Readable, Snapshot};

use super::{decode, encode, Db, StoreError};
use crate::machine::{
    IdemCommand, IdemOutcome, IdemRecord, IdemScope, IdempotencyMachine, RecordWrite,
};

const RECORD: u8 = b'r';
const PURGE: u8 = b'x';
const MARKER: &[u8] = b"m";

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

    /// Applies `cmd` (log entry `index`, log time `now_ms`). An entry at or below the marker was
    /// already applied before a restart: nothing is written, and the outcome (which nobody
    /// waits for any more) says so.
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
            batch.remove(self.ks(), key.to_vec());
            batch.remove(self.ks(), rk);
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
    pub(crate) fn entries(&self, view: &Snapshot) -> Result<Vec<IdemEntry>, StoreError> {
        let mut out = Vec::new();
        for item in view.prefix(self.ks(), [RECORD]) {
            let (key, value) = item.into_inner()?;
            let rec: IdemRecord = decode("idempotency record", &value)?;
            out.push((parse_scope(&key[1..])?, rec));
        }
        Ok(out)
    }

    /// Replaces every record with `entries` as of log entry `index` (snapshot install or
    /// recovery), in one synced batch: a crash leaves either the old or the new set.
    pub(crate) fn replace_all(&self, entries: &[IdemEntry], index: u64) -> Result<(), StoreError> {
        let mut batch = self
            .db
            .db
            .batch()
            .durability(Some(fjall::PersistMode::SyncAll));
        for item in self.ks().iter() {
            let (key, _) = item.into_inner()?;
            batch.remove(self.ks(), key.to_vec());
        }
        for (scope, rec) in entries {
            batch.insert(self.ks(), purge_key(rec.purge_at_ms, scope), b"");
            batch.insert(
                self.ks(),
                record_key(scope),
                encode("idempotency record", rec)?,
            );
        }
        self.commit(batch, index)
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
        let entries = leader.entries(&view).unwrap();
        assert_eq!(entries.len(), 3);

        follower.apply(1, &claim("stale", 1), 0).unwrap();
        follower.replace_all(&entries, 3).unwrap();
        assert_eq!(follower.get(&scope("stale")).unwrap(), None);
        assert_eq!(follower.applied_marker().unwrap(), 3);
        for (scope, rec) in &entries {
            assert_eq!(follower.get(scope).unwrap().as_ref(), Some(rec));
        }
        assert_eq!(follower.next_purge_ms().unwrap(), Some(20_000));
    }
}
