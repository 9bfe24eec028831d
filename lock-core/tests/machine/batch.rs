//! The machine applies a batch (one raft entry carrying the commands the leader coalesced) as
//! its commands in order under the batch's one stamp: exactly what applying them one by one
//! with that stamp would do. Dedup of retried acquires works inside a batch and across
//! batches.

use lock_core::machine::{
    Acquire, Batch, Command, LeaseId, LockMachine, Proposal, Response, RestoredImage,
};
use proptest::prelude::*;

const GRACE: u64 = 1_000;
const TERM: u64 = 1;
const RESOURCES: [&str; 3] = ["a", "b", "c"];

fn acquire(resource: &str, request_id: &str, lease: u128, wait_timeout_ms: u64) -> Command {
    Command::Acquire(Acquire {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
        holder: None,
        ttl_ms: 30_000,
        wait_timeout_ms,
        lease_id: LeaseId(lease),
        retain_ms: 600_000,
        max_waiters: 8,
        max_total_waiters: 64,
        tenant_limits: None,
    })
}

fn granted(resp: &Response) -> (LeaseId, u64) {
    match resp {
        Response::Granted(g) => (g.lease_id, g.fencing_token),
        other => panic!("expected a grant, got {other:?}"),
    }
}

// Invariant 6: a retried acquire returns the original result and never makes a second lease.
#[test]
fn a_retry_inside_the_same_batch_gets_the_first_grant() {
    let mut m = LockMachine::new();
    let batch = Batch::new(
        1_000,
        GRACE,
        vec![
            acquire("a", "r1", 11, 0),
            acquire("a", "r1", 12, 0),
            acquire("a", "r2", 13, 0),
        ],
    );
    let (responses, _) = m.apply_batch(&batch, TERM);
    assert_eq!(
        responses.len(),
        3,
        "one response per command: {responses:?}"
    );
    assert_eq!(granted(&responses[0]), (LeaseId(11), 1));
    assert_eq!(
        granted(&responses[1]),
        (LeaseId(11), 1),
        "the retry is deduplicated"
    );
    assert!(
        matches!(responses[2], Response::Held { .. }),
        "a different request still finds the lock held: {:?}",
        responses[2]
    );
    assert_eq!(m.stats().active_locks, 1);
}

#[test]
fn a_retry_in_a_later_batch_gets_the_first_grant() {
    let mut m = LockMachine::new();
    let (first, _) = m.apply_batch(
        &Batch::new(1_000, GRACE, vec![acquire("a", "r1", 11, 0)]),
        TERM,
    );
    let (again, _) = m.apply_batch(
        &Batch::new(
            2_000,
            GRACE,
            vec![acquire("b", "r9", 21, 0), acquire("a", "r1", 99, 0)],
        ),
        TERM,
    );
    assert_eq!(granted(&first[0]), granted(&again[1]));
    assert_eq!(granted(&again[0]), (LeaseId(21), 2));
    assert_eq!(m.stats().active_locks, 2);
}

#[test]
fn every_command_of_a_batch_sees_the_batch_stamp() {
    let mut m = LockMachine::new();
    let (responses, _) = m.apply_batch(
        &Batch::new(
            5_000,
            GRACE,
            vec![acquire("a", "r1", 1, 0), acquire("b", "r2", 2, 0)],
        ),
        TERM,
    );
    for r in &responses {
        match r {
            Response::Granted(g) => assert_eq!(g.expires_at_ms, 5_000 + 30_000),
            other => panic!("expected a grant, got {other:?}"),
        }
    }
}

/// A snapshot is written while apply goes on: its image shows the machine as it was when it
/// was taken, whatever apply changes afterwards (including in the resources the image has
/// already let go of), and it can be written only once.
#[test]
fn a_snapshot_image_shows_the_state_it_was_taken_at() {
    let mut m = LockMachine::new();
    let first: Vec<_> = (0..200u128)
        .map(|i| acquire(&format!("r{i:03}"), &format!("a{i}"), i, 0))
        .collect();
    m.apply_batch(&Batch::new(5_000, GRACE, first), TERM);
    let expected = serde_json::to_vec(&m.image()).expect("image");
    let snapshot = m.snapshot_image();
    let mut before_written = m.clone();
    // Changes to resources the image holds, and to new ones, before it is written...
    let more: Vec<_> = (100..300u128)
        .map(|i| acquire(&format!("r{i:03}"), &format!("b{i}"), 1_000 + i, 0))
        .collect();
    before_written.apply_batch(&Batch::new(5_001, GRACE, more.clone()), TERM);
    m.apply_batch(&Batch::new(5_001, GRACE, more), TERM);
    assert_eq!(serde_json::to_vec(&snapshot).expect("written"), expected);
    // ...and after: the machine is whole and goes on.
    m.apply_batch(
        &Batch::new(5_002, GRACE, vec![Command::Tick { max_items: 10 }]),
        TERM,
    );
    before_written.apply_batch(
        &Batch::new(5_002, GRACE, vec![Command::Tick { max_items: 10 }]),
        TERM,
    );
    assert_eq!(m.image(), before_written.image());
    assert!(m.check_indexes().is_ok(), "{:?}", m.check_indexes());
    let restored = LockMachine::from_image(serde_json::from_slice(&expected).expect("decode"));
    assert_eq!(restored.stats().resources, 200);
    let again = serde_json::to_vec(&snapshot).expect_err("written twice");
    assert!(again.to_string().contains("only once"), "{again}");
}

/// Nodes space their snapshots by the commands applied, so the count must be the same on
/// every replica: each command of a batch counts once, one-by-one or batched, and a restored
/// snapshot goes on counting from where it was taken.
#[test]
fn every_command_counts_once_and_the_count_survives_a_snapshot() {
    let mut m = LockMachine::new();
    m.apply_batch(
        &Batch::new(
            5_000,
            GRACE,
            vec![
                acquire("a", "r1", 1, 0),
                acquire("a", "r1", 1, 0),
                Command::Tick { max_items: 10 },
            ],
        ),
        TERM,
    );
    m.apply(
        &Proposal {
            now_ms: 5_001,
            failover_grace_ms: GRACE,
            cmd: acquire("b", "r2", 2, 0),
        },
        TERM,
    );
    assert_eq!(m.commands(), 4);
    let encoded = serde_json::to_vec(&m.snapshot_image()).expect("encode");
    let mut restored = LockMachine::from_image(serde_json::from_slice(&encoded).expect("decode"));
    assert_eq!(restored.commands(), 4);
    restored.apply_batch(
        &Batch::new(5_002, GRACE, vec![acquire("c", "r3", 3, 0)]),
        TERM,
    );
    assert_eq!(restored.commands(), 5);
}

#[derive(Clone, Debug)]
enum Op {
    Acquire { res: usize, rid: u8, wait: bool },
    Renew { res: usize, lease: u8 },
    Release { res: usize, lease: u8 },
    Cancel { res: usize, rid: u8 },
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    let res = 0..RESOURCES.len();
    prop_oneof![
        6 => (res.clone(), 0u8..6, any::<bool>())
            .prop_map(|(res, rid, wait)| Op::Acquire { res, rid, wait }),
        3 => (res.clone(), 0u8..6).prop_map(|(res, lease)| Op::Renew { res, lease }),
        3 => (res.clone(), 0u8..6).prop_map(|(res, lease)| Op::Release { res, lease }),
        1 => (res, 0u8..6).prop_map(|(res, rid)| Op::Cancel { res, rid }),
        1 => Just(Op::Tick),
    ]
}

/// Request id `rid` always asks for lease `rid`, so a retry is the same request.
fn command(op: &Op) -> Command {
    match *op {
        Op::Acquire { res, rid, wait } => acquire(
            RESOURCES[res],
            &format!("r{rid}"),
            u128::from(rid) + 1,
            if wait { 20_000 } else { 0 },
        ),
        Op::Renew { res, lease } => Command::Renew {
            resource: RESOURCES[res].to_string(),
            lease_id: LeaseId(u128::from(lease) + 1),
        },
        Op::Release { res, lease } => Command::Release {
            resource: RESOURCES[res].to_string(),
            lease_id: LeaseId(u128::from(lease) + 1),
        },
        Op::Cancel { res, rid } => Command::Cancel {
            resource: RESOURCES[res].to_string(),
            request_id: format!("r{rid}"),
        },
        Op::Tick => Command::Tick { max_items: 100 },
    }
}

/// A batch: its commands and how far the leader's clock moved before it was stamped.
fn batches() -> impl Strategy<Value = Vec<(u64, Vec<Op>)>> {
    prop::collection::vec(
        (
            prop_oneof![3 => 0u64..2_000, 1 => 20_000u64..60_000],
            prop::collection::vec(op(), 1..12),
        ),
        1..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Batched and one-by-one application under the same stamps answer the same, emit the
    /// same effects and reach the same state; the indexes stay consistent.
    #[test]
    fn a_batch_applies_like_its_commands_one_by_one(batches in batches()) {
        let mut batched = LockMachine::new();
        let mut single = LockMachine::new();
        let mut now = 1_000;
        for (advance, ops) in &batches {
            now += advance;
            let cmds: Vec<Command> = ops.iter().map(command).collect();
            let (responses, effects) =
                batched.apply_batch(&Batch::new(now, GRACE, cmds.clone()), TERM);
            let mut one_by_one = Vec::new();
            let mut one_by_one_fx = Vec::new();
            for cmd in cmds {
                let (r, fx) = single.apply(
                    &Proposal { now_ms: now, failover_grace_ms: GRACE, cmd },
                    TERM,
                );
                one_by_one.push(r);
                one_by_one_fx.extend(fx);
            }
            prop_assert_eq!(&responses, &one_by_one);
            prop_assert_eq!(effects, one_by_one_fx);
            prop_assert_eq!(batched.image(), single.image());
            // Snapshots serialise the machine in place; the bytes must be the image's.
            let written = serde_json::to_vec(&batched.snapshot_image()).expect("in place");
            prop_assert_eq!(&written, &serde_json::to_vec(&batched.image()).expect("image"));
            // A node restores it decoding the dedup records straight into the table.
            let restored: RestoredImage = serde_json::from_slice(&written).expect("restore");
            let restored = LockMachine::from_restored(restored);
            prop_assert_eq!(restored.image(), batched.image());
            prop_assert!(restored.check_indexes().is_ok());
            prop_assert!(batched.check_indexes().is_ok(), "{:?}", batched.check_indexes());
            // Invariant 1: at most one lease per resource; a grant answered twice in one batch
            // (a deduplicated retry) names the same lease and token.
            let mut seen = std::collections::BTreeMap::new();
            for (op, r) in ops.iter().zip(&responses) {
                if let (Op::Acquire { res, rid, .. }, Response::Granted(g)) = (op, r) {
                    let first = seen.entry((*res, *rid)).or_insert((g.lease_id, g.fencing_token));
                    prop_assert_eq!(*first, (g.lease_id, g.fencing_token));
                }
            }
        }
    }
}
