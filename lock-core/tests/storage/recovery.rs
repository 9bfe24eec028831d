//! Reopen-and-compare: write, drop everything, reopen the same directory, and check that what
//! raft relies on came back exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Context, Result};
use lock_core::machine::{Acquire, Command, Effect, LeaseId, Proposal, Response};
use lock_core::raft::{NodeInfo, SnapshotStream, TypeConfig};
use lock_core::store::{self, EffectSink, LogStore, StateMachineStore};
use lock_core::testkit::phase;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogReader, RaftSnapshotBuilder,
    StoredMembership, Vote,
};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

type Effects = Arc<Mutex<Vec<(u64, Vec<Effect>)>>>;

/// The whole of a snapshot's bytes, as a leader would send them.
async fn bytes_of(mut stream: Box<SnapshotStream>) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    stream.seek(std::io::SeekFrom::Start(0)).await?;
    stream.read_to_end(&mut bytes).await?;
    Ok(bytes)
}

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn normal(term: u64, index: u64, now_ms: u64, cmd: Command) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(
            Proposal {
                now_ms,
                failover_grace_ms: 2_000,
                cmd,
            }
            .into(),
        ),
    }
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn membership() -> Membership<u64, NodeInfo> {
    let nodes: BTreeMap<u64, NodeInfo> = (1..=3)
        .map(|id| {
            let info = NodeInfo {
                api_addr: format!("127.0.0.1:{}", 7000 + id),
                peer_addr: format!("127.0.0.1:{}", 7100 + id),
            };
            (id, info)
        })
        .collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)
}

fn acquire(resource: &str, request_id: &str, lease: u128, wait_timeout_ms: u64) -> Command {
    Command::Acquire(Acquire {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
        holder: Some(format!("holder-{request_id}")),
        ttl_ms: 30_000,
        wait_timeout_ms,
        lease_id: LeaseId(lease),
        retain_ms: 600_000,
        max_waiters: 16,
        max_total_waiters: 1_000,
        tenant_limits: None,
    })
}

fn open(dir: &Path) -> Result<(LogStore, StateMachineStore, Effects)> {
    let effects: Effects = Arc::default();
    let sink_effects = effects.clone();
    let sink: EffectSink = Arc::new(move |index, fx: &[Effect]| {
        if let Ok(mut all) = sink_effects.lock() {
            all.push((index, fx.to_vec()));
        }
    });
    let (log, sm) = store::open(dir, sink).context("open store")?;
    Ok((log, sm, effects))
}

/// A log with a membership change, a term change, a grant, a queued waiter, a hand-off by
/// release and a renewal.
fn history() -> Vec<Entry<TypeConfig>> {
    let members = Entry {
        log_id: log_id(1, 1),
        payload: EntryPayload::Membership(membership()),
    };
    vec![
        members,
        blank(1, 2),
        normal(1, 3, 1_000, acquire("db:1", "a", 0xA, 0)),
        normal(1, 4, 1_100, acquire("db:1", "b", 0xB, 5_000)),
        normal(
            1,
            5,
            1_200,
            Command::Release {
                resource: "db:1".into(),
                lease_id: LeaseId(0xA),
            },
        ),
        blank(2, 6),
        normal(2, 7, 4_000, acquire("db:2", "c", 0xC, 0)),
        normal(
            2,
            8,
            5_000,
            Command::Renew {
                resource: "db:2".into(),
                lease_id: LeaseId(0xC),
            },
        ),
    ]
}

#[tokio::test]
async fn reopen_restores_vote_committed_log_snapshot_and_machine() -> Result<()> {
    let dir = TempDir::new()?;
    let entries = history();
    let vote = Vote::new_committed(2, 1);
    let committed = Some(log_id(2, 8));

    phase("append, vote, commit and apply the first seven entries");
    let (mut log, mut sm, effects) = open(dir.path())?;
    log.blocking_append(entries[..4].to_vec()).await?;
    log.blocking_append(entries[4..].to_vec()).await?;
    log.save_vote(&vote).await?;
    log.save_committed(committed).await?;
    // Written by the log's flusher thread later, but read back at once (openraft's own suite
    // skips its re-apply check for a store that reads back nothing).
    ensure!(
        log.read_committed().await? == committed,
        "committed reads back"
    );

    let responses = sm.apply(entries[..7].to_vec()).await?;
    ensure!(
        responses.len() == 7,
        "one response per entry: {responses:?}"
    );
    // Each entry is a batch of one command: one response each.
    ensure!(matches!(&responses[2][..], [Response::Granted(g)] if g.fencing_token == 1));
    ensure!(responses[3] == [Response::Queued { position: 1 }]);
    ensure!(responses[4] == [Response::Released(true)]);
    // The release handed db:1 to "b" (token 2), so db:2's first lease gets token 3.
    ensure!(matches!(&responses[6][..], [Response::Granted(g)] if g.fencing_token == 3));
    let handed: Vec<u64> = effects
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .iter()
        .filter(|(_, fx)| fx.iter().any(|e| matches!(e, Effect::HandedOff { .. })))
        .map(|(index, _)| *index)
        .collect();
    ensure!(
        handed == vec![5],
        "hand-off reported at index 5, got {handed:?}"
    );

    phase("snapshot at index 7, then apply entry 8");
    let shared = sm.shared();
    let snapshot_image = shared.read(|m| m.image());
    let snap = sm.get_snapshot_builder().await.build_snapshot().await?;
    ensure!(snap.meta.last_log_id == Some(log_id(2, 7)));
    ensure!(snap.meta.last_membership == StoredMembership::new(Some(log_id(1, 1)), membership()));
    let snap_bytes = bytes_of(snap.snapshot).await?;
    sm.apply(entries[7..].to_vec()).await?;
    ensure!(shared.last_applied_index() == 8);
    let final_image = shared.read(|m| m.image());
    let log_state = log.get_log_state().await?;
    drop((log, sm, shared));

    phase("reopen and compare");
    let (mut log, mut sm, _effects) = open(dir.path())?;
    ensure!(log.read_vote().await? == Some(vote), "vote survives");
    ensure!(
        log.read_committed().await? == committed,
        "committed survives"
    );
    ensure!(
        log.try_get_log_entries(..).await? == entries,
        "log survives"
    );
    ensure!(
        log.get_log_state().await? == log_state,
        "log state survives"
    );
    ensure!(log_state.last_log_id == Some(log_id(2, 8)) && log_state.last_purged_log_id.is_none());

    let current = sm
        .get_current_snapshot()
        .await?
        .context("snapshot survives")?;
    ensure!(current.meta == snap.meta, "snapshot meta survives");
    ensure!(
        bytes_of(current.snapshot).await? == snap_bytes,
        "snapshot bytes survive"
    );

    // The machine restarts from the snapshot, not from the last applied entry.
    let (applied, members) = sm.applied_state().await?;
    ensure!(applied == Some(log_id(2, 7)));
    ensure!(members == snap.meta.last_membership);
    let shared = sm.shared();
    ensure!(
        shared.read(|m| m.image()) == snapshot_image,
        "machine restored from snapshot"
    );

    phase("re-applying the committed tail reaches the pre-drop state");
    // What openraft does at startup: apply (last_applied, committed] from the log.
    let tail = log.try_get_log_entries(8..=8).await?;
    sm.apply(tail).await?;
    ensure!(
        shared.read(|m| m.image()) == final_image,
        "replay reaches the final state"
    );

    phase("a later snapshot gets a new id");
    let again = sm.get_snapshot_builder().await.build_snapshot().await?;
    ensure!(again.meta.last_log_id == Some(log_id(2, 8)));
    ensure!(
        again.meta.snapshot_id != snap.meta.snapshot_id,
        "snapshot ids stay unique"
    );
    Ok(())
}

fn blanks(term: u64, range: std::ops::RangeInclusive<u64>) -> Vec<Entry<TypeConfig>> {
    range.map(|i| blank(term, i)).collect()
}

#[tokio::test]
async fn purge_survives_reopen() -> Result<()> {
    let dir = TempDir::new()?;
    phase("append entries 1..=10 and purge up to 4");
    {
        let (mut log, _sm, _) = open(dir.path())?;
        log.save_vote(&Vote::new_committed(1, 1)).await?;
        log.blocking_append(blanks(1, 1..=10)).await?;
        log.purge(log_id(1, 4)).await?;
    }

    phase("reopen after purging up to 4");
    let (mut log, _sm, _) = open(dir.path())?;
    let state = log.get_log_state().await?;
    ensure!(state.last_purged_log_id == Some(log_id(1, 4)), "{state:?}");
    ensure!(state.last_log_id == Some(log_id(1, 10)), "{state:?}");
    ensure!(log.try_get_log_entries(..).await? == blanks(1, 5..=10));

    phase("purge everything, reopen: the log ends at the purge marker");
    log.purge(log_id(1, 10)).await?;
    drop((log, _sm));
    let (mut log, _sm, _) = open(dir.path())?;
    let state = log.get_log_state().await?;
    ensure!(state.last_purged_log_id == Some(log_id(1, 10)), "{state:?}");
    ensure!(state.last_log_id == Some(log_id(1, 10)), "{state:?}");
    ensure!(log.try_get_log_entries(..).await?.is_empty());
    Ok(())
}

/// A follower that installs a snapshot far ahead of its own log purges up to the snapshot's
/// index and appends after it; the entries it appends are never deleted with the purged ones.
#[tokio::test]
async fn purge_past_the_end_of_the_log_keeps_what_is_appended_after() -> Result<()> {
    let dir = TempDir::new()?;
    phase("append 1..=10, purge up to 1,000 (a snapshot ahead of the log), append 1001..=1005");
    {
        let (mut log, _sm, _) = open(dir.path())?;
        log.save_vote(&Vote::new_committed(1, 1)).await?;
        log.blocking_append(blanks(1, 1..=10)).await?;
        log.purge(log_id(1, 1_000)).await?;
        log.blocking_append(blanks(1, 1_001..=1_005)).await?;
        ensure!(log.try_get_log_entries(1_001..).await? == blanks(1, 1_001..=1_005));
    }

    phase("reopen: the log is 1001..=1005 behind the marker at 1,000");
    let (mut log, _sm, _) = open(dir.path())?;
    let state = log.get_log_state().await?;
    ensure!(
        state.last_purged_log_id == Some(log_id(1, 1_000)),
        "{state:?}"
    );
    ensure!(state.last_log_id == Some(log_id(1, 1_005)), "{state:?}");
    ensure!(log.try_get_log_entries(..).await? == blanks(1, 1_001..=1_005));
    Ok(())
}

#[tokio::test]
async fn truncate_survives_reopen() -> Result<()> {
    let dir = TempDir::new()?;
    phase("append entries 1..=10 and truncate from 6");
    {
        let (mut log, _sm, _) = open(dir.path())?;
        log.save_vote(&Vote::new_committed(1, 1)).await?;
        log.blocking_append(blanks(1, 1..=10)).await?;
        log.truncate(log_id(1, 6)).await?;
    }

    phase("reopen after truncating from 6");
    let (mut log, _sm, _) = open(dir.path())?;
    ensure!(log.get_log_state().await?.last_log_id == Some(log_id(1, 5)));
    ensure!(log.try_get_log_entries(..).await? == blanks(1, 1..=5));

    phase("a new leader's entry 6 replaces the old one; 7..=10 stay gone");
    log.save_vote(&Vote::new_committed(2, 2)).await?;
    log.blocking_append(vec![blank(2, 6)]).await?;
    drop((log, _sm));
    let (mut log, _sm, _) = open(dir.path())?;
    let mut expected = blanks(1, 1..=5);
    expected.push(blank(2, 6));
    ensure!(log.try_get_log_entries(..).await? == expected);
    ensure!(log.get_log_state().await?.last_log_id == Some(log_id(2, 6)));
    Ok(())
}

#[tokio::test]
async fn installed_snapshot_survives_reopen() -> Result<()> {
    let leader_dir = TempDir::new()?;
    let follower_dir = TempDir::new()?;

    phase("build a snapshot on one store");
    let (_log, mut leader, _) = open(leader_dir.path())?;
    leader.apply(history()).await?;
    let image = leader.shared().read(|m| m.image());
    let snap = leader.get_snapshot_builder().await.build_snapshot().await?;

    phase("install it on another, which has applied nothing");
    let (mut flog, mut follower, _) = open(follower_dir.path())?;
    // Raft saves the sending leader's vote before it installs its snapshot.
    flog.save_vote(&Vote::new_committed(2, 1)).await?;
    let mut received = follower.begin_receiving_snapshot().await?;
    let mut sent = snap.snapshot;
    tokio::io::copy(&mut *sent, &mut *received).await?;
    tokio::io::AsyncWriteExt::shutdown(&mut *received).await?;
    follower.install_snapshot(&snap.meta, received).await?;
    ensure!(follower.shared().read(|m| m.image()) == image);
    ensure!(follower.shared().last_applied_index() == 8);
    drop((flog, follower));

    phase("reopen the follower: the installed state is what comes back");
    let (_flog, mut follower, _) = open(follower_dir.path())?;
    ensure!(follower.shared().read(|m| m.image()) == image);
    ensure!(follower.applied_state().await?.0 == Some(log_id(2, 8)));
    let current = follower
        .get_current_snapshot()
        .await?
        .context("installed snapshot kept")?;
    ensure!(current.meta == snap.meta);
    drop((_flog, follower));

    phase("the directory keeps its snapshot but loses its log and database: refused");
    for item in std::fs::read_dir(follower_dir.path())? {
        let path = item?.path();
        if path.file_name().is_some_and(|n| n == "snapshots") {
            continue;
        }
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    let refused = match open(follower_dir.path()) {
        Ok(_) => bail!("a snapshot without its vote opened as a voter's state"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        refused.contains("vote is for term 0") && refused.contains("term 2"),
        "{refused}"
    );
    Ok(())
}

/// A log whose files lost entries this node saw committed (its `raft-log` directory deleted by
/// hand, a damaged disk) is refused at open with a message that says what is missing and what
/// to do, instead of a node that would vote as if it still held them.
#[tokio::test]
async fn a_log_missing_committed_entries_is_refused_at_open() -> Result<()> {
    let dir = TempDir::new()?;
    phase("append 1..=10, commit up to 8");
    {
        let (mut log, _sm, _) = open(dir.path())?;
        log.blocking_append(blanks(1, 1..=10)).await?;
        log.save_committed(Some(log_id(1, 8))).await?;
    }

    phase("delete the log's files: the store refuses to open");
    std::fs::remove_dir_all(dir.path().join("raft-log"))?;
    let refused = match open(dir.path()) {
        Ok(_) => bail!("a log without its committed entries opened"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        refused.contains("entries 0 to 8 are missing") && refused.contains("delete all of it"),
        "{refused}"
    );
    Ok(())
}

/// A vote older than the log (fjall drops the end of a damaged journal without an error, and
/// the vote is in fjall while the log is in its own files) is refused at open: a node that went
/// on with it could vote twice in a term.
#[tokio::test]
async fn a_vote_behind_the_log_is_refused_at_open() -> Result<()> {
    let dir = TempDir::new()?;
    phase("vote in term 3, append entries of term 3");
    {
        let (mut log, _sm, _) = open(dir.path())?;
        log.save_vote(&Vote::new_committed(3, 2)).await?;
        log.blocking_append(blanks(3, 1..=10)).await?;
    }
    phase("reopen: fine");
    drop(open(dir.path())?);

    phase("the vote rolls back to term 2 (as a damaged journal leaves it): refused");
    {
        let (mut log, _sm, _) = open(dir.path())?;
        log.save_vote(&Vote::new_committed(2, 2)).await?;
    }
    let refused = match open(dir.path()) {
        Ok(_) => bail!("a vote behind the log opened"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        refused.contains("vote is for term 2") && refused.contains("entries of term 3"),
        "{refused}"
    );
    Ok(())
}

/// A vote for a term whose entries never reached this node passes every check against the
/// log. If the database loses it (fjall drops the end of a damaged journal silently), only the
/// vote's own file still knows it, and the store refuses to open instead of letting the node
/// vote a second time in that term.
#[tokio::test]
async fn a_vote_rolled_back_with_no_entries_of_its_term_is_refused_at_open() -> Result<()> {
    let dir = TempDir::new()?;
    let vote_file = dir.path().join("vote");
    phase("entries of term 3, then a vote for node 2 in term 5 (no entries of term 5 yet)");
    let kept = {
        let (mut log, _sm, _) = open(dir.path())?;
        log.save_vote(&Vote::new_committed(3, 1)).await?;
        log.blocking_append(blanks(3, 1..=10)).await?;
        log.save_vote(&Vote::new(5, 2)).await?;
        let kept = std::fs::read(&vote_file).context("the vote file")?;
        // The database's vote goes back to term 3, as a journal that lost its end leaves it;
        // the vote file keeps term 5.
        log.save_vote(&Vote::new_committed(3, 1)).await?;
        kept
    };
    std::fs::write(&vote_file, kept)?;

    phase("reopen: refused, naming both votes");
    let refused = match open(dir.path()) {
        Ok(_) => bail!("a database that lost its vote opened"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        refused.contains("holds the later vote") && refused.contains("could vote twice"),
        "{refused}"
    );
    Ok(())
}

/// The vote file is written after the database: a crash between the two leaves the file one
/// vote behind, which is not damage. A data directory of an earlier version, without the file,
/// gets one at open.
#[tokio::test]
async fn a_vote_file_behind_the_database_or_missing_is_not_damage() -> Result<()> {
    let dir = TempDir::new()?;
    let vote_file = dir.path().join("vote");
    phase("the file keeps term 3 while the database saved term 4");
    let behind = {
        let (mut log, _sm, _) = open(dir.path())?;
        log.save_vote(&Vote::new_committed(3, 1)).await?;
        let behind = std::fs::read(&vote_file)?;
        log.save_vote(&Vote::new(4, 2)).await?;
        behind
    };
    std::fs::write(&vote_file, behind)?;
    {
        let (mut log, _sm, _) = open(dir.path()).context("a file behind the database")?;
        ensure!(log.read_vote().await? == Some(Vote::new(4, 2)));
    }

    phase("no file at all: opens, and writes it");
    std::fs::remove_file(&vote_file)?;
    drop(open(dir.path()).context("no vote file")?);
    ensure!(vote_file.exists(), "the vote file was not written at open");

    phase("and it guards from then on: the database loses term 4, the file has it");
    {
        let (mut log, _sm, _) = open(dir.path())?;
        let kept = std::fs::read(&vote_file)?;
        log.save_vote(&Vote::new_committed(3, 1)).await?;
        std::fs::write(&vote_file, kept)?;
    }
    ensure!(open(dir.path()).is_err(), "a rolled-back vote opened");
    Ok(())
}
