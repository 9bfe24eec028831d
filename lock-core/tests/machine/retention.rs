//! Dedup records and idle resource records are kept for their retention time of log time that
//! actually elapsed: a forward jump of log time at a leader change (a new leader stamping ahead
//! of the log) is not charged to them, exactly as it is not charged to leases. Otherwise a
//! retry within the retry window could miss its original grant (and get a second lease).

use lock_core::machine::{LockMachine, Response, DEFAULT_IDLE_RETAIN_MS};

use crate::support::{granted, release, run, run2, tick, try_once, RETAIN, T0};

/// How far the new leader's first stamp is ahead of the log.
const JUMP: u64 = 400_000;
/// Log time of the previous leader's last stamp.
const PREV: u64 = T0 + 100_000;

/// Leader 1 grants `a` (request `r1`) at T0 and its holder releases at T0 + 10 s, so both the
/// dedup record (until T0 + RETAIN) and the idle record (until T0 + 10 s + idle retention) are
/// kept. Leader 2's first stamp jumps `jump` ahead of leader 1's last stamp.
fn fail_over_with_jump(jump: u64) -> LockMachine {
    let mut m = LockMachine::new();
    let g = granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(g.fencing_token, 1);
    assert_eq!(
        run(&mut m, T0 + 10_000, release("a", 1)),
        Response::Released(true)
    );
    run(&mut m, PREV, tick());
    run2(&mut m, PREV + jump, tick());
    m.check_indexes().expect("indexes");
    m
}

#[test]
fn forward_jump_at_failover_does_not_shorten_the_retry_window() {
    let mut m = fail_over_with_jump(JUMP);
    // Just before the window (plus the jump) ends, the retry still gets the original lease.
    let last = T0 + RETAIN + JUMP - 1;
    run2(&mut m, last, tick());
    let again = granted(run2(&mut m, last, try_once("a", "r1", 2)));
    assert_eq!(
        (again.lease_id.0, again.fencing_token),
        (1, 1),
        "a retry inside the retry window got a new lease"
    );
    assert_eq!(m.stats().dedup_records, 1);
    // Once the whole window of elapsed log time has passed, the record is swept.
    run2(&mut m, T0 + RETAIN + JUMP, tick());
    assert_eq!(m.stats().dedup_records, 0);
    m.check_indexes().expect("indexes");
}

#[test]
fn forward_jump_at_failover_does_not_drop_idle_records_early() {
    let mut m = fail_over_with_jump(JUMP);
    let idle_until = T0 + 10_000 + DEFAULT_IDLE_RETAIN_MS + JUMP;
    assert_eq!(
        m.resource("a").and_then(|r| r.idle_until_ms),
        Some(idle_until)
    );
    run2(&mut m, idle_until - 1, tick());
    assert!(m.resource("a").is_some(), "idle record dropped early");
    run2(&mut m, idle_until, tick());
    assert!(m.resource("a").is_none(), "idle record kept past its time");
    m.check_indexes().expect("indexes");
}

/// The normal case: stamps anchored to the log make a new leader's first stamp the log time
/// itself, nothing moves, and the election pause is simply not log time.
#[test]
fn failover_without_jump_keeps_retention_unchanged() {
    let mut m = fail_over_with_jump(0);
    assert_eq!(
        m.resource("a").and_then(|r| r.idle_until_ms),
        Some(T0 + 10_000 + DEFAULT_IDLE_RETAIN_MS)
    );
    run2(&mut m, T0 + RETAIN - 1, tick());
    assert_eq!(m.stats().dedup_records, 1);
    run2(&mut m, T0 + RETAIN, tick());
    assert_eq!(m.stats().dedup_records, 0);
}

/// Records already due at the previous stamp are not revived by the shift.
#[test]
fn records_due_before_the_failover_are_not_revived() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    // The window ended at T0 + RETAIN; no tick swept it before the leader change.
    run(&mut m, T0 + RETAIN, try_once("b", "r9", 9));
    assert_eq!(m.stats().dedup_records, 2);
    run2(&mut m, T0 + RETAIN + JUMP, tick());
    assert_eq!(
        m.stats().dedup_records,
        1,
        "only b's record is still in its window"
    );
}
