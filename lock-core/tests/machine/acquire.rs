//! Acquire on a free or held resource.

use lock_core::machine::{Grant, LockMachine, Response};

use crate::support::{at, granted, holder_of, lease, run, try_once, waiting, T0, TTL};

/// A free resource is granted at once with the requested TTL, and fencing tokens come from one
/// global counter across resources.
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

/// A try-once acquire on a held resource is refused (`lock_held`) with `retry_after_ms` set to
/// the holder's remaining time, and neither queues nor issues a token.
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
