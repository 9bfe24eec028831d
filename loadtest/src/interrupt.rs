//! Ending a command early: SIGINT (Ctrl-C), SIGTERM, or a panic in any of the harness's tasks.
//!
//! `main` races the command against [`wait`]. When one of these arrives, the command's future
//! is dropped where it stands, and then the runtime with every task still running. What a
//! command starts is owned by values whose `Drop` undoes it: a `LocalCluster` continues its
//! paused nodes and stops its nodes and demo store, then its temp dir goes; an `EtcdCluster`
//! runs `etcd.sh stop`; the chaos history flushes its last whole line. So an interrupted run
//! leaves no process and no temp dir behind, and exits with 130 (SIGINT), 143 (SIGTERM) or
//! 101 (a panic).
//!
//! A panicking task used to die alone while the run waited for it (a workload whose arrival
//! loop panicked ran on without arrivals until `--max-total-s`); a panic is a bug in the
//! harness, so it ends the run. A second signal during the clean-up exits at once: the
//! cluster's processes then die with the harness (`PR_SET_PDEATHSIG`, see
//! `cluster::process::spawn_tied`), but temp dirs stay.

use std::fmt;
use std::sync::OnceLock;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Why a command was ended early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    Signal(Sig),
    /// A task panicked, with the panic's message and place.
    Panic(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sig {
    Int,
    Term,
}

impl Reason {
    /// The conventional exit status: 128 + the signal's number, 101 for a panic (as Rust's
    /// own).
    pub fn exit_code(&self) -> u8 {
        match self {
            Reason::Signal(Sig::Int) => 130,
            Reason::Signal(Sig::Term) => 143,
            Reason::Panic(_) => 101,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Signal(Sig::Int) => f.write_str("interrupted (SIGINT)"),
            Reason::Signal(Sig::Term) => f.write_str("terminated (SIGTERM)"),
            Reason::Panic(msg) => write!(f, "a harness task panicked: {msg}"),
        }
    }
}

/// The first reason to stop, once there is one.
fn slot() -> &'static watch::Sender<Option<Reason>> {
    static SLOT: OnceLock<watch::Sender<Option<Reason>>> = OnceLock::new();
    SLOT.get_or_init(|| watch::channel(None).0)
}

/// Records `why`, unless an earlier reason is already recorded.
fn stop(why: Reason) {
    slot().send_if_modified(|cur| {
        if cur.is_some() {
            return false;
        }
        *cur = Some(why);
        true
    });
}

/// Installs the panic hook and the SIGINT / SIGTERM handlers. Call once, inside the runtime,
/// before the command starts.
pub fn install() -> anyhow::Result<()> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // The default hook prints the message and place (and a backtrace if asked for).
        previous(info);
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let place = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        stop(Reason::Panic(format!("{msg}{place}")));
    }));
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        let first = tokio::select! {
            _ = int.recv() => Sig::Int,
            _ = term.recv() => Sig::Term,
        };
        stop(Reason::Signal(first));
        // A second signal ends the process at once, whatever the clean-up is doing: the
        // default action, which needs no task of the runtime that is being shut down.
        // SAFETY: resetting a signal's disposition to the default has no preconditions.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
        }
    });
    Ok(())
}

/// Waits until the command must stop; returns why.
pub async fn wait() -> Reason {
    let mut rx = slot().subscribe();
    loop {
        if let Some(why) = rx.borrow_and_update().clone() {
            return why;
        }
        if rx.changed().await.is_err() {
            // The sender lives in a static: it is never dropped.
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(Reason::Signal(Sig::Int).exit_code(), 130);
        assert_eq!(Reason::Signal(Sig::Term).exit_code(), 143);
        assert_eq!(Reason::Panic("x".into()).exit_code(), 101);
    }

    #[tokio::test]
    async fn the_first_reason_stands() {
        stop(Reason::Signal(Sig::Term));
        stop(Reason::Panic("later".into()));
        assert_eq!(wait().await, Reason::Signal(Sig::Term));
    }
}
