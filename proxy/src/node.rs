//! `fencegate node --config FILE`: one production node, and the config file it reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fencegate_proxy::config::ProxyConfig;
use lock_core::node::{self, NodeConfig};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::signal::{shutdown_signal, stopped};

/// The config file of a production node.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    /// Address the API (and raft RPCs) listen on.
    listen: String,
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
    /// Keys are node ids as strings (TOML keys are strings).
    #[serde(default)]
    initial_members: BTreeMap<String, String>,
    #[serde(default)]
    policy: Option<node::Policy>,
    #[serde(default)]
    enable_fault_injection: bool,
}

pub async fn run(path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let file: FileConfig =
        toml::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    let mut members = BTreeMap::new();
    for (id, addr) in file.node.initial_members {
        let id: u64 = id
            .parse()
            .with_context(|| format!("initial_members key '{id}' is not a node id"))?;
        members.insert(id, addr);
    }
    let mut config = NodeConfig::new(file.node.id, file.node.data_dir, members);
    config.advertise_addr = file.node.advertise_addr;
    config.policy = file.node.policy.unwrap_or_default();
    config.enable_fault_injection = file.node.enable_fault_injection;
    let listener = TcpListener::bind(&file.listen)
        .await
        .with_context(|| format!("bind {}", file.listen))?;
    let id = config.id;
    let (stop_tx, stop_rx) = watch::channel(false);
    let handle = lock_core::server::start(config, listener, stopped(stop_rx.clone())).await?;
    tracing::info!(node = id, addr = %handle.addr, "node started");
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
