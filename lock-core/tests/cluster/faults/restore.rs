//! Disaster recovery: a cluster that lost its data is made again from a backup. The restored
//! cluster ends the backup's leases (the lost cluster may have superseded them), issues no token
//! the lost cluster may have issued after the backup, and a member still holding the lost
//! cluster's log follows the restored state instead of mixing the two.

use std::time::Duration;

use lock_core::node::{prepare_backup, restore_data_dir, restored_at_ms, Policy, RESTORING_FILE};
use lock_core::store::backup::{self, INDEX_JUMP, TERM_JUMP, TOKEN_GAP};
use lock_core::testkit::{phase, TestCluster};
use serde_json::Value;

use super::EVENT;

const HOUR_MS: u64 = 3_600_000;

/// A 3-node cluster whose leases outlive the test.
async fn cluster() -> TestCluster {
    let policy = Policy {
        max_ttl_ms: HOUR_MS,
        ..Policy::default()
    };
    TestCluster::start_with(3, policy).await
}

fn token(v: &Value) -> u64 {
    v["fencing_token"].as_u64().unwrap_or_else(|| panic!("{v}"))
}

/// Stops every node, prepares the backup `file` once, then replaces the data directories of
/// `restored` with ones made from the prepared file. Returns the restored token floor.
async fn restore(c: &mut TestCluster, file: &std::path::Path, restored: &[u64]) -> u64 {
    for id in c.running() {
        c.stop(id).await;
    }
    let prepared = c.data_root().join("restore.prepared");
    let (_, ready) = prepare_backup(&c.config(1), file, &prepared).expect("prepare the backup");
    assert_eq!(ready.state.active_locks, 0, "{ready:?}");
    for &id in restored {
        let dir = c.data_root().join(format!("node{id}"));
        std::fs::remove_dir_all(&dir).expect("remove the lost data directory");
        let summary = restore_data_dir(&c.config(id), &prepared, None)
            .await
            .unwrap_or_else(|e| panic!("restore node {id}: {e}"));
        assert!(dir.join("node-id").exists(), "the directory is claimed");
        assert!(!dir.join(RESTORING_FILE).exists(), "the marker is gone");
        assert!(
            restored_at_ms(&dir).is_some(),
            "the directory says when it was restored (its proxy asks about unknown keys)"
        );
        assert_eq!((summary.term, summary.index), (ready.term, ready.index));
        eprintln!("node {id} restored: {summary:?}");
    }
    ready.token_floor
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_restored_from_a_backup_ends_its_leases_and_reissues_no_token() {
    let mut c = cluster().await;
    let leader = c.wait_leader(EVENT).await;
    let follower = c.followers(leader)[0];

    phase("20,000 leases, then a backup taken on a follower");
    let kept = c.acquire_many(leader, "kept", 20_000, 64, HOUR_MS).await;
    let file = c.data_root().join("cluster.backup");
    let committed = c.last_applied(leader).await;
    let (term, index) = c.backup(follower, &file).await;
    assert!(
        index >= committed,
        "the backup ends at {index}, before {committed}, committed before it was asked for"
    );
    let summary = backup::inspect(&file).expect("the backup reads back whole");
    assert_eq!((summary.term, summary.index), (term, index));
    assert_eq!(summary.active_locks, 20_000, "{summary:?}");
    assert_eq!(summary.members, vec![1, 2, 3]);

    phase("after the backup the lost cluster goes on: new leases, and one lease superseded");
    let later = c.acquire_many(leader, "later", 500, 16, HOUR_MS).await;
    let superseded = &kept[0];
    let resource = superseded["resource"].as_str().unwrap().to_string();
    let (status, _) = c
        .post(
            leader,
            &format!("/v1/locks/{resource}/release"),
            serde_json::json!({"lease_id": superseded["lease_id"]}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, successor) = c.acquire(leader, &resource, "successor", HOUR_MS).await;
    assert_eq!(status, 200, "{successor}");
    let highest_issued = later
        .iter()
        .map(token)
        .chain([token(&successor)])
        .max()
        .expect("tokens");

    phase("every member loses its data; all three are restored from the backup");
    let floor = restore(&mut c, &file, &[1, 2, 3]).await;
    assert!(floor >= summary.last_token + TOKEN_GAP, "floor {floor}");
    for id in [1, 2, 3] {
        c.restart(id).await;
    }
    let leader = c.wait_leader(EVENT).await;
    let status = c.cluster_status(leader).await;
    assert!(status.term > term + TERM_JUMP, "{status:?}");
    assert!(status.last_applied > index + INDEX_JUMP, "{status:?}");

    phase("the backup's leases ended on every member; their holders' renewals fail");
    for grant in kept.iter().step_by(101) {
        let resource = grant["resource"].as_str().unwrap();
        for id in [1, 2, 3] {
            let (status, lock) = c.get(id, &format!("/v1/locks/{resource}")).await;
            assert_eq!(status, 200, "{lock}");
            assert_eq!(lock["held"], false, "{resource} on node {id}: {lock}");
            assert_eq!(lock["fencing_token"], grant["fencing_token"], "{lock}");
        }
    }
    // The holder superseded after the backup: had its lease come back, it could renew it and
    // write again after its successor.
    let (status, renewed) = c
        .post(
            leader,
            &format!("/v1/locks/{resource}/renew"),
            serde_json::json!({"lease_id": superseded["lease_id"]}),
        )
        .await;
    assert_eq!(status, 409, "{renewed}");
    assert_eq!(renewed["error"], "lease_lost", "{renewed}");
    // A retried acquire of the backup's gets its original answer, an ended lease.
    let (status, again) = c.acquire(leader, &resource, "kept-0", HOUR_MS).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["lease_id"], superseded["lease_id"]);

    phase("new leases get tokens above every token the lost cluster issued");
    let (status, fresh) = c.acquire(leader, &resource, "after-restore", 10_000).await;
    assert_eq!(status, 200, "{fresh}");
    assert!(
        token(&fresh) > floor && token(&fresh) > highest_issued,
        "{fresh}"
    );
    for grant in later.iter().step_by(25) {
        let resource = grant["resource"].as_str().unwrap();
        let (_, lock) = c.get(leader, &format!("/v1/locks/{resource}")).await;
        assert_eq!(lock["held"], false, "{lock}");
        assert!(
            lock["fencing_token"].is_null(),
            "unknown to the backup: {lock}"
        );
        let (status, fresh) = c
            .acquire(leader, resource, &format!("again-{resource}"), 10_000)
            .await;
        assert_eq!(status, 200, "{fresh}");
        assert!(
            token(&fresh) > floor,
            "a token the lost cluster may have issued came again: {fresh}"
        );
    }

    phase("a backup of the restored cluster, prepared twice, gives two distinct floors");
    // Its tokens start near the wall clock in µs, so only the time since the backup can
    // separate two preparations of it.
    let second = c.data_root().join("restored.backup");
    c.backup(leader, &second).await;
    let (_, one) = prepare_backup(&c.config(1), &second, &c.data_root().join("one.prepared"))
        .expect("prepare");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (_, two) = prepare_backup(&c.config(1), &second, &c.data_root().join("two.prepared"))
        .expect("prepare again");
    assert!(
        two.token_floor > one.token_floor && two.term > one.term && two.index > one.index,
        "{one:?} then {two:?}"
    );

    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_left_with_the_lost_clusters_log_follows_the_restored_cluster() {
    let mut c = cluster().await;
    let leader = c.wait_leader(EVENT).await;

    phase("a backup, then entries the backup lacks");
    let before = c.acquire_many(leader, "before", 1_000, 16, HOUR_MS).await;
    let file = c.data_root().join("cluster.backup");
    c.backup(leader, &file).await;
    let after = c.acquire_many(leader, "after", 1_000, 16, HOUR_MS).await;
    c.wait_caught_up(3, Duration::from_secs(30)).await;

    phase("nodes 1 and 2 are restored; node 3 keeps the lost cluster's longer log");
    restore(&mut c, &file, &[1, 2]).await;
    for id in [1, 2, 3] {
        c.restart(id).await;
    }
    let leader = c.wait_leader(EVENT).await;
    assert_ne!(leader, 3, "the member with the old log was elected");
    c.wait_caught_up(3, Duration::from_secs(60)).await;

    phase("node 3 holds the restored state: the backup's records, nothing granted after it");
    for grant in before.iter().step_by(37) {
        let resource = grant["resource"].as_str().unwrap();
        let (_, lock) = c.get(3, &format!("/v1/locks/{resource}")).await;
        assert_eq!(lock["fencing_token"], grant["fencing_token"], "{lock}");
        assert_eq!(lock["held"], false, "{lock}");
    }
    for grant in after.iter().step_by(37) {
        let resource = grant["resource"].as_str().unwrap();
        let (_, lock) = c.get(3, &format!("/v1/locks/{resource}")).await;
        assert!(lock["fencing_token"].is_null(), "{lock}");
    }
    let snapshot = c.node(3).node.raft.metrics().borrow().snapshot;
    assert!(
        snapshot.is_some_and(|s| s.index > INDEX_JUMP),
        "node 3 took the restored state by snapshot: {snapshot:?}"
    );

    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_refuses_what_it_cannot_do_safely() {
    let mut c = cluster().await;
    let leader = c.wait_leader(EVENT).await;
    c.acquire_many(leader, "x", 100, 4, HOUR_MS).await;
    let file = c.data_root().join("cluster.backup");
    c.backup(leader, &file).await;
    c.stop(1).await;
    let prepared = c.data_root().join("restore.prepared");
    let (_, first) = prepare_backup(&c.config(1), &file, &prepared).expect("prepare");

    phase("preparing again starts above the earlier preparation");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let again = c.data_root().join("again.prepared");
    let (_, second) = prepare_backup(&c.config(1), &file, &again).expect("prepare again");
    assert!(
        second.token_floor > first.token_floor
            && second.term > first.term
            && second.index > first.index,
        "{first:?} then {second:?}"
    );
    let e = prepare_backup(&c.config(1), &prepared, &again).expect_err("prepared twice");
    assert!(e.to_string().contains("prepared backup already"), "{e}");

    phase("a clock behind the backup's log time is refused: it would start below the first");
    let members = backup::prepared_members(&prepared).expect("members");
    let log_time = backup::inspect(&file).expect("inspect").log_time_ms;
    let behind = c.data_root().join("behind.prepared");
    let e = backup::prepare(&file, &behind, &members, log_time - 86_400_000)
        .expect_err("prepared with a clock a day behind");
    assert!(
        e.to_string().contains("clock reads 86400.0 s before"),
        "{e}"
    );
    assert!(!behind.exists(), "a refused preparation wrote a file");
    backup::prepare(&file, &behind, &members, log_time - 1_000)
        .expect("a clock a second behind is within the tolerance");

    phase("a backup that was not prepared, and other members than prepared for, are refused");
    let mut fresh = c.config(1);
    fresh.data_dir = c.data_root().join("fresh");
    let e = restore_data_dir(&fresh, &file, None)
        .await
        .expect_err("restored an unprepared backup");
    assert!(e.to_string().contains("not a prepared one"), "{e}");
    let mut other = fresh.clone();
    if let Some(m) = other.initial_members.get_mut(&3) {
        m.api = "127.0.0.1:1".into();
    }
    let e = restore_data_dir(&other, &prepared, None)
        .await
        .expect_err("restored for other members");
    assert!(
        e.to_string().contains("was prepared for the members"),
        "{e}"
    );
    assert!(!fresh.data_dir.exists(), "a refusal wrote a directory");

    phase("a config whose own entry names other addresses than the node announces is refused");
    let elsewhere = lock_core::raft::NodeInfo {
        api_addr: "127.0.0.1:2".into(),
        peer_addr: "127.0.0.1:3".into(),
    };
    let e = restore_data_dir(&fresh, &prepared, Some(&elsewhere))
        .await
        .expect_err("restored under another member's id");
    assert!(
        e.to_string().contains("initial_members lists node 1"),
        "{e}"
    );
    assert!(!fresh.data_dir.exists(), "a refusal wrote a directory");

    phase("a directory that holds a node's data, or a path with `..`, is left alone");
    let config = c.config(1);
    let e = restore_data_dir(&config, &prepared, None)
        .await
        .expect_err("restored over live data");
    assert!(e.to_string().contains("is not empty"), "{e}");
    assert!(config.data_dir.join("node-id").exists());
    let mut dotted = c.config(1);
    dotted.data_dir = c.data_root().join("missing").join("..");
    let e = restore_data_dir(&dotted, &prepared, None)
        .await
        .expect_err("restored through `..`");
    assert!(e.to_string().contains("`..`"), "{e}");

    phase("a prepared backup damaged at its end is refused and leaves the directory empty");
    let bytes = std::fs::read(&prepared).expect("read");
    let cut = c.data_root().join("cut.prepared");
    std::fs::write(&cut, &bytes[..bytes.len() - 2]).expect("write");
    let e = restore_data_dir(&fresh, &cut, None)
        .await
        .expect_err("restored a damaged backup");
    eprintln!("refused: {e}");
    let left: Vec<_> = std::fs::read_dir(&fresh.data_dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a failed restore left {left:?}");

    phase("a node refuses a directory whose restore did not finish");
    std::fs::create_dir_all(&fresh.data_dir).expect("dir");
    std::fs::write(fresh.data_dir.join(RESTORING_FILE), b"").expect("marker");
    let api = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let peer = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let refused = lock_core::server::start(fresh, api, peer, std::future::pending()).await;
    let e = refused
        .err()
        .expect("a node started on an unfinished restore");
    assert!(e.to_string().contains("unfinished restore"), "{e}");

    c.shutdown().await;
}
