//! One way to fail: `error: <code>: <message>` on stderr and a documented exit code.

use std::process::ExitCode;

use lock_core::client;
use lock_core::wire::{ErrorBody, ErrorCode};

/// Exit codes of the client commands (`fencegate help` lists them; so does `docs/cli.md`). `lock run` exits with its command's own code when the command ran to
/// its end.
pub mod exit {
    /// Anything not covered below (a refused membership change, an internal server error).
    pub const FAILURE: u8 = 1;
    /// Bad input: a usage error, an invalid resource name, endpoint or option, a `400`.
    pub const USAGE: u8 = 2;
    /// The lock is held by another lease (also after a `--wait` ran out), or its wait queue is
    /// full.
    pub const HELD: u8 = 3;
    /// The lease is lost: a renew or release of a lease the server no longer holds, or
    /// `lock run` stopped its command because the lease could no longer be proven.
    pub const LOST: u8 = 4;
    /// No node gave a definite answer: connection refused, timeouts, no quorum, no leader.
    pub const UNAVAILABLE: u8 = 5;
    /// `lock run`: the command could not be started (not executable).
    pub const CANNOT_RUN: u8 = 126;
    /// `lock run`: the command was not found.
    pub const NOT_FOUND: u8 = 127;
}

/// What the help text says about exit codes; kept next to the codes so they cannot drift.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0    success
  1    other failure (a refused membership change; lock run interrupted while acquiring)
  2    bad input: usage, resource name, endpoint, option
  3    lock held by another lease (also when --wait ran out), or its queue is full
  4    lease lost (lock run: the command was stopped because the lease was lost)
  5    cluster unavailable: connection refused, timeout, no quorum, no leader
  126  lock run: the command could not be started
  127  lock run: the command was not found
  lock run otherwise exits with its command's exit code (128+N if a signal N ended it).";

/// A failed client command, printed as `error: <code>: <message>`.
#[derive(Debug)]
pub struct CliError {
    pub exit: u8,
    /// The server's stable error code, or a client-side one (`unavailable`, `invalid_request`).
    pub code: String,
    pub message: String,
}

impl CliError {
    pub fn new(exit: u8, code: impl Into<String>, message: impl Into<String>) -> Self {
        CliError {
            exit,
            code: code.into(),
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(exit::USAGE, ErrorCode::InvalidRequest.as_str(), message)
    }

    /// A failure inside fencegate itself (not the user's input, not the cluster).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(exit::FAILURE, "internal", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(exit::UNAVAILABLE, "unavailable", message)
    }

    /// A definite error answer of a node.
    pub fn from_body(status: u16, body: ErrorBody) -> Self {
        let exit = exit_for(status, &body.error);
        Self::new(exit, body.error.as_str(), body.message)
    }

    /// Prints the error line and returns the exit code. No backtrace: this is a user error,
    /// not a bug.
    pub fn report(&self) -> ExitCode {
        eprintln!("error: {}: {}", self.code, self.message);
        ExitCode::from(self.exit)
    }
}

fn exit_for(status: u16, code: &ErrorCode) -> u8 {
    match code {
        ErrorCode::LockHeld | ErrorCode::TooManyWaiters => exit::HELD,
        ErrorCode::LeaseLost => exit::LOST,
        // 503 and 504: no quorum, no leader, stopped node; 500 is a bug, not an outage.
        _ if status > 500 => exit::UNAVAILABLE,
        _ if matches!(status, 400 | 404 | 405 | 413) => exit::USAGE,
        _ => exit::FAILURE,
    }
}

impl From<client::Error> for CliError {
    fn from(e: client::Error) -> Self {
        use client::Error as E;
        let text = e.to_string();
        match e {
            E::NoNodes => CliError::usage(text),
            E::Invalid(why) => CliError::usage(why),
            E::LockHeld { .. } => CliError::new(exit::HELD, "lock_held", text),
            E::TooManyWaiters { .. } => CliError::new(exit::HELD, "too_many_waiters", text),
            E::LeaseLost { .. } | E::LeaseInvalid(_) => {
                CliError::new(exit::LOST, "lease_lost", text)
            }
            E::Timeout { .. } => CliError::unavailable(text),
            E::Api {
                status,
                code,
                message,
            } => CliError::new(exit_for(status, &ErrorCode::parse(&code)), code, message),
            _ => CliError::new(exit::FAILURE, "error", text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_has_its_own_exit_code() {
        assert_eq!(exit_for(409, &ErrorCode::LockHeld), exit::HELD);
        assert_eq!(exit_for(429, &ErrorCode::TooManyWaiters), exit::HELD);
        assert_eq!(exit_for(409, &ErrorCode::LeaseLost), exit::LOST);
        assert_eq!(exit_for(503, &ErrorCode::NoQuorum), exit::UNAVAILABLE);
        assert_eq!(exit_for(400, &ErrorCode::InvalidRequest), exit::USAGE);
        assert_eq!(
            exit_for(409, &ErrorCode::MembershipChangeFailed),
            exit::FAILURE
        );
        assert_eq!(exit_for(500, &ErrorCode::Internal), exit::FAILURE);
    }

    #[test]
    fn a_zero_hint_does_not_suggest_retrying_after_zero() {
        let e: CliError = client::Error::LockHeld {
            resource: "r".into(),
            retry_after: std::time::Duration::ZERO,
        }
        .into();
        assert_eq!(e.exit, exit::HELD);
        assert!(!e.message.contains("0ns"), "{}", e.message);
    }
}
