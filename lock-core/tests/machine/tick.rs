//! The sweeper's Tick: bounded work per log entry.

use lock_core::machine::{Command, LockMachine, Response};

use crate::support::{at, granted, run, try_once, T0, TTL};

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
