//! The client's one error type, and why a guard stopped being valid.

use std::fmt;
use std::time::Duration;

/// Everything the client can fail with. Codes the server sends are mapped onto variants where
/// callers must branch (`LockHeld`, `LeaseLost`, `TooManyWaiters`); the rest keep the server's
/// code and sentence in [`Error::Api`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `Client::new` was given no node URLs.
    #[error("no nodes given: pass at least one node base URL such as http://127.0.0.1:7001")]
    NoNodes,
    /// A node URL, a resource name or an option is unusable; nothing was sent.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Another lease holds the lock (and the caller did not wait, or the wait ran out).
    #[error("{}", lock_held_message(resource, *retry_after))]
    LockHeld {
        resource: String,
        /// The server's hint for when to try again: the current lease's remaining time on the
        /// server, also after a wait ran out. Zero when the server has no estimate (e.g. the
        /// lease is ending right now).
        retry_after: Duration,
    },
    /// The server says this lease no longer exists (expired, released or replaced).
    #[error("lease on '{resource}' is lost (expired, released or replaced); stop work and acquire again")]
    LeaseLost { resource: String },
    /// The resource's (or the cluster's) wait queue is full.
    #[error("too many waiters for '{resource}'; retry later")]
    TooManyWaiters { resource: String },
    /// No node gave a definite answer before the deadline (timeouts, connection errors,
    /// `503 no_quorum`). The outcome may be unknown; a pending acquire is cancelled.
    #[error(
        "no definite answer within {elapsed:?} after {attempts} attempt(s); last problem: {last}"
    )]
    Timeout {
        elapsed: Duration,
        attempts: u32,
        last: String,
    },
    /// The guard is no longer valid, so the client refused to send a fenced write.
    #[error("lease guard is no longer valid ({0}); stop work")]
    LeaseInvalid(LostReason),
    /// Any other answer of the server: its status, stable code and sentence.
    #[error("server answered {status} {code}: {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// An HTTP error outside the lock protocol (e.g. building or sending a fenced write).
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
}

/// A zero hint means the server has no estimate: "retry after 0 ms" would say nothing useful.
fn lock_held_message(resource: &str, retry_after: Duration) -> String {
    if retry_after.is_zero() {
        format!("lock '{resource}' is held by another lease")
    } else {
        format!(
            "lock '{resource}' is held by another lease; retry after {} ms or acquire with a \
             wait_timeout",
            retry_after.as_millis()
        )
    }
}

/// Why a [`LeaseGuard`](super::LeaseGuard) turned invalid. Invalidity is final: a guard never
/// becomes valid again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The server answered `lease_lost`: the lease expired, was released or replaced.
    LeaseLost,
    /// No renewal succeeded before the local deadline, so the lease can no longer be proven
    /// (the server may already have expired it). Typical causes: partition, no quorum, a
    /// stalled process.
    Unconfirmed,
    /// The guard was released (explicitly or by being dropped) or detached.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::LeaseLost => "the server reported the lease lost",
            LostReason::Unconfirmed => "the lease could not be renewed before its local deadline",
            LostReason::Released => "the lease was released",
        })
    }
}

/// An error with its causes, `a: b: c`. reqwest's own message ("error sending request for
/// url …") leaves out the part a user can act on ("Connection refused"), which is in the
/// source chain.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        // Some layers repeat their cause's message; print each once.
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
