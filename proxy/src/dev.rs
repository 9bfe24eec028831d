//! `fencegate dev` (three nodes in one process) and `fencegate node --config`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fencegate_proxy::config::ProxyConfig;
use lock_core::node::{self, NodeConfig};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(clap::Args)]
pub struct DevArgs {
    /// Root of the nodes' data directories (node1/, node2/, node3/ inside).
    #[arg(long, default_value = "./fencegate-data")]
    data_dir: PathBuf,
    /// API ports of the three nodes.
    #[arg(long, value_delimiter = ',', default_value = "7001,7002,7003")]
    api_ports: Vec<u16>,
    /// Fencing proxy ports of the three nodes.
    #[arg(long, value_delimiter = ',', default_value = "8001,8002,8003")]
    proxy_ports: Vec<u16>,
    /// Port of the bundled demo store.
    #[arg(long, default_value_t = 9000)]
    demo_store_port: u16,
    /// Serve /v1/admin/faults on every node (for chaos experiments).
    #[arg(long)]
    enable_fault_injection: bool,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.api_ports.len() == 3, "--api-ports takes three ports");
    anyhow::ensure!(
        args.proxy_ports.len() == 3,
        "--proxy-ports takes three ports"
    );
    let (stop_tx, stop_rx) = watch::channel(false);

    let store_addr = format!("127.0.0.1:{}", args.demo_store_port);
    let store_listener = TcpListener::bind(&store_addr)
        .await
        .with_context(|| format!("bind demo store {store_addr}"))?;
    let mut store_stop = stop_rx.clone();
    let store_task = tokio::spawn(fencegate_proxy::demo_store::serve(
        store_listener,
        async move {
            let _ = store_stop.wait_for(|s| *s).await;
        },
    ));

    let members: BTreeMap<u64, String> = args
        .api_ports
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}")))
        .collect();
    let mut running = Vec::new();
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
        let handle = lock_core::server::start(config, listener, std::future::pending()).await?;
        let proxy_addr = format!("127.0.0.1:{}", args.proxy_ports[*id as usize - 1]);
        let proxy_listener = std::net::TcpListener::bind(&proxy_addr)
            .with_context(|| format!("bind proxy {proxy_addr}"))?;
        let proxy_config = ProxyConfig::dev(proxy_addr, store_addr.clone());
        let proxy_task = fencegate_proxy::server::start(
            handle.node.clone(),
            &proxy_config,
            proxy_listener,
            stop_rx.clone(),
        )?;
        running.push((handle, proxy_task));
    }

    let api = &members[&1];
    let proxy = format!("127.0.0.1:{}", args.proxy_ports[0]);
    println!(
        "fencegate dev is running (data in {}):",
        args.data_dir.display()
    );
    for (id, addr) in &members {
        let p = args.proxy_ports[*id as usize - 1];
        println!("  node {id}: API http://{addr}  proxy http://127.0.0.1:{p}");
    }
    println!("  metrics: http://{api}/metrics");
    println!("  demo store: http://{store_addr}  (GET /kv/KEY, GET /log)");
    println!();
    println!("Try it: take the lock, write through the proxy with its token, release:");
    println!(
        r#"  curl -s -XPOST http://{api}/v1/locks/kv:demo/acquire -d '{{"request_id":"r1"}}'"#
    );
    println!("  curl -s -XPUT http://{proxy}/kv/demo -H 'Fence-Token: <fencing_token>' -d hello");
    println!(
        r#"  curl -s -XPOST http://{api}/v1/locks/kv:demo/release -d '{{"lease_id":"<lease_id>"}}'"#
    );
    println!();
    println!("Ctrl-C stops it; restarting with the same --data-dir keeps all state.");
    shutdown_signal().await;
    println!("stopping...");
    let _ = stop_tx.send(true);
    let grace = std::time::Duration::from_secs(2);
    for (handle, proxy_task) in running {
        let _ = tokio::time::timeout(grace, proxy_task).await;
        handle.shutdown().await;
    }
    let _ = tokio::time::timeout(grace, store_task).await;
    Ok(())
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
    let handle = lock_core::server::start(config, listener, std::future::pending()).await?;
    tracing::info!(node = id, addr = %handle.addr, "node started");
    let (stop_tx, stop_rx) = watch::channel(false);
    let proxy_task = match &file.proxy {
        Some(p) => {
            let l = std::net::TcpListener::bind(&p.listen)
                .with_context(|| format!("bind proxy {}", p.listen))?;
            tracing::info!(node = id, addr = %p.listen, "fencing proxy started");
            Some(fencegate_proxy::server::start(
                handle.node.clone(),
                p,
                l,
                stop_rx,
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

/// `fencegate demo-store`: the bundled demo store on its own.
pub async fn run_demo_store(listen: &str) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    println!("demo store on http://{}", listener.local_addr()?);
    fencegate_proxy::demo_store::serve(listener, shutdown_signal()).await?;
    Ok(())
}
