//! Log set-up: `--log-level`, `--log-format text|json`, `RUST_LOG`, colours only on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

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
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        // Escape codes only where a terminal interprets them, never into files or journald.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
