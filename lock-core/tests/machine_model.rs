//! The pure lock state machine, tested by its outputs (STYLE.md §3).
//!
//! The first part has one test per rule of SPEC.md §3–4, each named after the rule and citing
//! it. The second part drives long random sequences of commands — with retries, stale lease
//! ids, proxy admissions, clock jumps, leader changes with skewed clocks and snapshot restores —
//! against a small reference model, compares every response and effect, and checks the §3
//! invariants (and the §5 epoch barrier) after every step.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use lock_core::machine::{
    Acquire, AdmitOutcome, Command, Effect, Grant, LeaseId, LockMachine, MachineImage, Proposal,
    Response, WaiterGone, DEFAULT_IDLE_RETAIN_MS,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const T0: u64 = 1_700_000_000_000;
const GRACE: u64 = 5_000;
const TTL: u64 = 30_000;
const RETAIN: u64 = 600_000;

// ---- helpers ---------------------------------------------------------------------------

fn at(now_ms: u64, cmd: Command) -> Proposal {
    Proposal {
        now_ms,
        failover_grace_ms: GRACE,
        cmd,
    }
}

fn lease(n: u128) -> LeaseId {
    LeaseId(n)
}

fn acq(resource: &str, request_id: &str, lease_id: u128) -> Acquire {
    Acquire {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
        holder: Some(format!("holder-{request_id}")),
        ttl_ms: TTL,
        wait_timeout_ms: 0,
        lease_id: lease(lease_id),
        retain_ms: RETAIN,
        max_waiters: 64,
        max_total_waiters: 1024,
    }
}

fn try_once(resource: &str, request_id: &str, lease_id: u128) -> Command {
    Command::Acquire(acq(resource, request_id, lease_id))
}

fn wait(resource: &str, request_id: &str, lease_id: u128, wait_timeout_ms: u64) -> Command {
    Command::Acquire(Acquire {
        wait_timeout_ms,
        ..acq(resource, request_id, lease_id)
    })
}

fn renew(resource: &str, lease_id: u128) -> Command {
    Command::Renew {
        resource: resource.to_string(),
        lease_id: lease(lease_id),
    }
}

fn release(resource: &str, lease_id: u128) -> Command {
    Command::Release {
        resource: resource.to_string(),
        lease_id: lease(lease_id),
    }
}

fn cancel(resource: &str, request_id: &str) -> Command {
    Command::Cancel {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
    }
}

fn tick() -> Command {
    Command::Tick { max_items: 10_000 }
}

/// Applies in term 1 and returns the response only.
fn run(m: &mut LockMachine, now_ms: u64, cmd: Command) -> Response {
    m.apply(&at(now_ms, cmd), 1).0
}

/// Applies in term 2 (after a leader change) and returns the response only.
fn run2(m: &mut LockMachine, now_ms: u64, cmd: Command) -> Response {
    m.apply(&at(now_ms, cmd), 2).0
}

#[track_caller]
fn granted(resp: Response) -> Grant {
    match resp {
        Response::Granted(g) => g,
        other => panic!("expected Granted, got {other:?}"),
    }
}

fn holder_of(m: &LockMachine, resource: &str) -> Option<(LeaseId, u64)> {
    m.lease(resource).map(|l| (l.lease_id, l.fencing_token))
}

fn waiting(m: &LockMachine, resource: &str) -> Vec<String> {
    m.resource(resource)
        .map(|r| r.waiters.iter().map(|w| w.request_id.clone()).collect())
        .unwrap_or_default()
}

/// Snapshot round trip through the serialized form a snapshot file would hold.
fn restore(m: &LockMachine) -> LockMachine {
    let bytes = serde_json::to_vec(&m.image()).expect("image serializes");
    let image: MachineImage = serde_json::from_slice(&bytes).expect("image deserializes");
    LockMachine::from_image(image)
}

// ---- acquire -----------------------------------------------------------------------------

/// SPEC §4 acquire: a free resource is granted at once with the requested TTL; §3.2 tokens come
/// from one global counter.
#[test]
fn acquire_on_free_resource_is_granted_with_next_global_token() {
    let mut m = LockMachine::new();
    let (resp, fx) = m.apply(&at(T0, try_once("a", "r1", 1)), 1);
    assert_eq!(
        resp,
        Response::Granted(Grant {
            resource: "a".into(),
            lease_id: lease(1),
            fencing_token: 1,
            ttl_ms: TTL,
            expires_at_ms: T0 + TTL,
        })
    );
    assert!(fx.is_empty(), "{fx:?}");
    // Another resource takes the next value of the same counter.
    let g = granted(run(&mut m, T0 + 1, try_once("b", "r1", 2)));
    assert_eq!(g.fencing_token, 2);
    assert_eq!(m.last_token(), 2);
    let view = m.view("a", T0 + 1);
    assert!(view.held);
    assert_eq!(view.holder.as_deref(), Some("holder-r1"));
    assert_eq!(view.fencing_token, Some(1));
}

/// SPEC §4 acquire: try-once on a held resource is 409 `lock_held` with `retry_after_ms` (the
/// holder's remaining time), and neither queues nor issues a token.
#[test]
fn try_once_on_held_resource_is_held_with_retry_after() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    let (resp, fx) = m.apply(&at(T0 + 10_000, try_once("a", "r2", 2)), 1);
    assert_eq!(
        resp,
        Response::Held {
            retry_after_ms: 20_000
        }
    );
    assert!(fx.is_empty());
    assert!(waiting(&m, "a").is_empty());
    assert_eq!(m.last_token(), 1);
    assert_eq!(holder_of(&m, "a"), Some((lease(1), 1)));
}

// ---- renew -------------------------------------------------------------------------------

/// SPEC §4 renew: a renewal extends the lease to `now + ttl`, keeping lease id and token.
#[test]
fn renew_extends_from_now_and_keeps_the_token() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    let resp = run(&mut m, T0 + 10_000, renew("a", 1));
    assert_eq!(
        resp,
        Response::Renewed(Grant {
            resource: "a".into(),
            lease_id: lease(1),
            fencing_token: 1,
            ttl_ms: TTL,
            expires_at_ms: T0 + 10_000 + TTL,
        })
    );
    assert_eq!(m.lease("a").map(|l| l.expires_at_ms), Some(T0 + 40_000));
    // The renewed lease outlives its original expiry.
    run(&mut m, T0 + 35_000, tick());
    assert_eq!(holder_of(&m, "a"), Some((lease(1), 1)));
}

/// SPEC §3.4: only the current lease id renews. A wrong id, and the old holder's id after its
/// lease expired and was regranted, get 409 `lease_lost` and leave the new holder untouched.
#[test]
fn renew_with_wrong_or_old_lease_is_lease_lost() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(run(&mut m, T0 + 1, renew("a", 99)), Response::LeaseLost);
    assert_eq!(run(&mut m, T0 + 1, renew("nosuch", 1)), Response::LeaseLost);
    assert_eq!(m.lease("a").map(|l| l.expires_at_ms), Some(T0 + TTL));

    // Lease 1 expires (exactly at its deadline); B takes the lock.
    let b = granted(run(&mut m, T0 + TTL, try_once("a", "r2", 2)));
    assert_eq!(b.fencing_token, 2);
    assert_eq!(
        run(&mut m, T0 + TTL + 1, renew("a", 1)),
        Response::LeaseLost
    );
    let l = m.lease("a").expect("B holds");
    assert_eq!((l.lease_id, l.expires_at_ms), (lease(2), T0 + TTL + TTL));
}

/// SPEC §3.4 / §4 renew: a lease that has run out cannot be renewed, even before any command
/// expired it; the renewal itself settles it.
#[test]
fn renew_after_expiry_is_lease_lost_and_reports_the_expiry() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    let (resp, fx) = m.apply(&at(T0 + TTL, renew("a", 1)), 1);
    assert_eq!(resp, Response::LeaseLost);
    assert_eq!(
        fx,
        vec![Effect::Expired {
            resource: "a".into(),
            fencing_token: 1
        }]
    );
    assert_eq!(m.lease("a"), None);
}

// ---- release -----------------------------------------------------------------------------

/// SPEC §3.4: a stale release (the old holder's, after its lease expired and B got the lock)
/// never removes B's lock; release is idempotent.
#[test]
fn stale_release_after_expiry_and_regrant_never_removes_new_holder() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    let (resp, fx) = m.apply(&at(T0 + TTL + 5, try_once("a", "r2", 2)), 1);
    assert_eq!(granted(resp).fencing_token, 2);
    assert_eq!(
        fx,
        vec![Effect::Expired {
            resource: "a".into(),
            fencing_token: 1
        }]
    );

    let (resp, fx) = m.apply(&at(T0 + TTL + 6, release("a", 1)), 1);
    assert_eq!(resp, Response::Released(false));
    assert!(fx.is_empty());
    assert_eq!(holder_of(&m, "a"), Some((lease(2), 2)));

    // The holder's own release works once; repeating it is harmless.
    assert_eq!(
        run(&mut m, T0 + TTL + 7, release("a", 2)),
        Response::Released(true)
    );
    assert_eq!(
        run(&mut m, T0 + TTL + 8, release("a", 2)),
        Response::Released(false)
    );
    assert_eq!(m.lease("a"), None);
    // Releasing on a resource that never existed creates nothing.
    assert_eq!(
        run(&mut m, T0 + TTL + 9, release("nosuch", 2)),
        Response::Released(false)
    );
    assert!(m.resource("nosuch").is_none());
}

// ---- waiting and hand-off ----------------------------------------------------------------

/// SPEC §4 waiting + §3.2: a release hands the lock to the head waiter in the same command,
/// with a strictly larger token, and wakes only that waiter (one `HandedOff`, no herd).
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

/// SPEC §4 waiting: when the holder's lease expires, the sweeper's Tick expires it and hands
/// off to the head waiter in the same command.
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

/// SPEC §4 waiting: a waiter that times out is removed by the sweeper, and its request id is
/// forgotten (there is nothing to cancel any more).
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

/// SPEC §4 waiting: a waiter whose time ran out before the sweeper saw it is skipped at
/// hand-off (a wait ends at its deadline, like a lease); the lock goes to the next live waiter.
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

/// SPEC §4 waiting: a cancelled waiter is removed and never gets the lock.
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

/// SPEC §3.4: once a waiter has been handed the lock, cancelling its request id does not end
/// the lease (a request id is no secret; only the lease id ends a lease). The node that gave
/// up on the long-poll releases with the lease id it proposed, and the lock passes on. §3.6: a
/// late retry of that acquire still gets its original (now dead) lease, never a second one.
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

/// SPEC §4: queues are bounded per resource and in total; beyond the bound an acquire gets
/// 429 `too_many_waiters` and is not queued.
#[test]
fn waiter_queue_is_bounded_per_resource_and_in_total() {
    let bounded = |resource: &str, rid: &str, id: u128| {
        Command::Acquire(Acquire {
            wait_timeout_ms: 60_000,
            max_waiters: 2,
            max_total_waiters: 3,
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

// ---- retries -----------------------------------------------------------------------------

/// SPEC §3.6: a retry with the same request id returns the original lease and token — while
/// held, after release and after expiry — and never grants a second lease.
#[test]
fn retry_with_same_request_id_returns_the_original_grant() {
    let mut m = LockMachine::new();
    let first = granted(run(&mut m, T0, try_once("a", "r1", 1)));

    // The retry was proposed by a leader that picked a fresh lease id (7); it is not used.
    let again = granted(run(&mut m, T0 + 100, try_once("a", "r1", 7)));
    assert_eq!(again, first);
    assert_eq!(m.last_token(), 1);

    // After a renewal the retry reports the current expiry of the same lease.
    run(&mut m, T0 + 1_000, renew("a", 1));
    let again = granted(run(&mut m, T0 + 1_001, try_once("a", "r1", 8)));
    assert_eq!(
        (again.lease_id, again.fencing_token, again.expires_at_ms),
        (lease(1), 1, T0 + 1_000 + TTL)
    );

    // After release: the original result, and the resource stays free.
    run(&mut m, T0 + 2_000, release("a", 1));
    let again = granted(run(&mut m, T0 + 2_001, try_once("a", "r1", 9)));
    assert_eq!((again.lease_id, again.fencing_token), (lease(1), 1));
    assert_eq!(m.lease("a"), None);
    assert_eq!(m.last_token(), 1);

    // After expiry (of a second lease from another request): still the original.
    granted(run(&mut m, T0 + 3_000, try_once("a", "r2", 2)));
    let again = granted(run(&mut m, T0 + 3_000 + TTL + 1, try_once("a", "r1", 10)));
    assert_eq!((again.lease_id, again.fencing_token), (lease(1), 1));
    assert_eq!(m.lease("a"), None, "expired, and the retry granted nothing");
    assert_eq!(m.last_token(), 2);
}

/// SPEC §3.6: a retry of a queued acquire returns Queued at its current position and adds no
/// second waiter; once handed off, the retry returns the hand-off grant.
#[test]
fn retry_of_queued_acquire_is_queued_without_a_second_waiter() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0, wait("a", "r2", 2, 60_000));
    run(&mut m, T0, wait("a", "r3", 3, 60_000));
    assert_eq!(
        run(&mut m, T0 + 1, wait("a", "r3", 33, 60_000)),
        Response::Queued { position: 2 }
    );
    // Even a retry as try-once (the request is the same; its result is "queued").
    assert_eq!(
        run(&mut m, T0 + 2, try_once("a", "r3", 34)),
        Response::Queued { position: 2 }
    );
    assert_eq!(waiting(&m, "a"), ["r2", "r3"]);
    assert_eq!(m.stats().waiters, 2);

    run(&mut m, T0 + 3, cancel("a", "r2"));
    assert_eq!(
        run(&mut m, T0 + 4, wait("a", "r3", 35, 60_000)),
        Response::Queued { position: 1 }
    );
    run(&mut m, T0 + 5, release("a", 1));
    let g = granted(run(&mut m, T0 + 6, wait("a", "r3", 36, 60_000)));
    assert_eq!((g.lease_id, g.fencing_token), (lease(3), 2));
    assert!(waiting(&m, "a").is_empty());
}

/// SPEC §4: dedup results are kept for the retry window (`retain_ms`), then swept; a request id
/// reused after that is a new acquire.
#[test]
fn dedup_record_is_kept_for_the_retry_window() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    run(&mut m, T0 + 1, release("a", 1));
    run(&mut m, T0 + RETAIN - 1, tick());
    let again = granted(run(&mut m, T0 + RETAIN - 1, try_once("a", "r1", 2)));
    assert_eq!(again.lease_id, lease(1));
    assert_eq!(m.stats().dedup_records, 1);

    run(&mut m, T0 + RETAIN, tick());
    assert_eq!(m.stats().dedup_records, 0);
    let fresh = granted(run(&mut m, T0 + RETAIN, try_once("a", "r1", 3)));
    assert_eq!((fresh.lease_id, fresh.fencing_token), (lease(3), 2));
}

// ---- failover (SPEC §3.7) ----------------------------------------------------------------

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

/// SPEC §3.7: a new leader whose clock is ahead does not eat into the lease: it keeps its
/// remaining time as of the previous stamp plus the grace (not a reset to the full TTL).
#[test]
fn failover_with_new_leader_clock_ahead_never_shortens_lease() {
    let (_, lease_left, wait_left) = fail_over(1_500, 7_000);
    // Exactly: never less (the rule), and not the full 30 s TTL either.
    assert_eq!(lease_left, 20_000 + GRACE);
    assert_eq!(wait_left, 50_000 + GRACE);
}

/// SPEC §3.7: a new leader whose clock is behind does not stretch log time backwards; the lease
/// keeps its remaining time plus the grace, measured from the unchanged log time.
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

/// SPEC §3.7: an election longer than the remaining lease (2 min against 20 s) is not charged
/// to the lease: it is still held afterwards with its remaining time plus the grace.
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

/// SPEC §3.7: the shift happens once per leader change, not on every command of a term; and a
/// lease already run out at the previous stamp is not revived.
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

// ---- tokens across idle drop and snapshots (SPEC §3.2) -----------------------------------

/// SPEC §3.2: tokens keep increasing after an idle resource record (which carried the
/// resource's last token) is dropped.
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

/// SPEC §3.2: after a snapshot is taken and installed, the state is the same and new tokens
/// continue above every token issued before; queues, dedup and deadlines carry over.
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

/// Tick does at most `max_items` units of work per command, so one log entry stays small;
/// the rest is left for the next tick.
#[test]
fn tick_is_bounded_by_max_items() {
    let mut m = LockMachine::new();
    for (i, r) in ["a", "b", "c"].into_iter().enumerate() {
        granted(run(&mut m, T0, try_once(r, "r1", i as u128 + 1)));
    }
    let (resp, fx) = m.apply(&at(T0 + TTL, Command::Tick { max_items: 2 }), 1);
    assert_eq!(
        resp,
        Response::Ticked {
            expired: 2,
            handed_off: 0
        }
    );
    assert_eq!(fx.len(), 2);
    assert_eq!(m.stats().active_locks, 1);
    let (resp, _) = m.apply(&at(T0 + TTL, Command::Tick { max_items: 2 }), 1);
    assert_eq!(
        resp,
        Response::Ticked {
            expired: 1,
            handed_off: 0
        }
    );
    assert_eq!(m.stats().active_locks, 0);
}

// ---- model test --------------------------------------------------------------------------

const RESOURCE_NAMES: [&str; 4] = ["acct:1", "acct:2", "job/x", "q.z"];
const REQUEST_IDS: u8 = 6;
/// Lease ids the model never issues ("random" ids presented by a confused client).
const FOREIGN: u128 = 1 << 100;

#[derive(Clone, Debug)]
enum Pick {
    /// The resource's current lease according to the model (a foreign id if none).
    Current,
    /// Some lease id used before, on any resource.
    Stale(usize),
    /// A lease id nobody was ever given.
    Foreign(u64),
}

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        res: usize,
        rid: u8,
        ttl_ms: u64,
        wait_ms: u64,
        retain_ms: u64,
    },
    Renew {
        res: usize,
        pick: Pick,
    },
    Release {
        res: usize,
        pick: Pick,
    },
    Cancel {
        res: usize,
        rid: u8,
    },
    /// An operator ends whatever lease the resource has.
    ForceRelease {
        res: usize,
    },
    /// A fencing proxy asks to forward writes with a token.
    Admit {
        res: usize,
        token: TokenPick,
        proxy: u64,
        grant_ms: u64,
    },
    Tick {
        max_items: u32,
    },
    /// Real time passes on every clock.
    Advance {
        ms: u64,
    },
    /// A new leader takes over after `election_ms`, with its clock `offset_ms` off real time.
    LeaderChange {
        election_ms: u64,
        offset_ms: i64,
        grace_ms: u64,
    },
    /// The machine is replaced by one restored from its snapshot image.
    Restore,
}

#[derive(Clone, Debug)]
enum TokenPick {
    /// The token of the resource's current lease (or its last token if none).
    Current,
    /// Any token up to a little above the highest issued.
    Any(u64),
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        5 => Just(Pick::Current),
        3 => any::<usize>().prop_map(Pick::Stale),
        1 => any::<u64>().prop_map(Pick::Foreign),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let res = 0..RESOURCE_NAMES.len();
    prop_oneof![
        8 => (
            res.clone(),
            0..REQUEST_IDS,
            prop_oneof![Just(1_000u64), 1_000u64..60_000],
            prop_oneof![2 => Just(0u64), 2 => 1u64..40_000, 1 => 40_000u64..200_000],
            prop_oneof![Just(30_000u64), Just(RETAIN)],
        )
            .prop_map(|(res, rid, ttl_ms, wait_ms, retain_ms)| Op::Acquire {
                res,
                rid,
                ttl_ms,
                wait_ms,
                retain_ms
            }),
        4 => (res.clone(), pick()).prop_map(|(res, pick)| Op::Renew { res, pick }),
        3 => (res.clone(), pick()).prop_map(|(res, pick)| Op::Release { res, pick }),
        2 => (res.clone(), 0..REQUEST_IDS).prop_map(|(res, rid)| Op::Cancel { res, rid }),
        1 => res.clone().prop_map(|res| Op::ForceRelease { res }),
        3 => (
            res,
            prop_oneof![3 => Just(TokenPick::Current), 1 => any::<u64>().prop_map(TokenPick::Any)],
            0u64..3,
            1u64..20_000,
        )
            .prop_map(|(res, token, proxy, grant_ms)| Op::Admit {
                res,
                token,
                proxy,
                grant_ms
            }),
        2 => prop_oneof![Just(1u32), Just(3), Just(10_000)]
            .prop_map(|max_items| Op::Tick { max_items }),
        6 => prop_oneof![
            8 => 0u64..5_000,
            2 => 5_000u64..120_000,
            1 => 500_000u64..800_000,
        ]
        .prop_map(|ms| Op::Advance { ms }),
        1 => (
            prop_oneof![3 => 0u64..3_000, 1 => 20_000u64..150_000],
            -20_000i64..20_000,
            0u64..10_000,
        )
            .prop_map(|(election_ms, offset_ms, grace_ms)| Op::LeaderChange {
                election_ms,
                offset_ms,
                grace_ms
            }),
        1 => Just(Op::Restore),
    ]
}

// The reference model: the rules of SPEC §3–4 written as plainly as possible (linear scans,
// no indexes), with the same lazy expiry the machine documents: a lease, waiter or dedup
// record whose time is up stays until a command touches it or a Tick sweeps it.

#[derive(Clone, Debug)]
struct MLease {
    id: LeaseId,
    token: u64,
    ttl: u64,
    exp: u64,
}

#[derive(Clone, Debug)]
struct MWaiter {
    rid: String,
    id: LeaseId,
    ttl: u64,
    deadline: u64,
    retain: u64,
}

#[derive(Clone, Debug, Default)]
struct MRes {
    lease: Option<MLease>,
    queue: VecDeque<MWaiter>,
    last_token: u64,
    /// Highest token a proxy was admitted with.
    admitted: u64,
    /// Proxy admission grants: (proxy, token, until).
    grants: Vec<(u64, u64, u64)>,
    /// After a lease ended under live grants: no new token before this time.
    reissue_at: Option<u64>,
    idle_until: Option<u64>,
}

#[derive(Clone, Debug)]
enum MDedup {
    Granted { grant: Grant, expires: u64 },
    Waiting,
}

#[derive(Clone, Debug, Default)]
struct Model {
    now: u64,
    term: u64,
    last_token: u64,
    res: BTreeMap<String, MRes>,
    dedup: BTreeMap<(String, String), MDedup>,
    /// Highest token of any dropped idle record.
    gc_floor: u64,
}

impl Model {
    fn apply(&mut self, p: &Proposal, term: u64) -> (Response, Vec<Effect>) {
        let prev = self.now;
        let now = p.now_ms.max(prev);
        if term > self.term {
            if self.term != 0 || prev != 0 {
                // §3.7: whatever is still live at the previous stamp keeps its remaining time,
                // plus the time the new leader's clock is ahead, plus the grace.
                let by = now - prev + p.failover_grace_ms;
                for r in self.res.values_mut() {
                    if let Some(l) = r.lease.as_mut().filter(|l| l.exp > prev) {
                        l.exp += by;
                    }
                    for w in r.queue.iter_mut().filter(|w| w.deadline > prev) {
                        w.deadline += by;
                    }
                    for g in r.grants.iter_mut().filter(|g| g.2 > prev) {
                        g.2 += by;
                    }
                    if let Some(at) = r.reissue_at.as_mut().filter(|at| **at > prev) {
                        *at += by;
                    }
                }
            }
            self.term = term;
        }
        self.now = now;
        let mut fx = Vec::new();
        let resp = match &p.cmd {
            Command::Acquire(a) => self.acquire(a, &mut fx),
            Command::Renew { resource, lease_id } => {
                self.settle(resource, &mut fx);
                let now = self.now;
                match self
                    .res
                    .get_mut(resource)
                    .and_then(|r| r.lease.as_mut())
                    .filter(|l| l.id == *lease_id)
                {
                    Some(l) => {
                        l.exp = l.exp.max(now + l.ttl);
                        Response::Renewed(Grant {
                            resource: resource.clone(),
                            lease_id: l.id,
                            fencing_token: l.token,
                            ttl_ms: l.ttl,
                            expires_at_ms: l.exp,
                        })
                    }
                    None => Response::LeaseLost,
                }
            }
            Command::Release { resource, lease_id } => {
                self.settle(resource, &mut fx);
                if self.lease_id(resource) == Some(*lease_id) {
                    self.free(resource, &mut fx);
                    Response::Released(true)
                } else {
                    Response::Released(false)
                }
            }
            Command::Cancel {
                resource,
                request_id,
            } => {
                self.settle(resource, &mut fx);
                let key = (resource.clone(), request_id.clone());
                match self.dedup.get(&key).cloned() {
                    None => Response::Cancelled(false),
                    Some(MDedup::Waiting) => {
                        let r = self.res.get_mut(resource).expect("waiter's resource");
                        r.queue.retain(|w| &w.rid != request_id);
                        self.dedup.remove(&key);
                        fx.push(Effect::WaiterRemoved {
                            resource: resource.clone(),
                            request_id: request_id.clone(),
                            reason: WaiterGone::Cancelled,
                        });
                        self.mark_idle(resource);
                        Response::Cancelled(true)
                    }
                    // Granted: only the lease id ends a lease (§3.4).
                    Some(MDedup::Granted { .. }) => Response::Cancelled(false),
                }
            }
            Command::Admit {
                resource,
                fencing_token,
                proxy,
                grant_ms,
            } => Response::Admit(self.admit(resource, *fencing_token, *proxy, *grant_ms, &mut fx)),
            // An operator's forced release ends whatever lease is live, like its holder's release.
            Command::ForceRelease { resource, .. } => {
                self.settle(resource, &mut fx);
                let token = self
                    .res
                    .get(resource)
                    .and_then(|r| r.lease.as_ref())
                    .map(|l| l.token);
                if token.is_some() {
                    self.free(resource, &mut fx);
                }
                Response::ForceReleased {
                    fencing_token: token,
                }
            }
            Command::Tick { max_items } => self.tick(*max_items as usize, &mut fx),
        };
        (resp, fx)
    }

    fn lease_id(&self, resource: &str) -> Option<LeaseId> {
        self.res.get(resource)?.lease.as_ref().map(|l| l.id)
    }

    fn total_waiters(&self) -> usize {
        self.res.values().map(|r| r.queue.len()).sum()
    }

    fn acquire(&mut self, a: &Acquire, fx: &mut Vec<Effect>) -> Response {
        self.settle(&a.resource, fx);
        let key = (a.resource.clone(), a.request_id.clone());
        match self.dedup.get(&key) {
            Some(MDedup::Granted { grant, .. }) => {
                let mut g = grant.clone();
                if let Some(l) = self
                    .res
                    .get(&a.resource)
                    .and_then(|r| r.lease.as_ref())
                    .filter(|l| l.id == g.lease_id)
                {
                    g.expires_at_ms = l.exp;
                }
                return Response::Granted(g);
            }
            Some(MDedup::Waiting) => {
                let pos = self.res[&a.resource]
                    .queue
                    .iter()
                    .position(|w| w.rid == a.request_id)
                    .expect("waiting record has a waiter");
                return Response::Queued {
                    position: pos as u32 + 1,
                };
            }
            None => {}
        }
        // Busy while held, or while the previous token's proxy grants run out.
        let busy_until = self
            .res
            .get(&a.resource)
            .and_then(|r| r.lease.as_ref().map(|l| l.exp).or(r.reissue_at));
        let Some(busy_until) = busy_until else {
            let g = self.grant(&a.resource, a.lease_id, a.ttl_ms);
            self.remember_grant(&a.resource, &a.request_id, g.clone(), a.retain_ms);
            return Response::Granted(g);
        };
        if a.wait_timeout_ms == 0 {
            return Response::Held {
                retry_after_ms: busy_until - self.now,
            };
        }
        let total = self.total_waiters();
        let r = self.res.get_mut(&a.resource).expect("held resource");
        if r.queue.len() >= a.max_waiters as usize || total >= a.max_total_waiters as usize {
            return Response::TooManyWaiters;
        }
        r.queue.push_back(MWaiter {
            rid: a.request_id.clone(),
            id: a.lease_id,
            ttl: a.ttl_ms,
            deadline: self.now + a.wait_timeout_ms,
            retain: a.retain_ms,
        });
        let position = r.queue.len() as u32;
        self.dedup.insert(key, MDedup::Waiting);
        Response::Queued { position }
    }

    fn settle(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        let now = self.now;
        let Some(r) = self.res.get_mut(resource) else {
            return;
        };
        if let Some(l) = r.lease.clone().filter(|l| l.exp <= now) {
            fx.push(Effect::Expired {
                resource: resource.to_string(),
                fencing_token: l.token,
            });
            self.free(resource, fx);
        } else if r.lease.is_none() && r.reissue_at.is_some_and(|at| at <= now) {
            r.reissue_at = None;
            self.hand_off(resource, fx);
        }
    }

    /// Ends the lease; the next holder gets the lock now, or when the proxy grants for the
    /// ended token have run out (SPEC §5 epoch barrier).
    fn free(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        let now = self.now;
        let r = self.res.get_mut(resource).expect("resource");
        r.lease = None;
        r.grants.retain(|g| g.2 > now);
        if let Some(until) = r.grants.iter().map(|g| g.2).max() {
            r.reissue_at = Some(until);
            return;
        }
        self.hand_off(resource, fx);
    }

    fn hand_off(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        let now = self.now;
        let r = self.res.get_mut(resource).expect("resource");
        while let Some(w) = r.queue.pop_front() {
            if w.deadline <= now {
                self.dedup.remove(&(resource.to_string(), w.rid.clone()));
                fx.push(Effect::WaiterRemoved {
                    resource: resource.to_string(),
                    request_id: w.rid,
                    reason: WaiterGone::TimedOut,
                });
                continue;
            }
            let g = self.grant(resource, w.id, w.ttl);
            self.remember_grant(resource, &w.rid, g.clone(), w.retain);
            fx.push(Effect::HandedOff {
                request_id: w.rid,
                grant: g,
            });
            return;
        }
        self.mark_idle(resource);
    }

    /// SPEC §3.3 / §5: a proxy may forward writes only with the resource's current, live
    /// token, never one below the highest issued or admitted, never one not issued for it.
    fn admit(
        &mut self,
        resource: &str,
        token: u64,
        proxy: u64,
        grant_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> AdmitOutcome {
        self.settle(resource, fx);
        let now = self.now;
        let Some(r) = self.res.get_mut(resource) else {
            return if token <= self.gc_floor {
                AdmitOutcome::Stale {
                    highest: self.gc_floor,
                }
            } else {
                AdmitOutcome::Unknown
            };
        };
        let highest = r.last_token.max(r.admitted);
        if token < highest {
            return AdmitOutcome::Stale { highest };
        }
        if token > r.last_token {
            return AdmitOutcome::Unknown;
        }
        let Some(exp) = r.lease.as_ref().filter(|l| l.token == token).map(|l| l.exp) else {
            return AdmitOutcome::Ended;
        };
        let until = (now + grant_ms).min(exp);
        r.grants.retain(|g| g.2 > now);
        match r.grants.iter_mut().find(|g| g.0 == proxy && g.1 == token) {
            Some(g) => g.2 = g.2.max(until),
            None => r.grants.push((proxy, token, until)),
        }
        r.admitted = r.admitted.max(token);
        AdmitOutcome::Admitted {
            grant_ms: until - now,
        }
    }

    fn grant(&mut self, resource: &str, id: LeaseId, ttl: u64) -> Grant {
        self.last_token += 1;
        let r = self.res.entry(resource.to_string()).or_default();
        r.lease = Some(MLease {
            id,
            token: self.last_token,
            ttl,
            exp: self.now + ttl,
        });
        r.last_token = self.last_token;
        r.idle_until = None;
        Grant {
            resource: resource.to_string(),
            lease_id: id,
            fencing_token: self.last_token,
            ttl_ms: ttl,
            expires_at_ms: self.now + ttl,
        }
    }

    fn remember_grant(&mut self, resource: &str, rid: &str, grant: Grant, retain: u64) {
        self.dedup.insert(
            (resource.to_string(), rid.to_string()),
            MDedup::Granted {
                grant,
                expires: self.now + retain,
            },
        );
    }

    fn mark_idle(&mut self, resource: &str) {
        let now = self.now;
        if let Some(r) = self.res.get_mut(resource) {
            if r.lease.is_none()
                && r.queue.is_empty()
                && r.idle_until.is_none()
                && r.reissue_at.is_none()
            {
                r.idle_until = Some(now + DEFAULT_IDLE_RETAIN_MS);
            }
        }
    }

    /// Expired leases first (earliest first), then timed-out waiters, then dedup records,
    /// then idle records, `budget` items in all.
    fn tick(&mut self, mut budget: usize, fx: &mut Vec<Effect>) -> Response {
        let now = self.now;
        let mut expired = 0;
        let mut handed_off = 0;
        let mut due: Vec<(u64, String)> = self
            .res
            .iter()
            .filter_map(|(n, r)| r.lease.as_ref().map(|l| (l.exp, n.clone())))
            .filter(|(exp, _)| *exp <= now)
            .collect();
        due.sort();
        for (_, name) in due.into_iter().take(budget) {
            budget -= 1;
            expired += 1;
            let before = fx.len();
            self.settle(&name, fx);
            handed_off += fx[before..]
                .iter()
                .filter(|e| matches!(e, Effect::HandedOff { .. }))
                .count() as u32;
        }
        let mut due: Vec<(u64, String)> = self
            .res
            .iter()
            .filter_map(|(n, r)| r.reissue_at.map(|at| (at, n.clone())))
            .filter(|(at, _)| *at <= now)
            .collect();
        due.sort();
        for (_, name) in due.into_iter().take(budget) {
            budget -= 1;
            let before = fx.len();
            self.settle(&name, fx);
            handed_off += fx[before..]
                .iter()
                .filter(|e| matches!(e, Effect::HandedOff { .. }))
                .count() as u32;
        }
        let mut due: Vec<(u64, String, String)> = self
            .res
            .iter()
            .flat_map(|(n, r)| {
                r.queue
                    .iter()
                    .map(|w| (w.deadline, n.clone(), w.rid.clone()))
            })
            .filter(|(d, _, _)| *d <= now)
            .collect();
        due.sort();
        for (_, name, rid) in due.into_iter().take(budget) {
            budget -= 1;
            self.res
                .get_mut(&name)
                .expect("resource")
                .queue
                .retain(|w| w.rid != rid);
            self.dedup.remove(&(name.clone(), rid.clone()));
            fx.push(Effect::WaiterRemoved {
                resource: name.clone(),
                request_id: rid,
                reason: WaiterGone::TimedOut,
            });
            self.mark_idle(&name);
        }
        let mut due: Vec<(u64, String, String)> = self
            .dedup
            .iter()
            .filter_map(|((n, q), d)| match d {
                MDedup::Granted { expires, .. } if *expires <= now => {
                    Some((*expires, n.clone(), q.clone()))
                }
                _ => None,
            })
            .collect();
        due.sort();
        for (_, name, rid) in due.into_iter().take(budget) {
            budget -= 1;
            self.dedup.remove(&(name, rid));
        }
        let mut due: Vec<(u64, String)> = self
            .res
            .iter()
            .filter_map(|(n, r)| r.idle_until.map(|u| (u, n.clone())))
            .filter(|(u, _)| *u <= now)
            .collect();
        due.sort();
        for (_, name) in due.into_iter().take(budget) {
            let gone = self.res.remove(&name).expect("idle record");
            self.gc_floor = self.gc_floor.max(gone.last_token).max(gone.admitted);
        }
        Response::Ticked {
            expired,
            handed_off,
        }
    }
}

/// Everything the random walk needs besides the machine and the model: the clocks, the lease
/// ids handed out, and what the invariants remember across steps.
struct World {
    m: LockMachine,
    model: Model,
    /// Real time; leader stamps are this plus the leader's clock offset.
    real_ms: u64,
    offset_ms: i64,
    grace_ms: u64,
    term: u64,
    /// A leader change happened and its first command has not been applied yet.
    pending_failover: bool,
    next_lease: u128,
    used_leases: Vec<LeaseId>,
    /// Highest fencing token seen in any response or effect (invariant 2).
    max_token: u64,
}

/// The machine as it was before a step, for the invariants that compare before and after.
struct Before {
    now: u64,
    token: u64,
    /// resource -> (lease id, token, expiry)
    leases: HashMap<String, (LeaseId, u64, u64)>,
    model: Model,
}

fn sorted_debug(fx: &[Effect]) -> Vec<String> {
    let mut v: Vec<String> = fx.iter().map(|e| format!("{e:?}")).collect();
    v.sort();
    v
}

impl World {
    fn new() -> Self {
        World {
            m: LockMachine::new(),
            model: Model::default(),
            real_ms: T0,
            offset_ms: 0,
            grace_ms: GRACE,
            term: 1,
            pending_failover: false,
            next_lease: 1,
            used_leases: Vec::new(),
            max_token: 0,
        }
    }

    fn stamp(&self) -> u64 {
        self.real_ms.saturating_add_signed(self.offset_ms)
    }

    fn lease_for(&mut self, res: &str, pick: &Pick) -> LeaseId {
        match pick {
            Pick::Current => self
                .model
                .lease_id(res)
                .unwrap_or(LeaseId(FOREIGN | 0xdead)),
            Pick::Stale(i) if !self.used_leases.is_empty() => {
                self.used_leases[i % self.used_leases.len()]
            }
            Pick::Stale(_) => LeaseId(FOREIGN),
            Pick::Foreign(x) => LeaseId(FOREIGN | u128::from(*x)),
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let cmd = match op {
            Op::Advance { ms } => {
                self.real_ms += ms;
                return Ok(());
            }
            Op::LeaderChange {
                election_ms,
                offset_ms,
                grace_ms,
            } => {
                self.real_ms += election_ms;
                self.offset_ms = *offset_ms;
                self.grace_ms = *grace_ms;
                self.term += 1;
                self.pending_failover = true;
                return Ok(());
            }
            Op::Restore => {
                let image = self.m.image();
                self.m = restore(&self.m);
                prop_assert_eq!(self.m.image(), image, "restored image differs");
                return self.check();
            }
            Op::Acquire {
                res,
                rid,
                ttl_ms,
                wait_ms,
                retain_ms,
            } => {
                let id = LeaseId(self.next_lease);
                self.next_lease += 1;
                self.used_leases.push(id);
                Command::Acquire(Acquire {
                    resource: RESOURCE_NAMES[*res].to_string(),
                    request_id: format!("req-{rid}"),
                    holder: Some(format!("client-{rid}")),
                    ttl_ms: *ttl_ms,
                    wait_timeout_ms: *wait_ms,
                    lease_id: id,
                    retain_ms: *retain_ms,
                    max_waiters: 2,
                    max_total_waiters: 4,
                })
            }
            Op::Renew { res, pick } => Command::Renew {
                resource: RESOURCE_NAMES[*res].to_string(),
                lease_id: self.lease_for(RESOURCE_NAMES[*res], pick),
            },
            Op::Release { res, pick } => Command::Release {
                resource: RESOURCE_NAMES[*res].to_string(),
                lease_id: self.lease_for(RESOURCE_NAMES[*res], pick),
            },
            Op::Cancel { res, rid } => Command::Cancel {
                resource: RESOURCE_NAMES[*res].to_string(),
                request_id: format!("req-{rid}"),
            },
            Op::ForceRelease { res } => Command::ForceRelease {
                resource: RESOURCE_NAMES[*res].to_string(),
                operator: "ops".to_string(),
            },
            Op::Admit {
                res,
                token,
                proxy,
                grant_ms,
            } => {
                let name = RESOURCE_NAMES[*res];
                let r = self.model.res.get(name);
                let fencing_token = match token {
                    TokenPick::Current => r
                        .map(|r| r.lease.as_ref().map_or(r.last_token, |l| l.token))
                        .unwrap_or(1),
                    TokenPick::Any(x) => x % (self.model.last_token + 3),
                };
                Command::Admit {
                    resource: name.to_string(),
                    fencing_token,
                    proxy: *proxy,
                    grant_ms: *grant_ms,
                }
            }
            Op::Tick { max_items } => Command::Tick {
                max_items: *max_items,
            },
        };
        let p = Proposal {
            now_ms: self.stamp(),
            failover_grace_ms: self.grace_ms,
            cmd,
        };

        let before = Before {
            now: self.m.now_ms(),
            token: self.m.last_token(),
            leases: RESOURCE_NAMES
                .iter()
                .filter_map(|r| {
                    let l = self.m.lease(r)?;
                    Some((
                        r.to_string(),
                        (l.lease_id, l.fencing_token, l.expires_at_ms),
                    ))
                })
                .collect(),
            model: self.model.clone(),
        };

        let (resp, fx) = self.m.apply(&p, self.term);
        let (want, want_fx) = self.model.apply(&p, self.term);
        prop_assert_eq!(&resp, &want, "response to {:?}", p.cmd);
        prop_assert_eq!(
            sorted_debug(&fx),
            sorted_debug(&want_fx),
            "effects of {:?}",
            p.cmd
        );
        let failover = std::mem::take(&mut self.pending_failover);
        self.check_step(&p, &resp, &fx, &before, failover)?;
        self.check()
    }

    /// Invariants about one step: what its response and effects may be given the state before.
    fn check_step(
        &mut self,
        p: &Proposal,
        resp: &Response,
        fx: &[Effect],
        before: &Before,
        failover: bool,
    ) -> Result<(), TestCaseError> {
        let now = self.m.now_ms();
        prop_assert!(now >= before.now, "log time went backwards");

        // (2) Every newly granted token is above every token before; the counter never
        // decreases and accounts for every grant.
        let mut fresh: Vec<&Grant> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::HandedOff { grant, .. } => Some(grant),
                _ => None,
            })
            .collect();
        if let (Command::Acquire(a), Response::Granted(g)) = (&p.cmd, resp) {
            if g.lease_id == a.lease_id {
                fresh.push(g);
            }
        }
        fresh.sort_by_key(|g| g.fencing_token);
        for g in fresh {
            prop_assert!(
                g.fencing_token > self.max_token,
                "token {} not above {}",
                g.fencing_token,
                self.max_token
            );
            self.max_token = g.fencing_token;
        }
        prop_assert!(self.m.last_token() >= before.token);
        prop_assert_eq!(self.m.last_token(), self.max_token);

        // (4) Only the current lease id renews or releases; a renewal never shortens.
        let (resource, lease_id, succeeded) = match (&p.cmd, resp) {
            (Command::Renew { resource, lease_id }, r) => {
                (resource, lease_id, matches!(r, Response::Renewed(_)))
            }
            (Command::Release { resource, lease_id }, r) => {
                (resource, lease_id, *r == Response::Released(true))
            }
            _ => return self.check_retry_and_failover(p, resp, fx, before, failover),
        };
        let held = before.leases.get(resource);
        // The lock may have changed hands inside this very command (the holder's lease ran out
        // and a waiter got it); then the new lease is the current one.
        let handed_off_now = fx.iter().any(|e| {
            matches!(e, Effect::HandedOff { grant, .. }
                if grant.resource == *resource && grant.lease_id == *lease_id)
        });
        if succeeded && !handed_off_now {
            let (id, _, exp) =
                held.ok_or_else(|| TestCaseError::fail("renew/release without a lease"))?;
            prop_assert_eq!(
                id.0,
                lease_id.0,
                "renew/release with a lease id not current"
            );
            if !failover {
                prop_assert!(*exp > now, "renewed/released a lease that had run out");
            }
            if let Response::Renewed(g) = resp {
                prop_assert!(g.expires_at_ms >= (*exp).max(now + g.ttl_ms));
            }
        } else if let Some((id, token, _)) = held {
            // A stale release or renewal never removes the holder: its lease is still there,
            // or it ran out (and this command reported the expiry).
            let kept = self.m.lease(resource).map(|l| l.lease_id) == Some(*id);
            let expired = fx.contains(&Effect::Expired {
                resource: resource.clone(),
                fencing_token: *token,
            });
            prop_assert!(kept || expired, "stale renew/release removed the holder");
        }
        self.check_retry_and_failover(p, resp, fx, before, failover)
    }

    fn check_retry_and_failover(
        &self,
        p: &Proposal,
        resp: &Response,
        fx: &[Effect],
        before: &Before,
        failover: bool,
    ) -> Result<(), TestCaseError> {
        let now = self.m.now_ms();
        // (3) A proxy is admitted only with the resource's current, live token, which is the
        // highest ever issued for it.
        if let (
            Command::Admit {
                resource,
                fencing_token,
                ..
            },
            Response::Admit(AdmitOutcome::Admitted { grant_ms }),
        ) = (&p.cmd, resp)
        {
            let r = self
                .m
                .resource(resource)
                .ok_or_else(|| TestCaseError::fail("admitted on a resource without record"))?;
            let l = r
                .lease
                .as_ref()
                .ok_or_else(|| TestCaseError::fail("admitted without a lease"))?;
            prop_assert_eq!(l.fencing_token, *fencing_token);
            prop_assert_eq!(r.last_token, *fencing_token);
            prop_assert!(
                now + grant_ms <= l.expires_at_ms,
                "grant outlives the lease"
            );
        }
        // (6) A retry returns the original result and never adds a lease or a waiter.
        if let Command::Acquire(a) = &p.cmd {
            let key = (a.resource.clone(), a.request_id.clone());
            // Settling the resource may first find that this request's wait ran out: then the
            // original acquire is over (timed out) and this one is a new acquire.
            let timed_out = fx.contains(&Effect::WaiterRemoved {
                resource: a.resource.clone(),
                request_id: a.request_id.clone(),
                reason: WaiterGone::TimedOut,
            });
            let retry = before.model.dedup.get(&key).filter(|_| !timed_out);
            match retry {
                Some(MDedup::Granted { grant, .. }) => {
                    let Response::Granted(g) = resp else {
                        return Err(TestCaseError::fail(format!("retry got {resp:?}")));
                    };
                    prop_assert_eq!(
                        (g.lease_id, g.fencing_token),
                        (grant.lease_id, grant.fencing_token)
                    );
                }
                Some(MDedup::Waiting) => {
                    let ok = match resp {
                        Response::Queued { .. } => true,
                        // Settling the resource may hand it to this very waiter.
                        Response::Granted(g) => fx.iter().any(|e| {
                            matches!(e, Effect::HandedOff { request_id, grant }
                                if *request_id == a.request_id && grant == g)
                        }),
                        _ => false,
                    };
                    prop_assert!(ok, "retry of a queued acquire got {:?}", resp);
                }
                None => {}
            }
            if retry.is_some() {
                let queued_before = before
                    .model
                    .res
                    .get(&a.resource)
                    .map_or(0, |r| r.queue.len());
                prop_assert!(waiting(&self.m, &a.resource).len() <= queued_before);
                let used = self.m.lease(&a.resource).map(|l| l.lease_id) == Some(a.lease_id)
                    || self
                        .m
                        .resource(&a.resource)
                        .is_some_and(|r| r.waiters.iter().any(|w| w.lease_id == a.lease_id));
                prop_assert!(!used, "a retry created a second lease or waiter");
            }
        }

        // (7) No lease's expiry ever moves earlier; across a leader change a live lease keeps
        // at least its remaining time as of the previous stamp plus the grace.
        for (resource, (id, _, exp_before)) in &before.leases {
            let Some(l) = self.m.lease(resource).filter(|l| l.lease_id == *id) else {
                continue;
            };
            prop_assert!(l.expires_at_ms >= *exp_before, "lease expiry moved earlier");
            if failover && *exp_before > before.now {
                prop_assert!(
                    l.expires_at_ms - now >= exp_before - before.now + p.failover_grace_ms,
                    "failover shortened the lease on {}: {} left, had {} + grace {}",
                    resource,
                    l.expires_at_ms - now,
                    exp_before - before.now,
                    p.failover_grace_ms
                );
            }
        }
        if failover {
            // Every lease live at the previous stamp survives the new leader's first command,
            // unless that command released it.
            for (resource, (id, _, exp_before)) in &before.leases {
                let released = matches!(&p.cmd,
                    Command::Release { resource: r, lease_id } if r == resource && lease_id == id)
                    || matches!(&p.cmd, Command::ForceRelease { resource: r, .. } if r == resource);
                if *exp_before > before.now && !released {
                    prop_assert_eq!(self.m.lease(resource).map(|l| l.lease_id), Some(*id));
                }
            }
        }
        Ok(())
    }

    /// Invariants about the state after any step.
    fn check(&self) -> Result<(), TestCaseError> {
        let m = &self.m;
        m.check_indexes().map_err(TestCaseError::fail)?;
        let image = m.image();
        prop_assert_eq!(&LockMachine::from_image(image.clone()).image(), &image);
        prop_assert_eq!(m.now_ms(), self.model.now);
        prop_assert_eq!(m.last_token(), self.model.last_token);

        // (1) At most one lease per resource, the one the model says; lease ids are unique.
        let mut ids = HashSet::new();
        for name in RESOURCE_NAMES {
            let want = self.model.res.get(name);
            let got = m.resource(name);
            prop_assert_eq!(got.is_some(), want.is_some(), "record of {}", name);
            let (Some(got), Some(want)) = (got, want) else {
                continue;
            };
            let got_lease = got
                .lease
                .as_ref()
                .map(|l| (l.lease_id, l.fencing_token, l.ttl_ms, l.expires_at_ms));
            let want_lease = want.lease.as_ref().map(|l| (l.id, l.token, l.ttl, l.exp));
            prop_assert_eq!(got_lease, want_lease, "lease of {}", name);
            if let Some(l) = &got.lease {
                prop_assert!(ids.insert(l.lease_id), "lease id on two resources");
            }
            let got_q: Vec<(&str, LeaseId, u64)> = got
                .waiters
                .iter()
                .map(|w| (w.request_id.as_str(), w.lease_id, w.deadline_ms))
                .collect();
            let want_q: Vec<(&str, LeaseId, u64)> = want
                .queue
                .iter()
                .map(|w| (w.rid.as_str(), w.id, w.deadline))
                .collect();
            prop_assert_eq!(got_q, want_q, "queue of {}", name);
            let mut rids: Vec<&str> = got.waiters.iter().map(|w| w.request_id.as_str()).collect();
            rids.sort_unstable();
            rids.dedup();
            prop_assert_eq!(rids.len(), got.waiters.len(), "a request waits twice");
            prop_assert_eq!(got.last_token, want.last_token);
            prop_assert_eq!(got.idle_until_ms, want.idle_until);
            prop_assert_eq!(got.admitted, want.admitted);
            prop_assert_eq!(got.reissue_at_ms, want.reissue_at);
            let grants: Vec<(u64, u64, u64)> = got
                .grants
                .iter()
                .map(|g| (g.proxy, g.fencing_token, g.until_ms))
                .collect();
            prop_assert_eq!(&grants, &want.grants, "proxy grants of {}", name);
            // SPEC §5 epoch barrier: no token newer than one a proxy may still forward with.
            if let Some(l) = &got.lease {
                prop_assert!(
                    got.grants
                        .iter()
                        .all(|g| g.fencing_token >= l.fencing_token || g.until_ms <= m.now_ms()),
                    "token {} issued on {} while a grant for an older token lives",
                    l.fencing_token,
                    name
                );
            }
        }
        prop_assert_eq!(image.gc_floor, self.model.gc_floor);
        let stats = m.stats();
        prop_assert_eq!(stats.resources as usize, self.model.res.len());
        prop_assert_eq!(stats.waiters as usize, self.model.total_waiters());
        prop_assert_eq!(stats.dedup_records as usize, self.model.dedup.len());
        let dedup: Vec<(String, String)> = image
            .dedup
            .iter()
            .map(|(r, q, _)| (r.clone(), q.clone()))
            .collect();
        let want: Vec<(String, String)> = self.model.dedup.keys().cloned().collect();
        prop_assert_eq!(dedup, want);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// SPEC §3.1, §3.2, §3.4, §3.6, §3.7 against a reference model, over hundreds of random
    /// commands with retries, stale ids, clock jumps, leader changes and snapshot restores.
    #[test]
    fn random_histories_match_the_model_and_keep_the_invariants(
        ops in prop::collection::vec(op(), 100..400)
    ) {
        let mut w = World::new();
        for op in &ops {
            w.step(op)?;
        }
    }
}
