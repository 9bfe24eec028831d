//! `fencegate dev` (three nodes in one process) and `fencegate node --config`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use lock_core::node::{self, NodeConfig};
use serde::Deserialize;
use tokio::net::TcpListener;

#[derive(clap::Args)]
pub struct DevArgs {
    /// Root of the nodes' data directories (node1/, node2/, node3/ inside).
    #[arg(long, default_value = "./fencegate-data")]
    data_dir: PathBuf,
    /// API ports of the three nodes.
    #[arg(long, value_delimiter = ',', default_value = "7001,7002,7003")]
    api_ports: Vec<u16>,
    /// Serve /v1/admin/faults on every node (for chaos experiments).
    #[arg(long)]
    enable_fault_injection: bool,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.api_ports.len() == 3,
        "--api-ports takes exactly three ports"
    );
    let members: BTreeMap<u64, String> = args
        .api_ports
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}")))
        .collect();
    let mut handles = Vec::new();
    for (id, addr) in &members {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("bind {addr} (is another fencegate running?)"))?;
        let mut config = NodeConfig::new(
            *id,
            args.data_dir.join(format!("node{id}")),
            members.clone(),
        );
        config.enable_fault_injection = args.enable_fault_injection;
        handles.push(node::start(config, listener).await?);
    }
    let first = &members[&1];
    println!(
        "fencegate dev is running (data in {}):",
        args.data_dir.display()
    );
    for (id, addr) in &members {
        println!("  node {id}: http://{addr}  (metrics: http://{addr}/metrics)");
    }
    println!();
    println!("Try it:");
    println!("  curl -s -XPOST http://{first}/v1/locks/kv:demo/acquire -d '{{\"request_id\":\"r1\",\"ttl_ms\":30000}}'");
    println!("  curl -s -XPOST http://{first}/v1/locks/kv:demo/renew -d '{{\"lease_id\":\"<lease_id from above>\"}}'");
    println!("  curl -s -XPOST http://{first}/v1/locks/kv:demo/release -d '{{\"lease_id\":\"<lease_id from above>\"}}'");
    println!();
    println!("Ctrl-C stops it; restarting with the same --data-dir keeps all state.");
    tokio::signal::ctrl_c().await?;
    println!("stopping…");
    for h in handles {
        h.shutdown().await;
    }
    Ok(())
}

/// The config file of a production node.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    /// Address the API (and raft RPCs) listen on.
    listen: String,
    node: NodeFileConfig,
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

pub async fn run_node(path: &Path) -> anyhow::Result<()> {
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
    let handle = node::start(config, listener).await?;
    tracing::info!(node = id, addr = %handle.addr, "node started");
    shutdown_signal().await;
    tracing::info!(node = id, "stopping");
    handle.shutdown().await;
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
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
