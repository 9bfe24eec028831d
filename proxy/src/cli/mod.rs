//! The operator and scripting commands: `cluster`, `member`, `lock`, `keys`, `backup`,
//! `version`.
//!
//! Every command takes the same endpoint list (`--endpoints` or `FENCEGATE_ENDPOINTS`), prints
//! with `-o json|table`, and fails the same way: one `error: <code>: <message>` line on stderr
//! and an exit code from [`exit`].

mod api;
mod backup;
mod cluster;
mod error;
mod keys;
mod lock;
mod output;
mod run;

use std::time::Duration;

pub use backup::{backup_cmd, BackupArgs};
pub use cluster::{cluster, member, ClusterArgs, MemberArgs};
pub use error::{exit, CliError, EXIT_CODES_HELP};
pub use keys::{keys, KeysArgs};
pub use lock::{lock, LockArgs};
pub use output::{json_pretty, resolve as output_format, Format};

use lock_core::client::{Client, ClientOptions};

/// The three nodes `fencegate dev` starts.
pub const DEFAULT_ENDPOINTS: &str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003";

/// Where the cluster is and how to print: shared by every client command.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Cluster and output")]
pub struct ClientArgs {
    /// Node API endpoints, comma-separated: `host:port` or `http://host:port` (plain HTTP only). Any node
    /// serves any call; the next one is tried when a node is down.
    #[arg(
        long,
        short = 'e',
        visible_alias = "node",
        env = "FENCEGATE_ENDPOINTS",
        value_delimiter = ',',
        value_parser = parse_endpoint,
        default_value = DEFAULT_ENDPOINTS,
        value_name = "LIST",
        global = true
    )]
    pub endpoints: Vec<String>,
    /// Output format [default: table when stdout is a terminal, json otherwise].
    #[arg(long, short = 'o', value_enum, global = true)]
    pub output: Option<Format>,
    /// Admin credential, sent as `Authorization: Bearer` on cluster and membership calls.
    #[arg(
        long,
        env = "FENCEGATE_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        global = true
    )]
    pub admin_token: Option<String>,
    /// API key for a cluster that requires keys, sent as `Authorization: Bearer` on lock
    /// calls and reads (and on admin calls when no --admin-token is given).
    #[arg(
        long,
        env = "FENCEGATE_API_KEY",
        hide_env_values = true,
        value_name = "KEY",
        global = true
    )]
    pub api_key: Option<String>,
    /// How long a lock call keeps retrying when no node answers definitely (node down, no
    /// quorum) before it gives up with exit code 5. A --wait comes on top. Reads (status,
    /// list, member, cluster status) take at most this long over all endpoints, each endpoint
    /// at most 5 s of it.
    #[arg(
        long,
        value_parser = parse_duration,
        default_value = "10s",
        value_name = "DURATION",
        global = true
    )]
    pub timeout: Duration,
}

impl ClientArgs {
    pub fn format(&self) -> Format {
        output::resolve(self.output)
    }

    /// The lock client (retries, node failover, lease renewal) over these endpoints.
    pub fn client(&self) -> Result<Client, CliError> {
        if self.timeout.is_zero() {
            return Err(CliError::usage("--timeout must be positive"));
        }
        let mut options = ClientOptions::default();
        options.call_timeout = self.timeout;
        options.api_key = self.api_key.clone().or_else(|| self.admin_token.clone());
        Ok(Client::with_options(self.endpoints.clone(), options)?)
    }
}

/// Accepts `host:port` or `http://host:port` (a trailing `/` is fine) and returns the base
/// URL. Anything else is refused here, before any request, so a typo never turns into a
/// confusing connection error. `https://` is refused with its reason: the client speaks plain
/// HTTP only (built without TLS).
pub fn parse_endpoint(raw: &str) -> Result<String, String> {
    let s = raw.trim();
    let (scheme, rest) = if let Some(r) = s.strip_prefix("http://") {
        ("http", r)
    } else if s.starts_with("https://") {
        return Err(format!(
            "'{s}': https is not supported: fencegate's client speaks plain HTTP only (it is \
             built without TLS); use host:port or http://host:port over a network you trust"
        ));
    } else if s.contains("://") {
        return Err(format!("'{s}': only http:// endpoints are supported"));
    } else {
        ("http", s)
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err("empty endpoint: expected host:port, e.g. 127.0.0.1:7001".into());
    }
    if rest.contains('/') {
        return Err(format!(
            "'{s}': an endpoint is host:port or http://host:port, without a path"
        ));
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(format!(
            "'{s}': missing port; expected host:port, e.g. 127.0.0.1:7001"
        ));
    };
    if host.is_empty() {
        return Err(format!("'{s}': missing host before ':{port}'"));
    }
    if port.parse::<u16>().is_err() {
        return Err(format!("'{s}': '{port}' is not a port number"));
    }
    let url = format!("{scheme}://{rest}");
    // The whole URL as the HTTP client will read it: a host with spaces or other characters no
    // host can have fails here, not as a connection error on every call.
    match reqwest::Url::parse(&url) {
        Ok(u) if u.query().is_none() && u.fragment().is_none() => Ok(url),
        Ok(_) => Err(format!("'{s}': an endpoint has no query or fragment")),
        Err(e) => Err(format!("'{s}': not a usable address ({e})")),
    }
}

/// Durations on the command line: a number with a unit, `500ms`, `30s`, `5m` or `1h`. A unit
/// is required so `--ttl 30` cannot silently mean 30 ms.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let s = raw.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("'{s}' needs a unit: ms, s, m or h (e.g. 30s)"))?;
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{s}' is not a duration such as 500ms, 30s or 5m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("'{s}': unknown unit '{unit}'; use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("'{s}' is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_accept_addresses_and_urls() {
        assert_eq!(
            parse_endpoint("127.0.0.1:7001").unwrap(),
            "http://127.0.0.1:7001"
        );
        assert_eq!(
            parse_endpoint(" http://127.0.0.1:7002/ ").unwrap(),
            "http://127.0.0.1:7002"
        );
        assert_eq!(parse_endpoint("[::1]:7001").unwrap(), "http://[::1]:7001");
    }

    #[test]
    fn endpoints_refuse_what_cannot_be_an_api_address() {
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:70000",
            ":7001",
            "ftp://h:1",
            "http://h:1/v1",
            "https://lock.example:443",
            "not a host:1",
            "h:1?x=1",
            "http://",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("3d").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
