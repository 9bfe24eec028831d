//! Fencing tokens only grow: one global counter that survives dropped idle records and snapshot
//! restores.

use lock_core::machine::{Effect, LockMachine, DEFAULT_IDLE_RETAIN_MS};

use lock_core::machine::AdmitOutcome;

use crate::support::{
    admit_at, at, granted, lease, release, restore, run, tick, try_once, wait, P1, T0,
};

/// Tokens keep increasing after an idle resource record (which carried the resource's last
/// token) is dropped.
#[test]
fn tokens_keep_increasing_after_idle_records_are_dropped() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0 + 1, release("a", 1));
    let idle_until = T0 + 1 + DEFAULT_IDLE_RETAIN_MS;
    assert_eq!(
        m.resource("a").and_then(|r| r.idle_until_ms),
        Some(idle_until)
    );

    run(&mut m, idle_until - 1, tick());
    assert!(m.resource("a").is_some());
    run(&mut m, idle_until, tick());
    assert!(m.resource("a").is_none(), "idle record dropped");
    assert_eq!(m.view("a", idle_until).fencing_token, None);
    assert_eq!(m.last_token(), 1);

    let g = granted(run(&mut m, idle_until + 1, try_once("a", "r9", 2)));
    assert_eq!(g.fencing_token, 2);
}

/// After a snapshot is taken and installed, the state is the same and new tokens continue
/// above every token issued before; queues, dedup and deadlines carry over.
#[test]
fn tokens_keep_increasing_after_snapshot_restore() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    granted(run(&mut m, T0, try_once("b", "r1", 2)));
    run(&mut m, T0, wait("a", "r2", 3, 60_000));
    run(&mut m, T0 + 1, release("b", 2));

    let mut r = restore(&m);
    assert_eq!(r.image(), m.image());
    r.check_indexes().expect("indexes");
    assert_eq!(r.last_token(), 2);
    assert_eq!(r.next_deadline(), m.next_deadline());

    let g = granted(run(&mut r, T0 + 2, try_once("b", "r5", 5)));
    assert_eq!(g.fencing_token, 3);
    assert_eq!(
        granted(run(&mut r, T0 + 3, try_once("a", "r1", 6))).lease_id,
        lease(1)
    );
    let (_, fx) = r.apply(&at(T0 + 4, release("a", 1)), 1);
    assert!(matches!(&fx[..], [Effect::HandedOff { grant, .. }] if grant.fencing_token == 4));
}

/// A cluster restored from a backup raises its token counter past the tokens the lost cluster
/// may have issued after the backup: the next token is above the floor, a token between the
/// old counter and the floor is unknown to every resource (a proxy refuses it), a floor below
/// the counter changes nothing, and the floor lasts through a snapshot.
#[test]
fn a_raised_token_floor_issues_above_it_and_knows_no_token_below_it() {
    let mut m = LockMachine::new();
    let a = granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(a.fencing_token, 1);

    m.raise_token_floor(1_000);
    m.raise_token_floor(10);
    assert_eq!(
        m.last_token(),
        1_000,
        "a lower floor moved the counter back"
    );
    assert_eq!(
        admit_at(&mut m, T0 + 1, "a", 500, P1),
        AdmitOutcome::Unknown
    );
    assert_eq!(
        admit_at(&mut m, T0 + 1, "b", 500, P1),
        AdmitOutcome::Unknown
    );
    assert!(matches!(
        admit_at(&mut m, T0 + 1, "a", 1, P1),
        AdmitOutcome::Admitted { .. }
    ));

    let mut m = restore(&m);
    let b = granted(run(&mut m, T0 + 2, try_once("b", "r2", 2)));
    assert_eq!(b.fencing_token, 1_001);
}
