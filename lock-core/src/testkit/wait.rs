//! The two helpers every integration test uses: a log line per phase, and a poll for an event.

use std::time::{Duration, Instant};

/// Logs a test phase, so a failing test's output reads as a story.
pub fn phase(msg: &str) {
    eprintln!("---- {msg}");
}

/// Polls `check` every 50 ms until it returns true; panics naming `what` after `timeout`.
/// Use instead of a sleep wherever the awaited event can be observed.
pub async fn eventually(timeout: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "not within {timeout:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
