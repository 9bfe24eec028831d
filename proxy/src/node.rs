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

#[derive(clap::Args)]
#[command(after_help = "\
The file is TOML: the API address, the node's id, data directory and founding members, an
optional lock policy and an optional fencing proxy. docs/deploy/ has one per node of a
three-zone cluster, a systemd unit and a container recipe.

Example:
  fencegate node --config /etc/fencegate/node1.toml --log-format json")]
pub struct NodeArgs {
    /// Path of the node's TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

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

/// A parsed, checked config file.
struct Loaded {
    listen: String,
    config: NodeConfig,
    proxy: Option<ProxyConfig>,
}

fn load(path: &Path) -> anyhow::Result<Loaded> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    parse(&text).with_context(|| format!("config {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Loaded> {
    let file: FileConfig = toml::from_str(text)?;
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
    if let Some(p) = &file.proxy {
        p.validate().map_err(anyhow::Error::msg)?;
    }
    Ok(Loaded {
        listen: file.listen,
        config,
        proxy: file.proxy,
    })
}

pub async fn run(path: &Path) -> anyhow::Result<()> {
    let Loaded {
        listen,
        config,
        proxy,
    } = load(path)?;
    let listener = TcpListener::bind(&listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    let id = config.id;
    let (stop_tx, stop_rx) = watch::channel(false);
    let handle = lock_core::server::start(config, listener, stopped(stop_rx.clone())).await?;
    tracing::info!(node = id, addr = %handle.addr, "node started");
    let proxy_task = match &proxy {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The example configs in docs/deploy/ are what operators copy; they must stay loadable
    /// by this binary and describe one consistent three-node cluster.
    #[test]
    fn deploy_examples_parse_and_agree() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy");
        let mut founding = None;
        for id in 1..=3u64 {
            let loaded = load(&dir.join(format!("node{id}.toml"))).unwrap();
            assert_eq!(loaded.config.id, id);
            assert_eq!(loaded.config.initial_members.len(), 3);
            let me = &loaded.config.initial_members[&id];
            assert_eq!(loaded.config.advertise_addr.as_ref(), Some(me));
            assert!(loaded.proxy.is_some(), "node{id} has no [proxy]");
            match &founding {
                None => founding = Some(loaded.config.initial_members.clone()),
                Some(f) => assert_eq!(f, &loaded.config.initial_members),
            }
        }
    }

    #[test]
    fn unknown_keys_and_bad_member_ids_are_refused() {
        let base = "listen = \"127.0.0.1:7001\"\n[node]\nid = 1\ndata_dir = \"/tmp/x\"\n";
        assert!(parse(base).is_ok());
        assert!(parse(&format!("{base}colour = \"blue\"\n")).is_err());
        assert!(parse(&format!(
            "{base}initial_members = {{ \"one\" = \"h:1\" }}\n"
        ))
        .is_err());
    }
}
