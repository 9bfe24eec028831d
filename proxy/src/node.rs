//! `fencegate node --config FILE`: one production node, and the config file it reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fencegate_proxy::config::ProxyConfig;
use lock_core::net::PeerSecret;
use lock_core::node::{self, MemberAddrs, NodeConfig};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::signal::{shutdown_signal, stopped};

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
}

pub async fn run(path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let file: FileConfig =
        toml::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    let secret = peer_secret(&file.node, path)?;
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
    let listener = TcpListener::bind(&file.listen)
        .await
        .with_context(|| format!("bind {}", file.listen))?;
    let peer_listener = TcpListener::bind(&file.peer_listen)
        .await
        .with_context(|| format!("bind {}", file.peer_listen))?;
    let id = config.id;
    let (stop_tx, stop_rx) = watch::channel(false);
    let handle =
        lock_core::server::start(config, listener, peer_listener, stopped(stop_rx.clone())).await?;
    tracing::info!(node = id, addr = %handle.addr, peer_addr = %handle.peer_addr, "node started");
    let proxy_task = match &file.proxy {
        Some(p) => {
            let l = std::net::TcpListener::bind(&p.listen)
                .with_context(|| format!("bind proxy {}", p.listen))?;
            tracing::info!(node = id, addr = %p.listen, "fencing proxy started");
            Some(fencegate_proxy::server::start(
                handle.node.clone(),
                p,
                l,
                stopped(stop_rx),
            )?)
        }
        None => None,
    };
    shutdown_signal().await;
    tracing::info!(node = id, "stopping");
    let _ = stop_tx.send(true);
    if let Some(t) = proxy_task {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
    }
    handle.stopped().await;
    Ok(())
}

/// The peer secret from `peer_secret` or `peer_secret_file`; exactly one must be set.
fn peer_secret(node: &NodeFileConfig, path: &Path) -> anyhow::Result<PeerSecret> {
    let text = match (&node.peer_secret, &node.peer_secret_file) {
        (Some(text), None) => text.clone(),
        (None, Some(file)) => std::fs::read_to_string(file)
            .with_context(|| format!("read peer_secret_file {}", file.display()))?,
        (Some(_), Some(_)) => anyhow::bail!(
            "{}: [node] sets both peer_secret and peer_secret_file; keep one",
            path.display()
        ),
        (None, None) => anyhow::bail!(
            "{}: [node] needs peer_secret or peer_secret_file: the secret every node of the \
             cluster shares to authenticate peer traffic (e.g. `openssl rand -hex 32`)",
            path.display()
        ),
    };
    PeerSecret::new(&text).with_context(|| format!("{}: peer secret", path.display()))
}
