//! Renewal: only the current lease id extends a lease, and only while it lasts.

use lock_core::machine::{Effect, Grant, LockMachine, Response};

use crate::support::{at, granted, holder_of, lease, renew, run, tick, try_once, T0, TTL};

/// A renewal extends the lease to `now + ttl`, keeping lease id and token.
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

/// Only the current lease id renews. A wrong id, and the old holder's id after its lease
/// expired and was regranted, get `lease_lost` and leave the new holder untouched.
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

/// A lease that has run out cannot be renewed, even before any command expired it; the
/// renewal itself settles it.
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
