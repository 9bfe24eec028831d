//! How the binary's servers learn that it is time to stop.

use tokio::sync::watch;

/// Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// Completes once `stop` turns true (or its sender is gone). Every server takes its own
/// shutdown future; this lets one channel stop several of them, in the order the caller
/// chooses to await them.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Ctrl-C, SIGTERM or SIGHUP (the terminal went away), with the handlers installed by this call
/// rather than when the future is first polled: `lock run` starts a command right after, and a
/// signal that arrives in between must be passed on, not kill fencegate and leave the command
/// running unlocked.
#[cfg(unix)]
pub fn shutdown_signal_now() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
            _ = hangup.recv() => {}
        }
    })
}
