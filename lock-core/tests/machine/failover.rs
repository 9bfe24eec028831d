//! A leader change never shortens a lease: the new leader honours each lease's remaining time
//! plus the failover grace, whatever its clock says and however long the election took.

use lock_core::machine::{Effect, LockMachine, Response};

use crate::support::{at, granted, lease, renew, run, run2, tick, try_once, wait, GRACE, T0, TTL};

/// Leader 1 grants a 30 s lease at T0 and a waiter with a 60 s wait, and its last stamp is
/// T0 + 10 s (20 s left on the lease, 50 s on the wait). Leader 2's first command comes
/// `election_ms` of real time later, stamped by a clock `offset_ms` off. Returns the machine
/// after that command and the remaining times as of the new log time.
fn fail_over(election_ms: u64, offset_ms: i64) -> (LockMachine, u64, u64) {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0, wait("a", "r2", 2, 60_000));
    let prev = T0 + 10_000;
    run(&mut m, prev, tick());
    assert_eq!(m.now_ms(), prev);

    let stamp = (prev + election_ms).saturating_add_signed(offset_ms);
    m.apply(&at(stamp, tick()), 2);
    let now = m.now_ms();
    assert_eq!(now, stamp.max(prev), "log time is the max of stamps");
    let l = m.lease("a").expect("lease survives the failover");
    assert_eq!(l.lease_id, lease(1));
    let lease_left = l.expires_at_ms - now;
    let wait_left = m.resource("a").expect("record").waiters[0].deadline_ms - now;
    m.check_indexes().expect("indexes");
    (m, lease_left, wait_left)
}

/// A new leader whose clock is ahead does not eat into the lease: it keeps its remaining time
/// as of the previous stamp plus the grace (not a reset to the full TTL).
#[test]
fn failover_with_new_leader_clock_ahead_never_shortens_lease() {
    let (_, lease_left, wait_left) = fail_over(1_500, 7_000);
    // Exactly: never less (the rule), and not the full 30 s TTL either.
    assert_eq!(lease_left, 20_000 + GRACE);
    assert_eq!(wait_left, 50_000 + GRACE);
}

/// A new leader whose clock is behind does not stretch log time backwards; the lease keeps
/// its remaining time plus the grace, measured from the unchanged log time.
#[test]
fn failover_with_new_leader_clock_behind_never_shortens_lease() {
    let (mut m, lease_left, wait_left) = fail_over(1_500, -7_000);
    assert_eq!(m.now_ms(), T0 + 10_000);
    assert_eq!(lease_left, 20_000 + GRACE);
    assert_eq!(wait_left, 50_000 + GRACE);
    // It expires exactly when its remaining time has passed on log time, not earlier.
    let exp = m.now_ms() + lease_left;
    run2(&mut m, exp - 1, tick());
    assert!(m.lease("a").is_some());
    let (_, fx) = m.apply(&at(exp, tick()), 2);
    assert!(matches!(
        fx[0],
        Effect::Expired {
            fencing_token: 1,
            ..
        }
    ));
    assert!(matches!(&fx[1], Effect::HandedOff { request_id, .. } if request_id == "r2"));
}

/// An election longer than the remaining lease (2 min against 20 s) is not charged to the
/// lease: it is still held afterwards with its remaining time plus the grace.
#[test]
fn failover_after_long_election_keeps_the_lease() {
    let (mut m, lease_left, wait_left) = fail_over(120_000, 0);
    assert_eq!(lease_left, 20_000 + GRACE);
    assert_eq!(wait_left, 50_000 + GRACE);
    // The holder can renew under the new leader.
    assert!(matches!(
        run2(&mut m, T0 + 130_001, renew("a", 1)),
        Response::Renewed(_)
    ));
}

/// The shift happens once per leader change, not on every command of a term; and a lease
/// already run out at the previous stamp is not revived.
#[test]
fn failover_shift_applies_once_and_not_to_expired_leases() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("live", "r1", 1)));
    granted(run(&mut m, T0, try_once("dead", "r1", 2)));
    run(&mut m, T0 + 5_000, renew("live", 1));
    // "dead" ran out at T0 + 30 s; nothing has expired it yet.
    run(&mut m, T0 + TTL, renew("live", 1));
    let live_exp = T0 + 2 * TTL;
    assert_eq!(m.lease("dead").map(|l| l.expires_at_ms), Some(T0 + TTL));

    run2(&mut m, T0 + TTL + 1_000, tick());
    assert_eq!(
        m.lease("live").map(|l| l.expires_at_ms),
        Some(live_exp + 1_000 + GRACE)
    );
    assert_eq!(m.lease("dead"), None, "the tick expired it");
    run2(&mut m, T0 + TTL + 2_000, tick());
    assert_eq!(
        m.lease("live").map(|l| l.expires_at_ms),
        Some(live_exp + 1_000 + GRACE)
    );
}
