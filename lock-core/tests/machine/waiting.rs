//! Waiting: the FIFO queue, hand-off to exactly one waiter, timeouts, cancel and queue bounds.

use lock_core::machine::{Acquire, Command, Effect, Grant, LockMachine, Response, WaiterGone};

use crate::support::{
    acq, at, cancel, granted, holder_of, lease, release, run, tick, try_once, wait, waiting, T0,
    TTL,
};

/// A release hands the lock to the head waiter in the same command, with a strictly larger
/// token, and wakes only that waiter (one `HandedOff`, no thundering herd).
#[test]
fn release_hands_off_to_exactly_one_waiter_with_larger_token() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(
        run(&mut m, T0 + 1, wait("a", "r2", 2, 60_000)),
        Response::Queued { position: 1 }
    );
    assert_eq!(
        run(&mut m, T0 + 2, wait("a", "r3", 3, 60_000)),
        Response::Queued { position: 2 }
    );
    assert_eq!(
        run(&mut m, T0 + 3, wait("a", "r4", 4, 60_000)),
        Response::Queued { position: 3 }
    );
    assert_eq!(m.stats().waiters, 3);

    let (resp, fx) = m.apply(&at(T0 + 100, release("a", 1)), 1);
    assert_eq!(resp, Response::Released(true));
    assert_eq!(
        fx,
        vec![Effect::HandedOff {
            request_id: "r2".into(),
            grant: Grant {
                resource: "a".into(),
                lease_id: lease(2),
                fencing_token: 2,
                ttl_ms: TTL,
                expires_at_ms: T0 + 100 + TTL,
            },
        }]
    );
    assert_eq!(holder_of(&m, "a"), Some((lease(2), 2)));
    assert_eq!(waiting(&m, "a"), ["r3", "r4"]);
    // The woken waiter's retry returns its grant; the others stay queued in order.
    assert_eq!(
        granted(run(&mut m, T0 + 101, wait("a", "r2", 20, 60_000))).lease_id,
        lease(2)
    );
    assert_eq!(
        run(&mut m, T0 + 101, wait("a", "r4", 40, 60_000)),
        Response::Queued { position: 2 }
    );
}

/// When the holder's lease expires, the sweeper's Tick expires it and hands off to the head
/// waiter in the same command.
#[test]
fn expiry_via_tick_hands_off_to_head_waiter() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0 + 1, wait("a", "r2", 2, 60_000));
    run(&mut m, T0 + 2, wait("a", "r3", 3, 60_000));
    assert_eq!(m.next_deadline(), Some(T0 + TTL));

    let (resp, fx) = m.apply(&at(T0 + TTL - 1, tick()), 1);
    assert_eq!(
        resp,
        Response::Ticked {
            expired: 0,
            handed_off: 0
        }
    );
    assert!(fx.is_empty());

    let (resp, fx) = m.apply(&at(T0 + TTL, tick()), 1);
    assert_eq!(
        resp,
        Response::Ticked {
            expired: 1,
            handed_off: 1
        }
    );
    assert_eq!(fx.len(), 2, "{fx:?}");
    assert_eq!(
        fx[0],
        Effect::Expired {
            resource: "a".into(),
            fencing_token: 1
        }
    );
    assert!(
        matches!(&fx[1], Effect::HandedOff { request_id, grant }
            if request_id == "r2" && grant.fencing_token == 2 && grant.expires_at_ms == T0 + 2 * TTL),
        "{fx:?}"
    );
    assert_eq!(waiting(&m, "a"), ["r3"]);
}

/// A waiter that times out is removed by the sweeper, and its request id is forgotten (there
/// is nothing to cancel any more).
#[test]
fn waiter_times_out_via_tick() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0, wait("a", "r2", 2, 5_000));
    assert_eq!(m.next_deadline(), Some(T0 + 5_000));

    let (resp, fx) = m.apply(&at(T0 + 5_000, tick()), 1);
    assert_eq!(
        resp,
        Response::Ticked {
            expired: 0,
            handed_off: 0
        }
    );
    assert_eq!(
        fx,
        vec![Effect::WaiterRemoved {
            resource: "a".into(),
            request_id: "r2".into(),
            reason: WaiterGone::TimedOut,
        }]
    );
    assert!(waiting(&m, "a").is_empty());
    assert_eq!(m.stats().waiters, 0);
    assert_eq!(
        run(&mut m, T0 + 5_001, cancel("a", "r2")),
        Response::Cancelled(false)
    );
    // The release now finds nobody to hand to.
    let (resp, fx) = m.apply(&at(T0 + 6_000, release("a", 1)), 1);
    assert_eq!(resp, Response::Released(true));
    assert!(fx.is_empty());
}

/// A waiter whose time ran out before the sweeper saw it is skipped at hand-off (a wait ends
/// at its deadline, like a lease); the lock goes to the next live waiter.
#[test]
fn timed_out_waiter_is_skipped_at_hand_off() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0, wait("a", "r2", 2, 5_000));
    run(&mut m, T0, wait("a", "r3", 3, 10_000));
    run(&mut m, T0, wait("a", "r4", 4, 60_000));

    let (resp, fx) = m.apply(&at(T0 + 10_000, release("a", 1)), 1);
    assert_eq!(resp, Response::Released(true));
    let gone = |rid: &str| Effect::WaiterRemoved {
        resource: "a".into(),
        request_id: rid.into(),
        reason: WaiterGone::TimedOut,
    };
    assert_eq!(fx.len(), 3, "{fx:?}");
    assert_eq!(fx[..2], [gone("r2"), gone("r3")]);
    assert!(matches!(&fx[2], Effect::HandedOff { request_id, grant }
        if request_id == "r4" && grant.lease_id == lease(4) && grant.fencing_token == 2));
    assert_eq!(m.stats().waiters, 0);
    m.check_indexes().expect("indexes");
}

/// A cancelled waiter is removed and never gets the lock.
#[test]
fn cancel_removes_a_waiter() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0, wait("a", "r2", 2, 60_000));
    run(&mut m, T0, wait("a", "r3", 3, 60_000));

    let (resp, fx) = m.apply(&at(T0 + 1, cancel("a", "r2")), 1);
    assert_eq!(resp, Response::Cancelled(true));
    assert_eq!(
        fx,
        vec![Effect::WaiterRemoved {
            resource: "a".into(),
            request_id: "r2".into(),
            reason: WaiterGone::Cancelled,
        }]
    );
    assert_eq!(waiting(&m, "a"), ["r3"]);
    assert_eq!(
        run(&mut m, T0 + 2, cancel("a", "r2")),
        Response::Cancelled(false)
    );
    assert_eq!(
        run(&mut m, T0 + 2, cancel("a", "never")),
        Response::Cancelled(false)
    );

    let (_, fx) = m.apply(&at(T0 + 3, release("a", 1)), 1);
    assert!(matches!(&fx[..], [Effect::HandedOff { request_id, .. }] if request_id == "r3"));
}

/// Only the lease id ends a lease: once a waiter has been handed the lock, cancelling its
/// request id (which is no secret) does not end the lease. The node that gave up on the
/// long-poll releases with the lease id it proposed, and the lock passes on. A late retry of
/// that acquire still gets its original (now dead) lease, never a second one.
#[test]
fn cancel_of_a_lease_granted_by_hand_off_leaves_it_to_release() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0, wait("a", "r2", 2, 60_000));
    run(&mut m, T0, wait("a", "r3", 3, 60_000));
    run(&mut m, T0 + 1, release("a", 1));
    assert_eq!(holder_of(&m, "a"), Some((lease(2), 2)));

    let (resp, fx) = m.apply(&at(T0 + 2, cancel("a", "r2")), 1);
    assert_eq!(resp, Response::Cancelled(false));
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(holder_of(&m, "a"), Some((lease(2), 2)));
    assert_eq!(waiting(&m, "a"), ["r3"]);

    let (resp, fx) = m.apply(&at(T0 + 3, release("a", 2)), 1);
    assert_eq!(resp, Response::Released(true));
    assert!(matches!(&fx[..], [Effect::HandedOff { request_id, grant }]
        if request_id == "r3" && grant.fencing_token == 3));
    assert_eq!(holder_of(&m, "a"), Some((lease(3), 3)));

    let g = granted(run(&mut m, T0 + 4, wait("a", "r2", 22, 60_000)));
    assert_eq!((g.lease_id, g.fencing_token), (lease(2), 2));
    assert_eq!(holder_of(&m, "a"), Some((lease(3), 3)));
    assert!(waiting(&m, "a").is_empty());
}

/// Queues are bounded per resource and in total; beyond the bound an acquire gets
/// `too_many_waiters` and is not queued.
#[test]
fn waiter_queue_is_bounded_per_resource_and_in_total() {
    let bounded = |resource: &str, rid: &str, id: u128| {
        Command::Acquire(Acquire {
            wait_timeout_ms: 60_000,
            max_waiters: 2,
            max_total_waiters: 3,
            tenant_limits: None,
            ..acq(resource, rid, id)
        })
    };
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "h", 1)));
    granted(run(&mut m, T0, try_once("b", "h", 2)));
    assert_eq!(
        run(&mut m, T0, bounded("a", "w1", 11)),
        Response::Queued { position: 1 }
    );
    assert_eq!(
        run(&mut m, T0, bounded("a", "w2", 12)),
        Response::Queued { position: 2 }
    );
    assert_eq!(
        run(&mut m, T0, bounded("a", "w3", 13)),
        Response::TooManyWaiters
    );
    assert_eq!(
        run(&mut m, T0, bounded("b", "w4", 14)),
        Response::Queued { position: 1 }
    );
    // "b" has room (1 of 2) but the total (3 of 3) is reached.
    assert_eq!(
        run(&mut m, T0, bounded("b", "w5", 15)),
        Response::TooManyWaiters
    );
    assert_eq!(m.stats().waiters, 3);
    assert_eq!(waiting(&m, "a"), ["w1", "w2"]);
    assert_eq!(waiting(&m, "b"), ["w4"]);
    // A rejected acquire left no dedup record: it can be cancelled by nobody.
    assert_eq!(
        run(&mut m, T0, cancel("a", "w3")),
        Response::Cancelled(false)
    );
    // Freeing a slot lets the next one in.
    run(&mut m, T0 + 1, cancel("a", "w1"));
    assert_eq!(
        run(&mut m, T0 + 2, bounded("b", "w5", 15)),
        Response::Queued { position: 2 }
    );
}
