//! The v1 API on a real 3-node cluster: every call, on the leader and on followers.
//!
//! Where a test has to wait for something (an expiry, a waiter joining a queue) it polls the
//! linearizable `GET /v1/locks/{resource}` for the event instead of sleeping a fixed time.

pub(crate) mod support;

mod acquire;
mod bad_input;
mod browsers;
mod cancel;
mod fuzz;
mod membership;
mod overload;
mod reads;
mod release;
mod renew;
mod retry;
mod status;
mod wait;
