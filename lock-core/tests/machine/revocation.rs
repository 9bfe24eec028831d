//! Revocation: a release (not an expiry) under live proxy grants tells the proxies holding them
//! to stop (`Effect::Revoke`); when every one confirmed (`RevokeAck`), the lock passes on at
//! once instead of when the grants run out. A confirmation for another token or proxy, or a
//! late one, changes nothing.

use lock_core::machine::{AdmitOutcome, Command, Effect, LockMachine, Response};

use crate::support::{
    acquire_with, admit_at, at, granted, grants, handed_off, reissue_at, release, restore, run,
    try_once, GRANT, P1, P2, T0, TTL,
};

fn ack(resource: &str, token: u64, proxy: u64) -> Command {
    Command::RevokeAck {
        resource: resource.into(),
        fencing_token: token,
        proxy,
    }
}

fn revokes(fx: &[Effect]) -> Vec<(String, u64, Vec<u64>)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Revoke {
                resource,
                fencing_token,
                proxies,
            } => Some((resource.clone(), *fencing_token, proxies.clone())),
            _ => None,
        })
        .collect()
}

/// Token 1 held and admitted on proxies P1 and P2, a waiter B queued behind it.
fn held_with_two_grants() -> LockMachine {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    for p in [P1, P2] {
        assert!(matches!(
            admit_at(&mut m, T0 + 100, "a", 1, p),
            AdmitOutcome::Admitted { .. }
        ));
    }
    assert_eq!(
        run(&mut m, T0 + 150, acquire_with("a", "B", 2, TTL, 60_000)),
        Response::Queued { position: 1 }
    );
    m
}

#[test]
fn release_under_grants_revokes_them_and_the_last_ack_hands_the_lock_on() {
    let mut m = held_with_two_grants();

    let (resp, fx) = m.apply(&at(T0 + 200, release("a", 1)), 1);
    assert_eq!(resp, Response::Released(true));
    assert_eq!(revokes(&fx), vec![("a".to_string(), 1, vec![P1, P2])]);
    assert!(
        handed_off(&fx).is_empty(),
        "no hand-off while grants live: {fx:?}"
    );

    // The first proxy confirms: the other's grant still holds the lock.
    let (resp, fx) = m.apply(&at(T0 + 210, ack("a", 1, P1)), 1);
    assert_eq!(resp, Response::RevokeAcked(true));
    assert!(handed_off(&fx).is_empty(), "{fx:?}");
    assert_eq!(grants(&m, "a").len(), 1);
    assert!(matches!(
        run(&mut m, T0 + 215, try_once("a", "C", 3)),
        Response::Revoking { .. }
    ));

    // The last one confirms: the waiter gets token 2 in the same command, long before the
    // grants would have run out.
    let (resp, fx) = m.apply(&at(T0 + 220, ack("a", 1, P2)), 1);
    assert_eq!(resp, Response::RevokeAcked(true));
    assert!(fx.contains(&Effect::Revoked {
        resource: "a".into()
    }));
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
    const { assert!(T0 + 220 < T0 + 100 + GRANT) };
    assert_eq!(reissue_at(&m, "a"), None);
    m.check_indexes().expect("indexes");
}

#[test]
fn acks_for_another_token_or_proxy_change_nothing() {
    let mut m = held_with_two_grants();
    run(&mut m, T0 + 200, release("a", 1));

    for (token, proxy) in [(2, P1), (0, P2), (1, 7)] {
        let (resp, fx) = m.apply(&at(T0 + 210, ack("a", token, proxy)), 1);
        assert_eq!(
            resp,
            Response::RevokeAcked(false),
            "token {token} proxy {proxy}"
        );
        assert!(fx.is_empty(), "{fx:?}");
    }
    assert_eq!(grants(&m, "a").len(), 2);
    assert_eq!(m.last_token(), 1, "no token while both grants live");
    // An ack for a resource nobody knows is harmless too.
    assert_eq!(
        run(&mut m, T0 + 220, ack("never-seen", 1, P1)),
        Response::RevokeAcked(false)
    );
}

#[test]
fn an_ack_while_the_lease_is_held_does_not_free_anything() {
    let mut m = held_with_two_grants();
    // A confirmation that arrives before any release (a stale message) drops that proxy's
    // grant — it will ask again — but the lease and the waiter stay as they are.
    let (resp, fx) = m.apply(&at(T0 + 200, ack("a", 1, P1)), 1);
    assert_eq!(resp, Response::RevokeAcked(true));
    assert!(fx.is_empty(), "{fx:?}");
    assert!(m.lease("a").is_some());
    assert_eq!(m.last_token(), 1);
}

#[test]
fn expiry_revokes_nothing_because_grants_end_with_the_lease() {
    let mut m = held_with_two_grants();
    let (_, fx) = m.apply(&at(T0 + TTL, crate::support::tick()), 1);
    assert!(revokes(&fx).is_empty(), "{fx:?}");
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
}

#[test]
fn a_pending_revocation_survives_a_snapshot_restore() {
    let mut m = held_with_two_grants();
    run(&mut m, T0 + 200, release("a", 1));
    run(&mut m, T0 + 210, ack("a", 1, P1));
    let mut r = restore(&m);
    assert_eq!(grants(&r, "a").len(), 1);
    let (_, fx) = r.apply(&at(T0 + 220, ack("a", 1, P2)), 1);
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
}
