//! When this node builds a snapshot: every [`SNAPSHOT_EVERY_ENTRIES`] applied entries, as
//! openraft's own policy would, or every [`SNAPSHOT_EVERY_COMMANDS`] applied commands, whichever
//! comes first, each at an offset of a third of its interval per node id, so the members of a
//! cluster do not all write one at the same index. A snapshot costs its node CPU and disk for a
//! few seconds; when the leader and the follower whose acknowledgements commit the log (the
//! only one, with a member down) build theirs at once, commits slow down on both sides of the
//! same seconds. The command count is part of the replicated state, so it is the same on every
//! member at the same index and the offsets keep the members apart by it as well.

use std::sync::Arc;

use super::Node;
use crate::timing::{SNAPSHOT_EVERY_COMMANDS, SNAPSHOT_EVERY_ENTRIES};

/// While a snapshot is due, ask again after this many more applied entries (openraft ignores a
/// request while it builds one).
const ASK_AGAIN_AFTER: u64 = 1_000;

pub(super) async fn run(node: Arc<Node>) {
    let offset = offset_of(node.id, SNAPSHOT_EVERY_ENTRIES);
    let command_offset = offset_of(node.id, SNAPSHOT_EVERY_COMMANDS);
    let mut rx = node.raft.metrics();
    let mut asked_at: Option<u64> = None;
    while rx.changed().await.is_ok() {
        let (applied, snapshot) = {
            let m = rx.borrow();
            (
                m.last_applied.map_or(0, |l| l.index),
                m.snapshot.map_or(0, |l| l.index),
            )
        };
        let by_entries = due(applied, snapshot, SNAPSHOT_EVERY_ENTRIES, offset);
        let by_commands = due(
            node.machine.commands_applied(),
            node.machine.commands_at_snapshot(),
            SNAPSHOT_EVERY_COMMANDS,
            command_offset,
        );
        if !by_entries && !by_commands {
            asked_at = None;
            continue;
        }
        if asked_at.is_some_and(|at| applied < at + ASK_AGAIN_AFTER) {
            continue;
        }
        asked_at = Some(applied);
        if let Err(e) = node.raft.trigger().snapshot().await {
            tracing::debug!(error = %e, "could not ask for a snapshot");
        }
    }
}

/// Node `id`'s offset into the interval: node 3 builds at each multiple of `every`, node 2 a
/// third of the interval past it and node 1 two thirds past it (ids modulo 3 beyond that).
fn offset_of(id: u64, every: u64) -> u64 {
    (id % 3) * (every / 3)
}

/// A snapshot is due once the applied index has crossed a boundary (a multiple of `every`,
/// shifted back by `offset`) that the last snapshot has not, and at least half an interval
/// after it: a snapshot installed from the leader just before a boundary does not trigger
/// another at once.
fn due(applied: u64, snapshot: u64, every: u64, offset: u64) -> bool {
    let period = |index: u64| (index + offset) / every;
    applied >= snapshot + every / 2 && period(applied) > period(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_snapshots_once_per_interval_at_its_own_offset() {
        let every = 30;
        for id in 1..=3u64 {
            let offset = offset_of(id, every);
            let mut snapshot = 0;
            let mut taken = Vec::new();
            for applied in 1..=200 {
                if due(applied, snapshot, every, offset) {
                    snapshot = applied;
                    taken.push(applied);
                }
            }
            // At the boundaries k * 30 - offset; one that comes before the first half
            // interval is taken at its end.
            let expected: Vec<u64> = (1..=7)
                .map(|k| (k * every - offset).max(every / 2))
                .filter(|&i| i <= 200)
                .collect();
            assert_eq!(taken, expected, "node {id}");
        }
        assert_ne!(offset_of(1, every), offset_of(3, every));
    }

    #[test]
    fn an_installed_snapshot_just_before_a_boundary_does_not_trigger_another() {
        let (every, offset) = (30, 0);
        assert!(!due(31, 29, every, offset), "two entries after an install");
        assert!(!due(43, 29, every, offset));
        assert!(due(44, 29, every, offset), "half an interval after it");
        assert!(!due(59, 44, every, offset), "and then at the next boundary");
        assert!(due(60, 44, every, offset));
    }

    #[test]
    fn a_snapshot_that_fell_behind_is_due_at_once() {
        assert!(due(100, 0, 30, 10));
        assert!(!due(0, 0, 30, 10));
    }
}
