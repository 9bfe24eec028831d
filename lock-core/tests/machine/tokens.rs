//! Fencing tokens only grow: one global counter that survives dropped idle records and snapshot
//! restores.

use lock_core::machine::{Effect, LockMachine, DEFAULT_IDLE_RETAIN_MS};

use lock_core::machine::{AdmitOutcome, Response};

use crate::support::{
    admit_at, at, granted, lease, release, renew, restore, run, tick, try_once, wait, P1, T0,
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

/// A cluster restored from a backup starts from `restored_after_loss`: the lost cluster may
/// have ended any lease of the backup and issued newer tokens, so every lease ends, every token
/// up to the floor is stale (a superseded one is never admitted again), waiters and their
/// request ids go, and the next token is above the floor, also after a snapshot.
#[test]
fn a_state_restored_after_loss_ends_every_lease_and_issues_above_the_floor() {
    let mut m = LockMachine::new();
    let a = granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(a.fencing_token, 1);
    run(&mut m, T0, wait("a", "r2", 2, 60_000));
    assert!(matches!(
        admit_at(&mut m, T0 + 1, "a", 1, P1),
        AdmitOutcome::Admitted { .. }
    ));

    let mut m = m.restored_after_loss(1_000);
    assert_eq!(m.last_token(), 1_000);
    let stale = AdmitOutcome::Stale { highest: 1_000 };
    assert_eq!(
        admit_at(&mut m, T0 + 2, "a", 1, P1),
        stale,
        "the old lease's token"
    );
    assert_eq!(
        admit_at(&mut m, T0 + 2, "a", 500, P1),
        stale,
        "a lost cluster's token"
    );
    assert_eq!(
        admit_at(&mut m, T0 + 2, "b", 500, P1),
        stale,
        "on a resource it lacks"
    );
    assert_eq!(run(&mut m, T0 + 2, renew("a", 1)), Response::LeaseLost);
    let view = m.view("a", T0 + 2);
    assert!(!view.held && view.waiters == 0, "{view:?}");
    // The waiter's request id went with it: the same id acquires anew.
    let again = granted(run(&mut m, T0 + 3, try_once("a", "r2", 3)));
    assert_eq!(again.fencing_token, 1_001);

    let mut m = restore(&m);
    let b = granted(run(&mut m, T0 + 4, try_once("b", "r3", 4)));
    assert_eq!(b.fencing_token, 1_002);
    assert_eq!(
        admit_at(&mut m, T0 + 5, "a", 1, P1),
        AdmitOutcome::Stale { highest: 1_001 }
    );
}
