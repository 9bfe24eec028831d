//! `Command::Admit`, a fencing proxy's question "may I forward writes with this token?", tested
//! by the machine's outputs. The rule: a proxy never forwards a write whose token is below the
//! highest issued or admitted for the resource, nor a token not issued for it.
//!
//! The random histories also drive Admit; these are the readable, hand-picked cases.

use lock_core::machine::{
    AdmitOutcome, Effect, FenceGrant, LockMachine, Response, DEFAULT_IDLE_RETAIN_MS,
};

use crate::support::{
    acquire_with, admit, admit_at, at, granted, grants, release, renew, run, tick, try_once, GRANT,
    P1, P2, T0, TTL,
};

// ---- what is admitted ----------------------------------------------------------------------

/// Only the resource's current token, while its lease is live, is admitted; the grant lasts
/// `grant_ms` and is recorded per proxy.
#[test]
fn admits_only_the_current_live_token() {
    let mut m = LockMachine::new();
    let a = granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(a.fencing_token, 1);

    assert_eq!(
        admit_at(&mut m, T0 + 10, "a", 1, P1),
        AdmitOutcome::Admitted { grant_ms: GRANT }
    );
    assert_eq!(
        grants(&m, "a"),
        vec![FenceGrant {
            proxy: P1,
            fencing_token: 1,
            until_ms: T0 + 10 + GRANT
        }]
    );
    assert_eq!(m.resource("a").map(|r| r.admitted), Some(1));

    // A second proxy gets its own grant; the first proxy asking again extends its own entry
    // instead of adding one.
    assert_eq!(
        admit_at(&mut m, T0 + 20, "a", 1, P2),
        AdmitOutcome::Admitted { grant_ms: GRANT }
    );
    assert_eq!(
        admit_at(&mut m, T0 + 500, "a", 1, P1),
        AdmitOutcome::Admitted { grant_ms: GRANT }
    );
    let mut g = grants(&m, "a");
    g.sort_by_key(|g| g.proxy);
    assert_eq!(
        g,
        vec![
            FenceGrant {
                proxy: P1,
                fencing_token: 1,
                until_ms: T0 + 500 + GRANT
            },
            FenceGrant {
                proxy: P2,
                fencing_token: 1,
                until_ms: T0 + 20 + GRANT
            },
        ]
    );
    // Admission issues no token and changes no lease.
    assert_eq!(m.last_token(), 1);
    assert_eq!(m.lease("a").map(|l| l.expires_at_ms), Some(T0 + TTL));
    m.check_indexes().expect("indexes");
}

/// A token above anything issued for the resource was never issued for it: `Unknown`, whether
/// or not the resource has a record, and no grant is recorded.
#[test]
fn never_issued_tokens_are_unknown() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(admit_at(&mut m, T0 + 1, "a", 2, P1), AdmitOutcome::Unknown);
    assert_eq!(
        admit_at(&mut m, T0 + 1, "a", 999, P1),
        AdmitOutcome::Unknown
    );
    // A resource nobody ever locked: no record, nothing below the gc floor.
    assert_eq!(
        admit_at(&mut m, T0 + 1, "never", 1, P1),
        AdmitOutcome::Unknown
    );
    assert!(m.resource("never").is_none(), "admission created a record");
    assert!(grants(&m, "a").is_empty());
    assert_eq!(m.resource("a").map(|r| r.admitted), Some(0));
}

/// Tokens start at 1: token 0 was never issued for anything. On a resource nobody locked it is
/// `Unknown`; on one with a token it is below that token, and `Stale` like any lower token.
#[test]
fn token_zero_is_unknown_where_nothing_was_issued_and_stale_below_a_token() {
    let mut m = LockMachine::new();
    assert_eq!(admit_at(&mut m, T0, "never", 0, P1), AdmitOutcome::Unknown);
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(
        admit_at(&mut m, T0 + 1, "a", 0, P1),
        AdmitOutcome::Stale { highest: 1 }
    );
    assert!(grants(&m, "a").is_empty());
}

/// A token that was not issued for resource R is refused, such as another resource's token.
/// Which code it gets depends only on its value relative to R's own last token — above it,
/// `Unknown`; below it, `Stale` (it is below R's highest, which is just as fatal). It is never
/// admitted either way.
#[test]
fn another_resources_token_is_never_admitted() {
    let mut m = LockMachine::new();
    let a = granted(run(&mut m, T0, try_once("a", "ra", 1))).fencing_token; // 1
    let b = granted(run(&mut m, T0, try_once("b", "rb", 2))).fencing_token; // 2
    assert_eq!((a, b), (1, 2));
    // b's token on a: larger than anything issued for a.
    assert_eq!(admit_at(&mut m, T0 + 1, "a", b, P1), AdmitOutcome::Unknown);
    // a's token on b: smaller than b's current token.
    assert_eq!(
        admit_at(&mut m, T0 + 1, "b", a, P1),
        AdmitOutcome::Stale { highest: b }
    );
    assert!(grants(&m, "a").is_empty() && grants(&m, "b").is_empty());
}

/// The zombie: once a newer token was issued, the old one is `Stale` and the answer names the
/// newer one.
#[test]
fn an_older_token_is_stale_and_names_the_highest() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, acquire_with("a", "A", 1, 3_000, 0)));
    assert!(matches!(
        admit_at(&mut m, T0, "a", 1, P1),
        AdmitOutcome::Admitted { .. }
    ));
    // A pauses past its lease; B takes the lock.
    let b = granted(run(&mut m, T0 + 3_000, try_once("a", "B", 2)));
    assert_eq!(b.fencing_token, 2);
    assert_eq!(
        admit_at(&mut m, T0 + 3_001, "a", 1, P1),
        AdmitOutcome::Stale { highest: 2 }
    );
    assert_eq!(
        admit_at(&mut m, T0 + 3_001, "a", 2, P2),
        AdmitOutcome::Admitted { grant_ms: GRANT }
    );
    assert_eq!(m.resource("a").map(|r| r.admitted), Some(2));
}

/// Stricter than classic fencing (docs/fencing.md): the resource's latest token whose lease
/// has ended — by release or by expiry, even before any command expired it — is `Ended`, not
/// admitted.
#[test]
fn the_latest_token_of_an_ended_lease_is_ended() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(
        run(&mut m, T0 + 10, release("a", 1)),
        Response::Released(true)
    );
    assert_eq!(admit_at(&mut m, T0 + 20, "a", 1, P1), AdmitOutcome::Ended);

    granted(run(&mut m, T0 + 30, acquire_with("b", "r2", 2, 1_000, 0)));
    // Exactly at its expiry, with no tick in between: the admission itself settles it.
    let (resp, fx) = m.apply(&at(T0 + 1_030, admit("b", 2, P1)), 1);
    assert_eq!(resp, Response::Admit(AdmitOutcome::Ended));
    assert_eq!(
        fx,
        vec![Effect::Expired {
            resource: "b".into(),
            fencing_token: 2
        }]
    );
    assert!(grants(&m, "a").is_empty() && grants(&m, "b").is_empty());
}

/// Epoch barrier: a grant never outlives the lease, so an expiring lease never delays the next
/// holder.
#[test]
fn a_grant_is_capped_at_the_lease_expiry() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, acquire_with("a", "r1", 1, 1_500, 0)));
    assert_eq!(
        admit_at(&mut m, T0 + 500, "a", 1, P1),
        AdmitOutcome::Admitted { grant_ms: 1_000 }
    );
    assert_eq!(grants(&m, "a")[0].until_ms, T0 + 1_500);
    // A renewal extends the lease (to T0 + 2100); the next admission is capped at the new
    // expiry, and the proxy's grant is extended to it.
    run(&mut m, T0 + 600, renew("a", 1));
    assert_eq!(
        admit_at(&mut m, T0 + 700, "a", 1, P1),
        AdmitOutcome::Admitted { grant_ms: 1_400 }
    );
    assert_eq!(grants(&m, "a").len(), 1);
    assert_eq!(grants(&m, "a")[0].until_ms, T0 + 2_100);
}

// ---- garbage collection ---------------------------------------------------------------------

/// Stale tokens stay stale after garbage collection: when an idle record is dropped, its
/// tokens stay `Stale` through the global `gc_floor`, and a token above the floor is still
/// `Unknown`.
#[test]
fn dropped_idle_records_keep_old_tokens_stale_via_the_gc_floor() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1);
    run(&mut m, T0 + 10, release("a", 1)); // deferred until T0 + 2000
                                           // The record cannot be dropped while deferred; it becomes idle when the deferral ends.
    run(&mut m, T0 + GRANT, tick());
    let idle_until = m
        .resource("a")
        .and_then(|r| r.idle_until_ms)
        .expect("idle after the deferral");
    assert_eq!(idle_until, T0 + GRANT + DEFAULT_IDLE_RETAIN_MS);
    run(&mut m, idle_until, tick());
    assert!(m.resource("a").is_none(), "idle record dropped");

    assert_eq!(
        admit_at(&mut m, idle_until + 1, "a", 1, P1),
        AdmitOutcome::Stale { highest: 1 }
    );
    assert_eq!(
        admit_at(&mut m, idle_until + 1, "a", 2, P1),
        AdmitOutcome::Unknown
    );
    // The next lease on the resource still gets a larger token: tokens only grow.
    let g = granted(run(&mut m, idle_until + 2, try_once("a", "B", 2)));
    assert_eq!(g.fencing_token, 2);
    assert_eq!(
        admit_at(&mut m, idle_until + 3, "a", 1, P1),
        AdmitOutcome::Stale { highest: 2 }
    );
}
