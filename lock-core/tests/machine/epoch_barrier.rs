//! The epoch barrier in the state machine: once a proxy was admitted with a token, no newer
//! token is issued for the resource while that admission grant lives. A release defers the next
//! token until the grants end; an expiry does not (grants end with the lease). Grants survive
//! snapshots and shift with leader changes like leases.

use lock_core::machine::{AdmitOutcome, LockMachine, Response};

use crate::support::{
    acquire_with, admit_at, at, granted, grants, handed_off, reissue_at, release, restore, run,
    run2, tick, try_once, GRACE, GRANT, P1, P2, T0, TTL,
};

// ---- the epoch barrier: release defers, expiry does not ------------------------------------

/// Releasing while a grant lives defers the next token until the grant ends when no proxy
/// confirms the revocation. A try-once acquire gets `Revoking` with the grant's end as
/// `retry_after_ms`; a waiter is handed the lock only by a Tick at or after the grant's end.
#[test]
fn release_with_a_live_grant_defers_the_next_token_until_the_grant_ends() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    assert!(matches!(
        admit_at(&mut m, T0 + 100, "a", 1, P1),
        AdmitOutcome::Admitted { .. }
    ));
    let grant_end = T0 + 100 + GRANT;

    assert_eq!(
        run(&mut m, T0 + 200, release("a", 1)),
        Response::Released(true)
    );
    assert_eq!(m.lease("a"), None);
    assert_eq!(reissue_at(&m, "a"), Some(grant_end));
    assert_eq!(m.next_deadline(), Some(grant_end));
    // The released token is not admitted any more, even though its grant is still recorded.
    assert_eq!(admit_at(&mut m, T0 + 250, "a", 1, P2), AdmitOutcome::Ended);

    assert_eq!(
        run(&mut m, T0 + 300, try_once("a", "C", 3)),
        Response::Revoking {
            retry_after_ms: grant_end - (T0 + 300)
        }
    );
    assert_eq!(
        run(&mut m, T0 + 400, acquire_with("a", "B", 2, TTL, 10_000)),
        Response::Queued { position: 1 }
    );
    assert_eq!(m.last_token(), 1, "no token while the grant lives");

    // One ms before the grant ends nothing happens.
    let (_, fx) = m.apply(&at(grant_end - 1, tick()), 1);
    assert!(handed_off(&fx).is_empty(), "{fx:?}");
    assert_eq!(m.lease("a"), None);

    let (resp, fx) = m.apply(&at(grant_end, tick()), 1);
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
    assert!(
        matches!(resp, Response::Ticked { handed_off: 1, .. }),
        "{resp:?}"
    );
    assert_eq!(reissue_at(&m, "a"), None);
    let l = m.lease("a").expect("B holds");
    assert_eq!((l.fencing_token, l.granted_at_ms), (2, grant_end));
    assert_eq!(
        admit_at(&mut m, grant_end + 1, "a", 1, P1),
        AdmitOutcome::Stale { highest: 2 }
    );
    m.check_indexes().expect("indexes");
}

/// With no waiter, the deferral is also resolved lazily by the next command
/// that touches the resource at or after the grant's end (no Tick needed), and the resource
/// becomes idle only then.
#[test]
fn a_deferred_resource_is_granted_by_the_first_acquire_after_the_grant() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1);
    run(&mut m, T0 + 1, release("a", 1));
    assert_eq!(m.resource("a").and_then(|r| r.idle_until_ms), None);
    let g = granted(run(&mut m, T0 + GRANT, try_once("a", "B", 2)));
    assert_eq!(g.fencing_token, 2);
    assert_eq!(reissue_at(&m, "a"), None);
    m.check_indexes().expect("indexes");
}

/// The deferral lasts until the *last* live grant ends, over all proxies; grants that already
/// ended do not defer at all.
#[test]
fn release_waits_for_the_latest_grant_and_ignores_ended_ones() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1);
    admit_at(&mut m, T0 + 700, "a", 1, P2);
    run(&mut m, T0 + 800, release("a", 1));
    assert_eq!(reissue_at(&m, "a"), Some(T0 + 700 + GRANT));

    // A lease whose grants all ran out is released without deferral.
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("b", "A", 11)));
    admit_at(&mut m, T0, "b", 1, P1);
    run(&mut m, T0 + GRANT, release("b", 11));
    assert_eq!(reissue_at(&m, "b"), None);
    assert_eq!(
        granted(run(&mut m, T0 + GRANT, try_once("b", "B", 12))).fencing_token,
        2
    );
}

/// Expiry never defers, because grants end with the lease. A waiter is handed
/// the lock in the same Tick that expires the old lease.
#[test]
fn expiry_hands_off_at_once() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, acquire_with("a", "A", 1, 1_500, 0)));
    admit_at(&mut m, T0 + 100, "a", 1, P1);
    admit_at(&mut m, T0 + 200, "a", 1, P2);
    assert_eq!(
        run(&mut m, T0 + 300, acquire_with("a", "B", 2, TTL, 10_000)),
        Response::Queued { position: 1 }
    );
    let (_, fx) = m.apply(&at(T0 + 1_500, tick()), 1);
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
    assert_eq!(reissue_at(&m, "a"), None);

    // Same for a try-once acquire arriving exactly at the expiry.
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, acquire_with("c", "A", 3, 1_500, 0)));
    admit_at(&mut m, T0 + 100, "c", 1, P1);
    let g = granted(run(&mut m, T0 + 1_500, try_once("c", "C", 4)));
    assert_eq!(g.fencing_token, 2);
}

// ---- durability and failover ---------------------------------------------------------------

/// The barrier is durable and replicated: grants, the admitted token and a pending deferral
/// are part of the snapshot image; a restored machine defers and hands off exactly like the
/// original.
#[test]
fn grants_and_deferrals_survive_a_snapshot_round_trip() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0 + 100, "a", 1, P1);
    let restored = restore(&m);
    assert_eq!(restored.resource("a"), m.resource("a"));
    restored.check_indexes().expect("indexes after restore");

    // Release on the restored machine defers just the same.
    let mut m = restored;
    run(&mut m, T0 + 200, release("a", 1));
    run(&mut m, T0 + 300, acquire_with("a", "B", 2, TTL, 10_000));
    let mut m = restore(&m);
    assert_eq!(reissue_at(&m, "a"), Some(T0 + 100 + GRANT));
    assert_eq!(m.next_deadline(), Some(T0 + 100 + GRANT));
    m.check_indexes().expect("indexes after restore");
    let (_, fx) = m.apply(&at(T0 + 100 + GRANT - 1, tick()), 1);
    assert!(handed_off(&fx).is_empty());
    let (_, fx) = m.apply(&at(T0 + 100 + GRANT, tick()), 1);
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
}

/// A leader change never shortens a grant either: it shifts every live grant (and a pending
/// deferral) like a lease — by the time since the last stamp plus the grace — so a new leader
/// never lets a newer token exist while an old grant may still be in use. Ended grants stay.
#[test]
fn a_term_change_shifts_live_grants_and_deferrals_like_leases() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1); // until T0 + 2000
    granted(run(&mut m, T0, try_once("b", "A", 2)));
    admit_at(&mut m, T0, "b", 2, P1); // until T0 + 2000
    granted(run(&mut m, T0, acquire_with("c", "A", 3, 1_000, 0)));
    admit_at(&mut m, T0 + 100, "c", 3, P1); // until T0 + 1000 (capped at the lease)
    run(&mut m, T0 + 500, release("b", 2)); // deferred until T0 + 2000
    assert_eq!(reissue_at(&m, "b"), Some(T0 + GRANT));

    // Log time stands at T0 + 500. The new leader's first stamp is T0 + 1500: shift by
    // 1000 + GRACE for everything still live at T0 + 500.
    let shift = 1_000 + GRACE;
    m.apply(&at(T0 + 1_500, tick()), 2);
    assert_eq!(grants(&m, "a")[0].until_ms, T0 + GRANT + shift);
    assert_eq!(
        m.lease("a").map(|l| l.expires_at_ms),
        Some(T0 + TTL + shift)
    );
    assert_eq!(reissue_at(&m, "b"), Some(T0 + GRANT + shift));
    // c's grant and lease were live at T0 + 500 too: both shifted, still equal.
    assert_eq!(grants(&m, "c")[0].until_ms, T0 + 1_000 + shift);
    assert_eq!(
        m.lease("c").map(|l| l.expires_at_ms),
        Some(T0 + 1_000 + shift)
    );
    m.check_indexes().expect("indexes");

    // A release of a in the new term defers until the shifted grant end.
    run2(&mut m, T0 + 1_600, release("a", 1));
    assert_eq!(reissue_at(&m, "a"), Some(T0 + GRANT + shift));
    assert!(matches!(
        run2(&mut m, T0 + GRANT + 1, try_once("a", "B", 4)),
        Response::Revoking { .. }
    ));
    assert_eq!(
        granted(run2(&mut m, T0 + GRANT + shift, try_once("a", "B2", 5))).fencing_token,
        4
    );
}

/// A grant that had ended before the failover is not revived by the shift.
#[test]
fn a_term_change_does_not_revive_ended_grants() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1); // until T0 + 2000
    run(&mut m, T0 + 3_000, tick());
    m.apply(&at(T0 + 4_000, tick()), 2);
    assert_eq!(grants(&m, "a")[0].until_ms, T0 + GRANT);
    run2(&mut m, T0 + 4_001, release("a", 1));
    assert_eq!(reissue_at(&m, "a"), None);
}
