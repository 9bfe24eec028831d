//! Log set-up: `--log-level`, `--log-format text|json`, `RUST_LOG`, colours only on a terminal.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log level of fencegate's own messages [default: info
    /// for `dev`, `node` and `demo-store`; warn for the client commands]. Overrides RUST_LOG.
    #[arg(
        long,
        global = true,
        value_name = "LEVEL",
        value_parser = ["error", "warn", "info", "debug", "trace"]
    )]
    pub log_level: Option<String>,
    /// Log line format on stderr: `text` for people, `json` (one object per line) for log
    /// collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Libraries that are chatty at info (openraft logs every replication step, fjall every
/// flush) stay at warn/error unless RUST_LOG names them; the audit trail is opt-in.
const QUIET_DEPENDENCIES: &str = "openraft=error,lsm_tree=warn,fjall=warn,fencegate::audit=warn";

/// openraft logs one info line per 64 log entries it re-applies at start-up: thousands of
/// lines on a restart. Kept at warn even under `RUST_LOG=info` unless RUST_LOG names the
/// module itself.
const REAPPLY_MODULE: &str = "openraft::storage::helper";

/// The filter: `--log-level` if given, else `RUST_LOG` if set, else `default_level`; noisy
/// dependencies are quieted unless RUST_LOG mentions them.
pub fn filter(
    level: Option<&str>,
    rust_log: Option<&str>,
    default_level: &str,
) -> Result<EnvFilter, String> {
    let directives = match (level, rust_log.filter(|s| !s.trim().is_empty())) {
        (Some(level), _) => format!("{level},{QUIET_DEPENDENCIES}"),
        (None, Some(env)) if env.contains(REAPPLY_MODULE) => env.to_string(),
        (None, Some(env)) => format!("{env},{REAPPLY_MODULE}=warn"),
        (None, None) => format!("{default_level},{QUIET_DEPENDENCIES}"),
    };
    EnvFilter::try_new(&directives).map_err(|e| format!("invalid log filter '{directives}': {e}"))
}

pub fn init(args: &LogArgs, default_level: &str) -> Result<(), String> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = filter(
        args.log_level.as_deref(),
        rust_log.as_deref(),
        default_level,
    )?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let repeats = RaftRepeats::default();
    match args.log_format {
        LogFormat::Json => builder.json().finish().with(repeats).init(),
        // Escape codes only where a terminal interprets them, never into files or journald.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(repeats)
            .init(),
    }
    Ok(())
}

/// How often one openraft warning or error line may be logged.
const RAFT_REPEAT_EVERY: Duration = Duration::from_secs(1);

/// Lets each openraft warning or error line (each place in its code) through at most once per
/// [`RAFT_REPEAT_EVERY`]. While a member is down, openraft logs an error per linearizable read
/// (it could not confirm leadership with that member) and per retry of the member: hundreds
/// of identical lines a second under load, which buried everything else.
#[derive(Default)]
struct RaftRepeats {
    last: Mutex<HashMap<Identifier, Instant>>,
}

impl RaftRepeats {
    fn limits(meta: &Metadata<'_>) -> bool {
        meta.is_event() && *meta.level() <= Level::WARN && meta.target().starts_with("openraft")
    }
}

impl<S: Subscriber> Layer<S> for RaftRepeats {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // Only these lines are judged each time; every other line is left to the level filter.
        if Self::limits(meta) {
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        if !Self::limits(meta) {
            return true;
        }
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match last.get(&meta.callsite()) {
            Some(at) if now.duration_since(*at) < RAFT_REPEAT_EVERY => false,
            _ => {
                last.insert(meta.callsite(), now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same openraft error line is let through once a second; other lines always.
    #[test]
    fn an_openraft_error_repeats_at_most_once_a_second() {
        let lines = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = lines.clone();
        let counter = tracing_subscriber::fmt::layer()
            .with_writer(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::io::sink()
            })
            .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
        let subscriber = tracing_subscriber::registry()
            .with(counter)
            .with(RaftRepeats::default());
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..100 {
                tracing::error!(target: "openraft::core", "timeout while confirming leadership");
                tracing::warn!(target: "fencegate", "our own warning");
            }
        });
        assert_eq!(lines.load(std::sync::atomic::Ordering::SeqCst), 1 + 100);
    }

    #[test]
    fn the_reapply_flood_stays_quiet_under_rust_log_info() {
        let f = filter(None, Some("info"), "info").unwrap().to_string();
        assert!(f.contains("openraft::storage::helper=warn"), "{f}");
        let f = filter(None, Some("openraft::storage::helper=info"), "info")
            .unwrap()
            .to_string();
        assert!(!f.contains("helper=warn"), "{f}");
    }

    #[test]
    fn log_level_wins_over_rust_log() {
        let f = filter(Some("debug"), Some("trace"), "info")
            .unwrap()
            .to_string();
        assert!(f.contains("debug") && !f.contains("trace"), "{f}");
        assert!(filter(None, Some("=="), "info").is_err());
    }
}
