//! Release: a stale release never removes the new holder, and release is idempotent.

use lock_core::machine::{Effect, LockMachine, Response};

use crate::support::{at, granted, holder_of, lease, release, run, try_once, T0, TTL};

/// A stale release (the old holder's, after its lease expired and B got the lock) never
/// removes B's lock; release is idempotent.
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
