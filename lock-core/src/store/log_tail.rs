//! The newest raft log entries, kept in memory as they were written.
//!
//! Raft reads every entry back soon after appending it: the leader once for each follower it
//! replicates to and once to apply it, a follower once to apply it. From the segment files each
//! of those reads is a file read, a checksum, decompression and decoding; from here it is a
//! copy of the entry, whose commands are shared (`Batch` holds them behind an `Arc`).
//!
//! The tail holds consecutive indexes ending at the newest entry written to the files, never
//! one the files do not have: entries go in after the files took them, and a truncation or
//! purge takes them out before the files drop them. A read is served from here only when the
//! whole range is here; anything else goes to the files.

use std::collections::VecDeque;

use openraft::{Entry, EntryPayload};

use crate::raft::TypeConfig;

/// At most this many entries are kept...
const MAX_ENTRIES: usize = 256;
/// ...holding at most this many commands (about a MB decoded): a quarter of a second at the
/// busiest loads measured, far more than replication and apply lag behind the newest entry
/// there. (Four times these bounds served no more reads and left nodes a few MiB larger.)
const MAX_COMMANDS: usize = 4_096;

#[derive(Default)]
pub(super) struct LogTail {
    entries: VecDeque<Entry<TypeConfig>>,
    commands: usize,
}

fn commands_in(entry: &Entry<TypeConfig>) -> usize {
    match &entry.payload {
        EntryPayload::Normal(batch) => batch.commands().count(),
        EntryPayload::Blank | EntryPayload::Membership(_) => 1,
    }
}

impl LogTail {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|e| e.log_id.index)
    }

    /// Entries just written to the files, in order, following the newest one written before.
    /// Entries that do not follow it (the first write, or after the files were cut) start the
    /// tail anew.
    pub(super) fn push(&mut self, written: Vec<Entry<TypeConfig>>) {
        for entry in written {
            let follows = self
                .entries
                .back()
                .is_some_and(|last| last.log_id.index + 1 == entry.log_id.index);
            if !follows {
                self.clear();
            }
            self.commands += commands_in(&entry);
            self.entries.push_back(entry);
        }
        while self.entries.len() > MAX_ENTRIES || self.commands > MAX_COMMANDS {
            self.pop_front();
        }
    }

    /// Entries `from..to` if every one of them is here.
    pub(super) fn get(&self, from: u64, to: u64) -> Option<Vec<Entry<TypeConfig>>> {
        let first = self.first_index()?;
        let end = first + self.entries.len() as u64;
        if from < first || to > end || from >= to {
            return None;
        }
        let range = (from - first) as usize..(to - first) as usize;
        Some(self.entries.range(range).cloned().collect())
    }

    /// The files drop entries from `index` on.
    pub(super) fn truncate(&mut self, index: u64) {
        while self.entries.back().is_some_and(|e| e.log_id.index >= index) {
            if let Some(e) = self.entries.pop_back() {
                self.commands -= commands_in(&e);
            }
        }
    }

    /// The files drop entries up to and including `index`.
    pub(super) fn purge(&mut self, index: u64) {
        while self.first_index().is_some_and(|first| first <= index) {
            self.pop_front();
        }
    }

    /// Forgets everything: after a write to the files that may have failed half-way.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.commands = 0;
    }

    fn pop_front(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.commands -= commands_in(&e);
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId};

    use super::*;
    use crate::machine::{Batch, Command};

    fn entry(index: u64, commands: usize) -> Entry<TypeConfig> {
        let cmds = vec![Command::Tick { max_items: 1 }; commands];
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Batch::new(index, 0, cmds)),
        }
    }

    fn indexes(got: Option<Vec<Entry<TypeConfig>>>) -> Option<Vec<u64>> {
        got.map(|v| v.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn serves_only_ranges_it_holds_whole() {
        let mut tail = LogTail::default();
        assert_eq!(indexes(tail.get(1, 2)), None);
        tail.push((10..20).map(|i| entry(i, 1)).collect());
        assert_eq!(indexes(tail.get(12, 15)), Some(vec![12, 13, 14]));
        assert_eq!(indexes(tail.get(10, 20)).map(|v| v.len()), Some(10));
        assert_eq!(indexes(tail.get(9, 12)), None, "starts before the tail");
        assert_eq!(
            indexes(tail.get(15, 21)),
            None,
            "ends past the newest entry"
        );
        assert_eq!(indexes(tail.get(15, u64::MAX)), None, "unbounded");
        assert_eq!(indexes(tail.get(15, 15)), None, "empty");
    }

    #[test]
    fn a_gap_or_a_rewrite_starts_it_anew() {
        let mut tail = LogTail::default();
        tail.push((1..5).map(|i| entry(i, 1)).collect());
        tail.push(vec![entry(7, 1)]);
        assert_eq!(indexes(tail.get(1, 2)), None);
        assert_eq!(indexes(tail.get(7, 8)), Some(vec![7]));
        // A new leader overwrites 7 without a truncation reaching here first.
        tail.push(vec![entry(7, 2), entry(8, 1)]);
        assert_eq!(tail.commands, 3);
        assert_eq!(indexes(tail.get(7, 9)), Some(vec![7, 8]));
    }

    #[test]
    fn truncate_and_purge_take_out_what_the_files_drop() {
        let mut tail = LogTail::default();
        tail.push((1..=10).map(|i| entry(i, 2)).collect());
        tail.truncate(8);
        assert_eq!(indexes(tail.get(7, 8)), Some(vec![7]));
        assert_eq!(indexes(tail.get(7, 9)), None);
        tail.purge(3);
        assert_eq!(indexes(tail.get(3, 5)), None);
        assert_eq!(indexes(tail.get(4, 8)), Some(vec![4, 5, 6, 7]));
        assert_eq!(tail.commands, 8);
        tail.truncate(1);
        assert_eq!(tail.commands, 0);
        assert!(tail.entries.is_empty());
    }

    #[test]
    fn stays_within_its_bounds() {
        let mut tail = LogTail::default();
        tail.push((1..=3_000).map(|i| entry(i, 1)).collect());
        assert_eq!(tail.entries.len(), MAX_ENTRIES);
        assert_eq!(tail.first_index(), Some(3_000 - MAX_ENTRIES as u64 + 1));
        tail.push((3_001..=3_010).map(|i| entry(i, 4_000)).collect());
        assert!(tail.commands <= MAX_COMMANDS, "{} commands", tail.commands);
        assert_eq!(indexes(tail.get(3_010, 3_011)), Some(vec![3_010]));
        // One entry larger than the bound is not kept at all.
        tail.push(vec![entry(3_011, MAX_COMMANDS + 1)]);
        assert_eq!((tail.entries.len(), tail.commands), (0, 0));
    }
}
