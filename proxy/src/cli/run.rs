//! `fencegate lock run RESOURCE -- CMD ARGS…`: a command that only runs while its lease is
//! provably held.
//!
//! The lease guard renews in the background and turns invalid at its local deadline at the
//! latest, which is before the server can grant the lock to anyone else. The moment it does,
//! the command is asked to stop (SIGTERM) and killed after a grace period. A command that
//! writes through the fencing proxy with `FENCE_TOKEN` is safe even if it outlives the lease a
//! little; stopping it bounds how much work runs unfenced for everything else.

use std::ffi::OsString;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use lock_core::client::{new_request_id, AcquireOptions, LostReason};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::error::exit;
use super::{parse_duration, CliError, ClientArgs};

#[derive(clap::Args)]
#[command(after_help = "\
The command gets FENCE_TOKEN (the fencing token) and FENCE_RESOURCE in its environment; send
the token with every write the lock protects (header Fence-Token through the fencing proxy).
The lease id is not passed on: only this process renews and releases it.

When the lease is lost (renewals failed until the local deadline, the process was paused, or
the server reports it gone), the command gets SIGTERM, then SIGKILL after --kill-grace, and
fencegate exits with code 4. Ctrl-C, SIGTERM or SIGHUP to fencegate is passed on as SIGTERM and
the lock is released once the command has exited. If fencegate is killed (SIGKILL), the
command is killed with it. Interrupted while still waiting for the lock,
fencegate cancels the wait and exits 1 without running the command. Only the command's own
process is signalled: in a shell wrapper, `exec` the real program.

Exit code: the command's own (128+N if signal N ended it); 3 if the lock is held (after
--wait); 4 if the lease was lost while the command ran; 5 if the cluster is unavailable;
126/127 if the command cannot be started.

Examples:
  fencegate lock run kv:report -- ./make-report.sh --daily
  fencegate lock run kv:report --ttl 10s --wait 1m -- sh -c 'echo token $FENCE_TOKEN'
  FENCEGATE_ENDPOINTS=10.0.1.10:7001,10.0.2.10:7001 fencegate lock run jobs:nightly -- backup")]
pub struct RunArgs {
    /// Resource to lock: 1-256 bytes of letters, digits and . _ : / -
    resource: String,
    /// Lease length, e.g. 30s; it is renewed every third of it while the command runs
    /// [default: the cluster's policy default, 30s unless configured].
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// Wait in the resource's FIFO queue up to this long if the lock is held; 0s fails at once
    /// with exit code 3.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    wait: Duration,
    /// Name shown to others in `lock status` and the admin UI [default: the command's name and
    /// fencegate's pid].
    #[arg(long)]
    holder: Option<String>,
    /// After SIGTERM, how long the command may take to exit before it is killed.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    kill_grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

enum Outcome {
    Exited(std::io::Result<ExitStatus>),
    Lost(LostReason),
    Interrupted,
}

pub async fn run(client_args: &ClientArgs, args: RunArgs) -> Result<ExitCode, CliError> {
    let Some((program, rest)) = args.command.split_first() else {
        return Err(CliError::usage("give the command to run after --"));
    };
    let client = client_args.client()?;
    let holder = args.holder.clone().unwrap_or_else(|| {
        format!(
            "{} (fencegate pid {})",
            program.to_string_lossy(),
            std::process::id()
        )
    });
    let mut opts = AcquireOptions::default()
        .wait_timeout(args.wait)
        .holder(holder);
    opts.ttl = args.ttl;
    // Our own request id, so an acquire interrupted by Ctrl-C can be cancelled by id below.
    let request_id = new_request_id();
    opts.request_id = Some(request_id.clone());
    let stop_requested = crate::signal::shutdown_signal_now()
        .map_err(|e| CliError::internal(format!("cannot install signal handlers: {e}")))?;
    tokio::pin!(stop_requested);
    let guard = tokio::select! {
        acquired = client.acquire(&args.resource, opts) => acquired?,
        _ = &mut stop_requested => {
            // Withdraws a queued wait, or releases a grant that arrived meanwhile; waiting
            // for the answer matters, as the process ends right after.
            let cancel = client.cancel(&args.resource, &request_id);
            let _ = tokio::time::timeout(Duration::from_secs(2), cancel).await;
            return Err(CliError::new(
                exit::FAILURE,
                "interrupted",
                format!(
                    "interrupted while acquiring '{}'; the command did not run",
                    args.resource
                ),
            ));
        }
    };
    tracing::debug!(
        resource = %args.resource,
        token = guard.token(),
        "lock acquired; starting the command"
    );

    let mut command = Command::new(program);
    command
        .args(rest)
        .env("FENCE_TOKEN", guard.token().to_string())
        .env("FENCE_RESOURCE", guard.resource())
        // A backstop: if fencegate itself fails, the command must not run on unlocked.
        .kill_on_drop(true);
    die_with_this_process(&mut command);
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_RUN
            };
            return Err(CliError::new(
                code,
                "cannot_run",
                format!("cannot start {}: {e}", program.to_string_lossy()),
            ));
        }
    };

    let outcome = tokio::select! {
        status = child.wait() => Outcome::Exited(status),
        reason = guard.lost() => Outcome::Lost(reason),
        _ = &mut stop_requested => Outcome::Interrupted,
    };
    match outcome {
        Outcome::Lost(reason) => {
            let status = stop(&mut child, args.kill_grace).await;
            // Ends the lease if the server still has it (the guard lost it only locally),
            // so the next holder does not wait out the TTL; idempotent otherwise.
            let _ = tokio::time::timeout(Duration::from_secs(2), guard.release()).await;
            Err(CliError::new(
                exit::LOST,
                "lease_lost",
                format!(
                    "the lease on '{}' was lost ({reason}); the command was stopped ({})",
                    args.resource,
                    describe(&status)
                ),
            ))
        }
        Outcome::Interrupted => {
            let status = stop(&mut child, args.kill_grace).await;
            release(guard).await;
            Ok(exit_code(&status))
        }
        Outcome::Exited(status) => {
            // The command may have finished while the lease was already gone (e.g. this
            // process was paused): its last steps ran without the lock, and the caller must
            // know. `is_valid` reads the clock: right even if the renewal task has not run since.
            let reason =
                (!guard.is_valid()).then(|| guard.lost_reason().unwrap_or(LostReason::Unconfirmed));
            release(guard).await;
            match reason {
                Some(reason) => Err(CliError::new(
                    exit::LOST,
                    "lease_lost",
                    format!(
                        "the command finished ({}), but the lease on '{}' was lost before it \
                         did ({reason})",
                        describe(&status),
                        args.resource
                    ),
                )),
                None => Ok(exit_code(&status)),
            }
        }
    }
}

/// Has the kernel SIGKILL the command if fencegate dies without a chance to stop it (SIGKILL,
/// the OOM killer, a crash): nothing would renew the lease or stop the command at its deadline,
/// so it must not run on. SIGKILL, not SIGTERM, as nobody is left to escalate.
///
/// The kernel sends the parent-death signal when the *thread* that forked the child ends. This
/// runs in `main`'s own future (`lock` is awaited there, never spawned as a task), so the fork
/// happens on the main thread, which lives as long as the process.
fn die_with_this_process(command: &mut Command) {
    debug_assert_eq!(
        std::thread::current().name(),
        Some("main"),
        "the command must be forked by the main thread"
    );
    #[cfg(target_os = "linux")]
    {
        let fencegate = nix::unistd::getpid();
        // SAFETY: the hook runs in the forked child before exec and makes only
        // async-signal-safe system calls (prctl, getppid); it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // fencegate may have died between the fork and the prctl.
                if nix::unistd::getppid() != fencegate {
                    return Err(nix::errno::Errno::ESRCH.into());
                }
                Ok(())
            });
        }
    }
}

async fn release(guard: lock_core::client::LeaseGuard) {
    let resource = guard.resource().to_string();
    if let Err(e) = guard.release().await {
        eprintln!("warning: could not release '{resource}' ({e}); it expires after its TTL");
    }
}

/// SIGTERM, then SIGKILL after `grace`.
async fn stop(child: &mut Child, grace: Duration) -> std::io::Result<ExitStatus> {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // Fails only if the child already exited; `wait` below collects it either way.
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::warn!(?grace, "the command did not exit after SIGTERM; killing it");
            child.kill().await?;
            child.wait().await
        }
    }
}

/// The command's exit code as a shell reports it: its own code, or 128+N for signal N.
fn exit_code(status: &std::io::Result<ExitStatus>) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(exit::FAILURE)),
            (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(exit::FAILURE)),
            (None, None) => ExitCode::from(exit::FAILURE),
        },
        Err(_) => ExitCode::from(exit::FAILURE),
    }
}

fn describe(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("its status is unknown: {e}"),
    }
}
