//! An operator's forced release (`ForceRelease`) has exactly the consequences of a release by
//! the holder: the same effects (hand-off, revocation of proxy grants), the same state, and the
//! same answers to every later command — checked by driving two machines side by side, one
//! released by the holder and one forced, and comparing them after every step.

use lock_core::machine::{AdmitOutcome, Command, LockMachine, Response};

use crate::support::{
    acquire_with, admit, at, granted, handed_off, release, renew, run, tick, try_once, GRANT, P1,
    P2, T0, TTL,
};

fn force_release(resource: &str) -> Command {
    Command::ForceRelease {
        resource: resource.to_string(),
        operator: "alice".to_string(),
    }
}

fn ack(resource: &str, token: u64, proxy: u64) -> Command {
    Command::RevokeAck {
        resource: resource.into(),
        fencing_token: token,
        proxy,
    }
}

/// Applies `cmd` to both machines and asserts the same response, effects and state.
#[track_caller]
fn both(held: &mut LockMachine, forced: &mut LockMachine, now_ms: u64, cmd: Command) -> Response {
    let (a, fa) = held.apply(&at(now_ms, cmd.clone()), 1);
    let (b, fb) = forced.apply(&at(now_ms, cmd.clone()), 1);
    assert_eq!((&a, &fa), (&b, &fb), "{cmd:?}");
    assert_eq!(held.image(), forced.image(), "after {cmd:?}");
    a
}

/// With a live proxy grant and a waiter: the ended token is refused, the old holder can neither
/// renew nor release, the proxy is told to stop, and the waiter gets a newer token only once the
/// grant is confirmed stopped or has run out — identically for a forced and a holder's release.
#[test]
fn forced_release_fences_exactly_like_the_holders_release() {
    for confirm in [false, true] {
        let mut held = LockMachine::new();
        let setup = [
            (T0, try_once("a", "A", 1)),
            (T0 + 100, admit("a", 1, P1)),
            (T0 + 150, acquire_with("a", "B", 2, TTL, 10_000)),
        ];
        for (t, cmd) in setup {
            held.apply(&at(t, cmd), 1);
        }
        let mut forced = LockMachine::from_image(held.image());

        let (r1, f1) = held.apply(&at(T0 + 200, release("a", 1)), 1);
        let (r2, f2) = forced.apply(&at(T0 + 200, force_release("a")), 1);
        assert_eq!(r1, Response::Released(true));
        assert_eq!(
            r2,
            Response::ForceReleased {
                fencing_token: Some(1)
            }
        );
        assert_eq!(f1, f2, "the same effects (revocation, hand-off)");
        assert_eq!(held.image(), forced.image(), "the same state");
        assert_eq!(forced.lease("a"), None);

        let admitted = both(&mut held, &mut forced, T0 + 250, admit("a", 1, P2));
        assert_eq!(admitted, Response::Admit(AdmitOutcome::Ended));
        assert_eq!(
            both(&mut held, &mut forced, T0 + 260, renew("a", 1)),
            Response::LeaseLost
        );
        assert_eq!(
            both(&mut held, &mut forced, T0 + 270, release("a", 1)),
            Response::Released(false)
        );
        assert_eq!(forced.last_token(), 1, "no new token while the grant lives");

        if confirm {
            both(&mut held, &mut forced, T0 + 300, ack("a", 1, P1));
        } else {
            both(&mut held, &mut forced, T0 + 100 + GRANT, tick());
        }
        let b = forced.lease("a").expect("B holds the lock");
        assert_eq!(b.fencing_token, 2);
        assert_eq!(
            both(
                &mut held,
                &mut forced,
                T0 + 100 + GRANT + 1,
                admit("a", 1, P1)
            ),
            Response::Admit(AdmitOutcome::Stale { highest: 2 })
        );
        forced.check_indexes().expect("indexes");
    }
}

/// Without proxy grants the head waiter gets the lock, with a newer token, in the same command;
/// forcing a free resource changes nothing and says so.
#[test]
fn forced_release_hands_off_at_once_and_is_a_noop_on_a_free_resource() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    run(&mut m, T0 + 10, acquire_with("a", "B", 2, TTL, 10_000));
    let (resp, fx) = m.apply(&at(T0 + 20, force_release("a")), 1);
    assert_eq!(
        resp,
        Response::ForceReleased {
            fencing_token: Some(1)
        }
    );
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);

    let mut idle = LockMachine::new();
    let before = idle.image();
    assert_eq!(
        run(&mut idle, T0, force_release("nothing")),
        Response::ForceReleased {
            fencing_token: None
        }
    );
    assert_eq!(
        idle.image().resources,
        before.resources,
        "no record is created"
    );
    assert_eq!(idle.last_token(), 0);
}
