//! The pure lock state machine, tested by its outputs: the response and the effects of each
//! command, with time as an input.
//!
//! One file per family of rules holds hand-picked cases, each test named after the rule it
//! checks. `histories` drives long random sequences of commands — retries, stale lease ids,
//! proxy admissions, clock jumps, leader changes with skewed clocks and snapshot restores —
//! through the `world` driver against the reference `model`, compares every response and
//! effect, and checks the invariants after every step.

mod support;

mod model;
mod world;

mod acquire;
mod admit;
mod batch;
mod epoch_barrier;
mod failover;
mod force_release;
mod histories;
mod list;
mod quota;
mod release;
mod renew;
mod retention;
mod retry;
mod revocation;
mod tick;
mod tokens;
mod waiting;
