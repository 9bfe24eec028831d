//! `fencegate node --config FILE`: one production node, and the config file it reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fencegate_proxy::config::ProxyConfig;
use lock_core::api::listen;
use lock_core::net::PeerSecret;
use lock_core::node::{self, AuthMode, MemberAddrs, NodeConfig, TenantPolicy};
use lock_core::timing::RaftTiming;
use serde::Deserialize;
use tokio::sync::watch;

use crate::cert_dates;
use crate::fd_budget::{fit, Caps};
use crate::signal::{shutdown_signal, stopped};

#[derive(clap::Args)]
#[command(after_help = "\
The file is TOML: the API and peer addresses, the node's id, data directory, peer secret and
founding members, an optional lock policy and an optional fencing proxy. docs/deploy/ has one per node of a
three-zone cluster, a systemd unit and a container recipe.

A config file that cannot be read or is invalid exits with status 2, naming the setting; any
other failure to start exits with 1.

Examples:
  fencegate node --config /etc/fencegate/node1.toml --log-format json
  fencegate node --config /etc/fencegate/node1.toml --check   # test the file, start nothing")]
pub struct NodeArgs {
    /// Path of the node's TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Check the config file (syntax, settings, secret and certificate files) and exit: 0 if
    /// the node could start from it, 2 if not. Nothing is bound or written.
    #[arg(long)]
    pub check: bool,
}

/// The config file of a production node.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    /// Address the public API listens on.
    listen: String,
    /// Address the peer API (raft, forwarding between nodes) listens on.
    peer_listen: String,
    node: NodeFileConfig,
    /// Optional fencing proxy served next to the node.
    #[serde(default)]
    proxy: Option<ProxyConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFileConfig {
    id: u64,
    data_dir: PathBuf,
    #[serde(default)]
    advertise_addr: Option<String>,
    #[serde(default)]
    advertise_peer_addr: Option<String>,
    /// The cluster's shared peer secret, inline...
    #[serde(default)]
    peer_secret: Option<String>,
    /// ...or in a file (its surrounding whitespace is ignored).
    #[serde(default)]
    peer_secret_file: Option<PathBuf>,
    /// Keys are node ids as strings (TOML keys are strings).
    #[serde(default)]
    initial_members: BTreeMap<String, MemberAddrs>,
    #[serde(default)]
    policy: Option<node::Policy>,
    #[serde(default)]
    enable_fault_injection: bool,
    /// `"on"`: every `/v1` call needs an API key; `"off"`: the lock API is open. Required, so
    /// that no production node is open by omission.
    #[serde(default)]
    auth: Option<AuthMode>,
    /// The bootstrap admin credential (operator actions; with auth on, an admin key of the
    /// default tenant that creates the first keys), inline...
    #[serde(default)]
    admin_token: Option<String>,
    /// ...or in a file (its surrounding whitespace is ignored).
    #[serde(default)]
    admin_token_file: Option<PathBuf>,
    /// Per-tenant bounds with auth on: `max_leases`, `max_waiters`, `rate_per_s`, `burst`.
    #[serde(default)]
    tenants: Option<TenantPolicy>,
    /// Limits of the public API's listener (`[node.limits]`).
    #[serde(default)]
    limits: Option<node::HttpLimits>,
    /// Limits of the peer port's listener (`[node.peer_limits]`).
    #[serde(default)]
    peer_limits: Option<node::HttpLimits>,
    /// Serve the public API over TLS (`[node.tls]`: `cert_file`, `key_file`).
    #[serde(default)]
    tls: Option<node::TlsFiles>,
    /// Commands the leader holds for its next raft writes before it answers 503 `overloaded`
    /// (unbounded when absent).
    #[serde(default)]
    max_queued_writes: Option<usize>,
    /// Raft's heartbeat and election timing (`[node.raft]`: `heartbeat_ms`,
    /// `election_timeout_ms`), the same on every member.
    #[serde(default)]
    raft: Option<RaftTiming>,
    /// The audit log rotates at this size (bytes)...
    #[serde(default)]
    audit_max_bytes: Option<u64>,
    /// ...keeping this many rotated files.
    #[serde(default)]
    audit_keep: Option<usize>,
}

/// A parsed, checked config file.
pub struct Loaded {
    listen: String,
    peer_listen: String,
    config: NodeConfig,
    proxy: Option<ProxyConfig>,
}

/// Reads and checks the config file at `path`: every setting the node would refuse at start.
pub fn load(path: &Path) -> anyhow::Result<Loaded> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    parse(&text).with_context(|| format!("config {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Loaded> {
    let file: FileConfig = toml::from_str(text)?;
    check_listen("listen", &file.listen)?;
    check_listen("peer_listen", &file.peer_listen)?;
    if let Some(p) = &file.proxy {
        check_listen("proxy.listen", &p.listen)?;
    }
    let secret = peer_secret(&file.node)?;
    let admin_token = admin_token(&file.node)?;
    let mut members = BTreeMap::new();
    for (id, addr) in file.node.initial_members {
        let id: u64 = id
            .parse()
            .with_context(|| format!("initial_members key '{id}' is not a node id"))?;
        members.insert(id, addr);
    }
    let mut config = NodeConfig::new(file.node.id, file.node.data_dir, members, secret);
    config.advertise_addr = file.node.advertise_addr;
    config.advertise_peer_addr = file.node.advertise_peer_addr;
    config.policy = file.node.policy.unwrap_or_default();
    config.enable_fault_injection = file.node.enable_fault_injection;
    config.admin_token = admin_token;
    config.auth = file.node.auth.ok_or_else(|| {
        anyhow::anyhow!(
            "[node] must say auth = \"on\" (every /v1 call needs an API key; set admin_token or \
             admin_token_file to create the first keys) or auth = \"off\" (the lock API is open \
             to anyone who can reach the port)"
        )
    })?;
    if config.auth == AuthMode::On && config.admin_token.is_none() {
        tracing::warn!(
            "auth is on without admin_token: only keys already in the cluster's key table work"
        );
    }
    config.tenants = file.node.tenants.unwrap_or_default();
    if let Some(limits) = file.node.limits {
        limits.validate("node.limits").map_err(anyhow::Error::msg)?;
        config.limits = limits;
    }
    if let Some(limits) = file.node.peer_limits {
        limits
            .validate("node.peer_limits")
            .map_err(anyhow::Error::msg)?;
        config.peer_limits = limits;
    }
    config.tls = file.node.tls;
    if let Some(bytes) = file.node.audit_max_bytes {
        if bytes < 4096 {
            anyhow::bail!("node.audit_max_bytes must be at least 4096");
        }
        config.audit_max_bytes = bytes;
    }
    if let Some(keep) = file.node.audit_keep {
        config.audit_keep = keep;
    }
    if let Some(max) = file.node.max_queued_writes {
        if max == 0 {
            anyhow::bail!("node.max_queued_writes must be at least 1");
        }
        config.max_queued_writes = Some(max);
    }
    if let Some(timing) = file.node.raft {
        timing.validate().map_err(|e| anyhow::anyhow!("node.{e}"))?;
        config.raft = timing;
    }
    config
        .policy
        .validate()
        .map_err(|e| anyhow::anyhow!("node.{e}"))?;
    if let Some(tls) = &config.tls {
        listen::tls_acceptor(tls).map_err(|e| anyhow::anyhow!("node.tls: {e}"))?;
        cert_dates::warn_about("node.tls.cert_file", &tls.cert_file);
    }
    if let Some(p) = &file.proxy {
        p.validate().map_err(anyhow::Error::msg)?;
        // Warnings are logged when the proxy starts; contradictions stop the node here.
        p.check_tenants(config.auth == AuthMode::On)
            .map_err(anyhow::Error::msg)?;
        if let Some(tls) = &p.tls {
            listen::tls_acceptor(tls).map_err(|e| anyhow::anyhow!("proxy.tls: {e}"))?;
            cert_dates::warn_about("proxy.tls.cert_file", &tls.cert_file);
        }
    }
    Ok(Loaded {
        listen: file.listen,
        peer_listen: file.peer_listen,
        config,
        proxy: file.proxy,
    })
}

impl Loaded {
    /// The node's own settings (id, data directory, members).
    pub fn node_config(&self) -> &NodeConfig {
        &self.config
    }

    /// The addresses the node announces: `advertise_addr` and `advertise_peer_addr`, else
    /// what it listens on.
    pub fn advertised(&self) -> lock_core::raft::NodeInfo {
        lock_core::raft::NodeInfo {
            api_addr: self
                .config
                .advertise_addr
                .clone()
                .unwrap_or_else(|| self.listen.clone()),
            peer_addr: self
                .config
                .advertise_peer_addr
                .clone()
                .unwrap_or_else(|| self.peer_listen.clone()),
        }
    }

    /// For `--check`: whether this process can use the data directory as the node would. It
    /// must be a directory this user can create files in, or, if it does not exist yet, its
    /// nearest existing parent must be (the node creates it). Run `--check` as the service's
    /// user: a directory made by root is what this catches.
    pub fn check_data_dir(&self) -> anyhow::Result<()> {
        let dir = &self.config.data_dir;
        // A relative path's last ancestor is "": the working directory.
        let existing = dir
            .ancestors()
            .find(|p| !p.as_os_str().is_empty() && p.exists())
            .unwrap_or(Path::new("."));
        if !existing.is_dir() {
            anyhow::bail!(
                "data_dir {}: {} is not a directory",
                dir.display(),
                existing.display()
            );
        }
        let probe = existing.join(format!(".fencegate-check-{}", std::process::id()));
        std::fs::write(&probe, b"")
            .and_then(|()| std::fs::remove_file(&probe))
            .map_err(|e| {
                let what = if existing == dir.as_path() {
                    "the data directory".to_string()
                } else {
                    format!(
                        "{} (where the data directory would be made)",
                        existing.display()
                    )
                };
                anyhow::anyhow!(
                    "data_dir {}: cannot create a file in {what}: {e}; run the node as a user \
                     that owns it, or fix its permissions",
                    dir.display()
                )
            })
    }

    /// One line on what the file describes, for `--check`.
    pub fn summary(&self) -> String {
        let proxy = match &self.proxy {
            Some(p) => format!(", proxy {} ({} routes)", p.listen, p.routes.len()),
            None => String::new(),
        };
        let members = &self.config.initial_members;
        let founding = match members.len() {
            0 => "no founding members: on an empty data directory it waits to be added to a \
                  cluster"
                .to_string(),
            n if !members.contains_key(&self.config.id) => {
                format!("{n} founding members, not this node: it joins when a member adds it")
            }
            n => format!("{n} founding members"),
        };
        format!(
            "node {} (api {}, peer {}, data {}, {founding}{proxy})",
            self.config.id,
            self.listen,
            self.peer_listen,
            self.config.data_dir.display(),
        )
    }
}

/// Runs the node the checked config describes until a shutdown signal.
pub async fn run(loaded: Loaded) -> anyhow::Result<()> {
    let Loaded {
        listen,
        peer_listen,
        mut config,
        mut proxy,
    } = loaded;
    let caps = Caps::of(&config, proxy.as_ref().map(|p| &p.limits));
    fit(caps, 1).apply(&mut config, proxy.as_mut().map(|p| &mut p.limits));
    let listener = listen::bind(&listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    let peer_listener = listen::bind(&peer_listen)
        .await
        .with_context(|| format!("bind {peer_listen}"))?;
    // Every port is bound before anything starts: a port in use stops the start at once.
    let proxy_listener = match &proxy {
        Some(p) => Some(
            listen::bind_std(&p.listen)
                .await
                .with_context(|| format!("bind proxy {}", p.listen))?,
        ),
        None => None,
    };
    let id = config.id;
    let (stop_tx, stop_rx) = watch::channel(false);
    let data_dir = config.data_dir.clone();
    let handle =
        lock_core::server::start(config, listener, peer_listener, stopped(stop_rx.clone()))
            .await
            .map_err(|e| {
                let cause = crate::one_line(&anyhow::Error::from(e));
                // Storage errors that know their way out say it already.
                if cause.starts_with("configuration:") || cause.contains("start the node again") {
                    anyhow::anyhow!(cause)
                } else {
                    anyhow::anyhow!("{cause} ({})", storage_fix(&cause, &data_dir))
                }
            })?;
    tracing::info!(node = id, addr = %handle.addr, peer_addr = %handle.peer_addr, "node started");
    let proxy_task = match (&proxy, proxy_listener) {
        (Some(p), Some(l)) => {
            let task = fencegate_proxy::server::start(handle.node.clone(), p, l, stopped(stop_rx))?;
            tracing::info!(node = id, addr = %p.listen, "fencing proxy started");
            Some(task)
        }
        _ => None,
    };
    // A node whose raft stopped on its own (a full or failing disk) serves nothing: it exits
    // with an error, so that its supervisor restarts it, instead of staying up half-dead.
    let failed = tokio::select! {
        _ = shutdown_signal() => None,
        cause = handle.node.raft_failed() => Some(cause),
    };
    match &failed {
        None => tracing::info!(node = id, "stopping"),
        Some(cause) => tracing::error!(node = id, %cause, "raft stopped on its own: exiting"),
    }
    let _ = stop_tx.send(true);
    if let Some(t) = proxy_task {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
    }
    handle.stopped().await;
    match failed {
        None => Ok(()),
        Some(cause) => Err(anyhow::anyhow!(
            "raft stopped on node {id}: {cause} ({})",
            storage_fix(&cause, &data_dir)
        )),
    }
}

/// What to do about a storage failure, by its cause: most causes are the machine's (a full
/// disk, a read-only file system, a file limit) and the data is fine once they are fixed; the
/// rest mean damaged files, which the other members' copy repairs.
fn storage_fix(cause: &str, data_dir: &Path) -> String {
    let machine = [
        ("No space left on device", "free disk space"),
        (
            "Too many open files",
            "raise the open-file limit (ulimit -n, or LimitNOFILE in a systemd unit)",
        ),
        (
            "Read-only file system",
            "make the file system writable again (check the kernel log for its errors)",
        ),
        (
            "Permission denied",
            "give the node's user read and write access to the data directory",
        ),
        (
            "Input/output error",
            "check the disk (the kernel log names its errors)",
        ),
    ];
    match machine.iter().find(|(said, _)| cause.contains(said)) {
        Some((_, fix)) => format!("{fix}, then start the node again"),
        None => format!(
            "if {} is damaged and the other members are running, move it aside and start the \
             node again: it rejoins from the leader's snapshot, as a member that lost its data \
             directory (see the operations guide)",
            data_dir.display()
        ),
    }
}

/// The bootstrap admin credential from the `[node]` table, inline or from its file.
fn admin_token(node: &NodeFileConfig) -> anyhow::Result<Option<String>> {
    let token = match (&node.admin_token, &node.admin_token_file) {
        (Some(_), Some(_)) => {
            anyhow::bail!("[node] sets both admin_token and admin_token_file; keep one")
        }
        (Some(t), None) => t.trim().to_string(),
        (None, Some(file)) => {
            warn_if_readable_by_others("admin_token_file", file);
            std::fs::read_to_string(file)
                .with_context(|| format!("read admin_token_file {}", file.display()))?
                .trim()
                .to_string()
        }
        (None, None) => return Ok(None),
    };
    // It is a bearer credential for every operator action: it must not be guessable.
    anyhow::ensure!(
        token.len() >= 16,
        "[node] admin_token must be at least 16 characters (e.g. `openssl rand -hex 32`)"
    );
    Ok(Some(token))
}

/// The peer secret from the `[node]` table, inline or from its file.
/// A listen address must be `host:port` with a port the system can bind (it failed only at
/// the bind, past `--check`, naming neither the key nor the file).
fn check_listen(key: &str, addr: &str) -> anyhow::Result<()> {
    let valid = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid {
        anyhow::bail!("{key} = \"{addr}\" is not host:port with a port of 0-65535");
    }
    Ok(())
}

/// Warns when a secret file can be read by other users than the node's.
fn warn_if_readable_by_others(key: &str, file: &Path) {
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(file) {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                "{key} {} is readable by other users (mode {:o}); make it readable by the \
                 service only: chmod 600",
                file.display(),
                mode & 0o777
            );
        }
    }
}

fn peer_secret(node: &NodeFileConfig) -> anyhow::Result<PeerSecret> {
    let text = match (&node.peer_secret, &node.peer_secret_file) {
        (Some(text), None) => text.clone(),
        (None, Some(file)) => {
            warn_if_readable_by_others("peer_secret_file", file);
            std::fs::read_to_string(file)
                .with_context(|| format!("read peer_secret_file {}", file.display()))?
        }
        (Some(_), Some(_)) => {
            anyhow::bail!("[node] sets both peer_secret and peer_secret_file; keep one")
        }
        (None, None) => anyhow::bail!(
            "[node] needs peer_secret or peer_secret_file: the secret every node of the cluster \
             shares to authenticate peer traffic (e.g. `openssl rand -hex 32`)"
        ),
    };
    PeerSecret::new(&text).context("peer secret")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storage_failure_says_what_to_do() {
        let dir = Path::new("/var/lib/fencegate");
        let full = storage_fix(
            "cannot encode snapshot: No space left on device (os error 28)",
            dir,
        );
        assert_eq!(full, "free disk space, then start the node again");
        let damaged = storage_fix(
            "fjall storage error: FjallError: Storage(Unrecoverable): LsmTreeError: Unrecoverable",
            dir,
        );
        assert!(
            damaged.starts_with("if /var/lib/fencegate is damaged and the other members are"),
            "{damaged}"
        );
    }

    /// The example configs in docs/deploy/ are what operators copy; they must stay loadable
    /// by this binary and describe one consistent three-node cluster.
    #[test]
    fn deploy_examples_parse_and_agree() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy");
        let mut founding = None;
        for id in 1..=3u64 {
            // The secret file lives on each machine; here a stand-in takes its place.
            let secret = std::env::temp_dir().join(format!("fencegate-test-secret-{id}"));
            std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
            let text = std::fs::read_to_string(dir.join(format!("node{id}.toml")))
                .unwrap()
                .replace("/etc/fencegate/peer-secret", &secret.display().to_string())
                .replace("/etc/fencegate/admin-token", &secret.display().to_string());
            let loaded = parse(&text).unwrap();
            assert_eq!(loaded.config.id, id);
            assert_eq!(loaded.config.initial_members.len(), 3);
            let me = &loaded.config.initial_members[&id];
            assert_eq!(loaded.config.advertise_addr.as_ref(), Some(&me.api));
            assert_eq!(loaded.config.advertise_peer_addr.as_ref(), Some(&me.peer));
            assert!(loaded.proxy.is_some(), "node{id} has no [proxy]");
            assert_eq!(
                loaded.config.auth,
                AuthMode::On,
                "node{id} serves an open API"
            );
            match &founding {
                None => founding = Some(loaded.config.initial_members.clone()),
                Some(f) => assert_eq!(f, &loaded.config.initial_members),
            }
        }
    }

    /// The smallest file a node starts from: one member, the lock API open.
    const OPEN_NODE: &str =
        "listen = \"127.0.0.1:7001\"\npeer_listen = \"127.0.0.1:7101\"\n[node]\nid = 1\n\
         data_dir = \"/tmp/x\"\npeer_secret = \"0123456789abcdef0123\"\nauth = \"off\"\n";

    #[test]
    fn the_audit_logs_rotation_is_read_from_the_node_table() {
        let default = parse(OPEN_NODE).expect("loads");
        assert_eq!(
            (default.config.audit_max_bytes, default.config.audit_keep),
            (64 << 20, 5)
        );
        let set = parse(&format!(
            "{OPEN_NODE}audit_max_bytes = 1048576\naudit_keep = 2\n"
        ))
        .expect("loads");
        assert_eq!(
            (set.config.audit_max_bytes, set.config.audit_keep),
            (1 << 20, 2)
        );
        let err = format!(
            "{:#}",
            parse(&format!("{OPEN_NODE}audit_max_bytes = 10\n"))
                .err()
                .expect("refused")
        );
        assert!(err.contains("audit_max_bytes"), "{err}");
    }

    /// The check covers what the proxy compiles from its routes when it starts: patterns,
    /// methods, hosts (these passed the check and then stopped the start).
    #[test]
    fn a_route_the_proxy_would_refuse_fails_the_check() {
        let route = |extra: &str| {
            format!(
                "{OPEN_NODE}[proxy]\nlisten = \"127.0.0.1:8001\"\n[[proxy.routes]]\n\
                 path = \"/dav/**\"\nresource = \"dav\"\nupstream = \"127.0.0.1:9000\"\n{extra}"
            )
        };
        assert!(parse(&route("")).is_ok());
        for (extra, says) in [
            ("read_methods = [\"GET\"]\n", "read_methods"),
            ("hosts = [\"a b\"]\n", "a b"),
        ] {
            let err = format!("{:#}", parse(&route(extra)).err().expect("refused"));
            assert!(err.contains(says), "{extra}: {err}");
        }
        let relative = route("").replace("path = \"/dav/**\"", "path = \"dav/{x}\"");
        let err = format!("{:#}", parse(&relative).err().expect("refused"));
        assert!(err.contains("must start with '/'"), "{err}");
    }

    /// `--check` tries the data directory as the node would use it: one that exists or can be
    /// made passes, one under a file is named with the reason.
    #[test]
    fn the_check_tries_the_data_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let with_dir = |data: &Path| {
            parse(&OPEN_NODE.replace("/tmp/x", &data.display().to_string())).expect("loads")
        };
        with_dir(dir.path())
            .check_data_dir()
            .expect("an existing directory");
        with_dir(&dir.path().join("new/nested"))
            .check_data_dir()
            .expect("a directory the node can make");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").expect("write");
        let err = format!(
            "{:#}",
            with_dir(&file.join("data"))
                .check_data_dir()
                .expect_err("refused")
        );
        assert!(err.contains("a-file is not a directory"), "{err}");
        let leftovers = std::fs::read_dir(dir.path()).expect("list").count();
        assert_eq!(leftovers, 1, "the probe files are removed");
    }

    #[test]
    fn a_proxy_certificate_that_cannot_be_used_stops_the_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("missing.pem");
        let text = format!(
            "{OPEN_NODE}[proxy]\nlisten = \"127.0.0.1:8001\"\n[proxy.tls]\ncert_file = \"{m}\"\n\
             key_file = \"{m}\"\n",
            m = missing.display()
        );
        let err = format!("{:#}", parse(&text).err().expect("refused"));
        assert!(
            err.contains("proxy.tls") && err.contains("missing.pem"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_and_bad_member_ids_are_refused() {
        let base = OPEN_NODE;
        assert!(parse(base).is_ok());
        assert!(parse(&format!("{base}colour = \"blue\"\n")).is_err());
        assert!(parse(&format!(
            "{base}initial_members = {{ \"one\" = {{ api = \"h:1\", peer = \"h:2\" }} }}\n"
        ))
        .is_err());
        let no_secret = base.replace("peer_secret = \"0123456789abcdef0123\"\n", "");
        let err = format!("{:#}", parse(&no_secret).err().expect("refused"));
        assert!(err.contains("peer_secret"), "{err}");
    }

    #[test]
    fn the_write_queue_bound_is_read_and_zero_is_refused() {
        let base = OPEN_NODE;
        let default = parse(base).expect("loads");
        assert_eq!(
            default.config.max_queued_writes, None,
            "unbounded unless set"
        );
        let set = parse(&format!("{base}max_queued_writes = 100\n")).expect("loads");
        assert_eq!(set.config.max_queued_writes, Some(100));
        let err = format!(
            "{:#}",
            parse(&format!("{base}max_queued_writes = 0\n"))
                .err()
                .expect("refused")
        );
        assert!(err.contains("max_queued_writes"), "{err}");
    }

    #[test]
    fn raft_timing_is_read_and_checked() {
        let base = OPEN_NODE;
        let default = parse(base).expect("loads");
        assert_eq!(default.config.raft, RaftTiming::default());
        let set = parse(&format!(
            "{base}[node.raft]\nheartbeat_ms = 300\nelection_timeout_ms = 1500\n"
        ))
        .expect("loads");
        assert_eq!(
            set.config.raft,
            RaftTiming {
                heartbeat_ms: 300,
                election_timeout_ms: 1_500
            }
        );
        let only_heartbeat =
            parse(&format!("{base}[node.raft]\nheartbeat_ms = 50\n")).expect("loads");
        assert_eq!(only_heartbeat.config.raft.election_timeout_ms, 400);
        for (bad, key) in [
            ("heartbeat_ms = 300\n", "node.raft.election_timeout_ms"),
            ("heartbeat_ms = 0\n", "node.raft.heartbeat_ms"),
            ("election_ms = 900\n", "election_ms"),
        ] {
            let err = format!(
                "{:#}",
                parse(&format!("{base}[node.raft]\n{bad}"))
                    .err()
                    .expect("refused")
            );
            assert!(err.contains(key), "{bad}: {err}");
        }
    }

    /// A production node never serves an open lock API by omission: the file says which.
    #[test]
    fn auth_must_be_said_and_on_takes_the_bootstrap_token() {
        let base =
            "listen = \"127.0.0.1:7001\"\npeer_listen = \"127.0.0.1:7101\"\n[node]\nid = 1\n\
                    data_dir = \"/tmp/x\"\npeer_secret = \"0123456789abcdef0123\"\n";
        let err = format!("{:#}", parse(base).err().expect("refused without auth"));
        assert!(err.contains("auth = \"on\""), "{err}");
        let off = parse(&format!("{base}auth = \"off\"\n")).expect("off");
        assert_eq!(off.config.auth, AuthMode::Off);
        let on = parse(&format!(
            "{base}auth = \"on\"\nadmin_token = \"0123456789abcdef0123\"\n\
             [node.tenants]\nmax_leases = 5\n"
        ))
        .expect("on");
        assert_eq!(on.config.auth, AuthMode::On);
        assert_eq!(
            on.config.admin_token.as_deref(),
            Some("0123456789abcdef0123")
        );
        assert_eq!(on.config.tenants.max_leases, 5);
        assert!(parse(&format!("{base}auth = \"maybe\"\n")).is_err());
        let short = format!("{base}auth = \"on\"\nadmin_token = \"short\"\n");
        assert!(parse(&short).is_err());
    }

    /// A proxy route that takes the tenant from API keys on a node that checks none is a
    /// contradiction the start refuses, naming the route.
    #[test]
    fn a_key_tenant_route_needs_auth_on() {
        let base =
            "listen = \"127.0.0.1:7001\"\npeer_listen = \"127.0.0.1:7101\"\n[node]\nid = 1\n\
                    data_dir = \"/tmp/x\"\npeer_secret = \"0123456789abcdef0123\"\n\
                    admin_token = \"0123456789abcdef0123\"\n";
        let proxy = "[proxy]\nlisten = \"127.0.0.1:8001\"\n[[proxy.routes]]\npath = \"/kv/{k}\"\n\
                     resource = \"kv:{k}\"\nupstream = \"127.0.0.1:9000\"\ntenant = \"api_key\"\n";
        let off = format!("{base}auth = \"off\"\n{proxy}");
        let err = format!("{:#}", parse(&off).err().expect("refused"));
        assert!(
            err.contains("/kv/{k}") && err.contains("auth = \"on\""),
            "{err}"
        );
        let on = format!("{base}auth = \"on\"\n{proxy}");
        assert!(parse(&on).is_ok());
    }

    mod fuzz {
        use proptest::prelude::*;

        use super::*;

        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                "[ -~]{0,24}".prop_map(|s| format!("{s:?}")),
                Just("\"0123456789abcdef0123\"".to_string()),
                Just("true".to_string()),
                Just("{}".to_string()),
                Just("{ api = \"h:1\", peer = \"h:2\" }".to_string()),
            ]
        }

        fn line() -> impl Strategy<Value = String> {
            let key = prop_oneof![
                Just("listen"),
                Just("peer_listen"),
                Just("id"),
                Just("data_dir"),
                Just("peer_secret"),
                Just("advertise_addr"),
                Just("initial_members"),
                Just("enable_fault_injection"),
                Just("min_ttl_ms"),
                Just("max_ttl_ms"),
                Just("failover_grace_ms"),
                Just("max_body_bytes"),
                Just("max_header_bytes"),
                Just("header_timeout_ms"),
                Just("max_connections"),
                Just("max_queued_writes"),
                Just("heartbeat_ms"),
                Just("election_timeout_ms"),
                Just("cert_file"),
            ];
            prop_oneof![
                4 => (key, value()).prop_map(|(k, v)| format!("{k} = {v}")),
                1 => prop_oneof![
                    Just("[node]"),
                    Just("[node.policy]"),
                    Just("[node.limits]"),
                    Just("[node.peer_limits]"),
                    Just("[node.tls]"),
                    Just("[node.raft]"),
                    Just("[proxy]"),
                ]
                .prop_map(str::to_string),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(lock_core::testkit::fuzz_cases(1_000)))]

            /// A node's config file — any text, or TOML made of the real keys with arbitrary
            /// values — loads or is refused with an error, never a panic.
            #[test]
            fn any_config_text_loads_or_is_refused(text in "\\PC{0,200}") {
                let _ = parse(&text);
            }

            #[test]
            fn toml_from_real_keys_loads_or_is_refused(lines in proptest::collection::vec(line(), 0..20)) {
                let _ = parse(&lines.join("\n"));
            }
        }
    }
}
