//! Idempotent retries: the same request id returns the original result and never a second
//! lease or waiter.

use lock_core::machine::{dedup_key, LockMachine, Response};

use crate::support::{
    cancel, granted, lease, release, renew, run, tick, try_once, wait, waiting, RETAIN, T0, TTL,
};

/// A retry with the same request id returns the original lease and token — while held, after
/// release and after expiry — and never grants a second lease.
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

    // After release: the original lease and token, and the resource stays free. Its expiry
    // is no later than the retry: the lease is not held any more.
    run(&mut m, T0 + 2_000, release("a", 1));
    let again = granted(run(&mut m, T0 + 2_001, try_once("a", "r1", 9)));
    assert_eq!(
        (again.lease_id, again.fencing_token, again.expires_at_ms),
        (lease(1), 1, T0 + 2_001)
    );
    assert_eq!(m.lease("a"), None);
    assert_eq!(m.last_token(), 1);

    // After expiry (of a second lease from another request): still the original.
    granted(run(&mut m, T0 + 3_000, try_once("a", "r2", 2)));
    let again = granted(run(&mut m, T0 + 3_000 + TTL + 1, try_once("a", "r1", 10)));
    assert_eq!((again.lease_id, again.fencing_token), (lease(1), 1));
    assert_eq!(m.lease("a"), None, "expired, and the retry granted nothing");
    assert_eq!(m.last_token(), 2);
}

/// A retry of a queued acquire returns Queued at its current position and adds no second
/// waiter; once handed off, the retry returns the hand-off grant.
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

/// Dedup results are kept for the retry window (`retain_ms`), then swept; a request id reused
/// after that is a new acquire.
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

/// Records are keyed by a digest of (resource, request id): the same request id on another
/// resource is another acquire, and a snapshot image written by an earlier version (records
/// stored by the two strings) restores into records a retry still finds.
#[test]
fn records_are_per_resource_and_survive_an_image_of_the_earlier_layout() {
    let mut m = LockMachine::new();
    let a = granted(run(&mut m, T0, try_once("a", "r1", 1)));
    let b = granted(run(&mut m, T0 + 1, try_once("b", "r1", 2)));
    assert_eq!((a.fencing_token, b.fencing_token), (1, 2));
    // "ab" + "c" and "a" + "bc" must not name the same record.
    assert_ne!(dedup_key("ab", "c"), dedup_key("a", "bc"));
    granted(run(&mut m, T0 + 2, try_once("ab", "c", 3)));
    granted(run(&mut m, T0 + 3, try_once("x", "bc", 4)));

    let mut image = m.image();
    assert_eq!(image.dedup_records.len(), 4);
    let by_key: std::collections::HashMap<_, _> = image
        .dedup_records
        .drain(..)
        .map(|e| e.into_record())
        .collect();
    for (resource, request_id) in [("a", "r1"), ("b", "r1"), ("ab", "c"), ("x", "bc")] {
        let rec = by_key[&dedup_key(resource, request_id)].clone();
        image
            .dedup
            .push((resource.to_string(), request_id.to_string(), rec));
    }
    let mut restored = LockMachine::from_image(image);
    restored.check_indexes().expect("indexes");
    assert_eq!(
        restored.image(),
        m.image(),
        "the same state in the current layout"
    );
    let again = granted(run(&mut restored, T0 + 10, try_once("b", "r1", 9)));
    assert_eq!((again.lease_id, again.fencing_token), (lease(2), 2));
}
