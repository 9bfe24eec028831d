//! `fencegate dev`: three nodes in one process, a fencing proxy per node and the demo store.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use fencegate_proxy::config::ProxyConfig;
use fencegate_proxy::demo_store::DemoStore;
use lock_core::api::listen;
use lock_core::net::PeerSecret;
use lock_core::node::{AuthMode, MemberAddrs, NodeConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::fd_budget::{fit, Caps};
use crate::signal::{shutdown_signal, stopped};

/// The demo store's journal, under the data directory: its keys and orders survive a restart.
const DEMO_STORE_JOURNAL: &str = "demo-store/journal.jsonl";

/// Where `fencegate dev` keeps its nodes' data and which ports they use: also what `fencegate
/// backup restore --dev` restores.
#[derive(clap::Args, Clone, Debug)]
pub struct DevLayout {
    /// Root of the nodes' data directories (node1/, node2/, node3/ inside) and of the demo
    /// store's journal (demo-store/).
    #[arg(long, default_value = "./fencegate-data")]
    pub data_dir: PathBuf,
    /// API ports of the three nodes.
    #[arg(long, value_delimiter = ',', default_value = "7001,7002,7003")]
    pub api_ports: Vec<u16>,
    /// Peer ports of the three nodes (raft and forwarding between nodes; authenticated with
    /// a secret generated at each start).
    #[arg(long, value_delimiter = ',', default_value = "7101,7102,7103")]
    pub peer_ports: Vec<u16>,
}

impl DevLayout {
    /// The three members, by id, with their API and peer addresses.
    fn members(&self) -> anyhow::Result<BTreeMap<u64, MemberAddrs>> {
        anyhow::ensure!(self.api_ports.len() == 3, "--api-ports takes three ports");
        anyhow::ensure!(self.peer_ports.len() == 3, "--peer-ports takes three ports");
        Ok(self
            .api_ports
            .iter()
            .zip(&self.peer_ports)
            .enumerate()
            .map(|(i, (api, peer))| {
                let addrs = MemberAddrs {
                    api: format!("127.0.0.1:{api}"),
                    peer: format!("127.0.0.1:{peer}"),
                };
                (i as u64 + 1, addrs)
            })
            .collect())
    }

    /// Node `id`'s config: its data directory under the root, the members, `secret`.
    fn node_config(
        &self,
        id: u64,
        members: &BTreeMap<u64, MemberAddrs>,
        secret: &PeerSecret,
    ) -> NodeConfig {
        NodeConfig::new(
            id,
            self.data_dir.join(format!("node{id}")),
            members.clone(),
            secret.clone(),
        )
    }

    /// The three nodes' configs (with a throwaway peer secret), as a restore needs them.
    pub fn node_configs(&self) -> anyhow::Result<Vec<NodeConfig>> {
        let members = self.members()?;
        let secret = PeerSecret::new(&PeerSecret::generate())?;
        Ok(members
            .keys()
            .map(|id| self.node_config(*id, &members, &secret))
            .collect())
    }
}

#[derive(clap::Args)]
#[command(after_help = "\
Data survives restarts: run it again with the same --data-dir to continue where it stopped.

Examples:
  fencegate dev
  fencegate dev --data-dir /tmp/fg --api-ports 17001,17002,17003 --proxy-ports 18001,18002,18003")]
pub struct DevArgs {
    #[command(flatten)]
    pub layout: DevLayout,
    /// Fencing proxy ports of the three nodes.
    #[arg(long, value_delimiter = ',', default_value = "8001,8002,8003")]
    proxy_ports: Vec<u16>,
    /// Port of the bundled demo store.
    #[arg(long, default_value_t = 9000)]
    demo_store_port: u16,
    /// Serve /v1/admin/faults on every node (for chaos experiments; calls need the admin
    /// credential printed at start).
    #[arg(long)]
    enable_fault_injection: bool,
    /// Require API keys on the lock API: every /v1 call then needs `Authorization: Bearer
    /// <key>`. The printed admin token is an admin key of the default tenant; create tenants'
    /// keys with `fencegate keys create`.
    #[arg(long)]
    auth: bool,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.proxy_ports.len() == 3,
        "--proxy-ports takes three ports"
    );
    let (stop_tx, stop_rx) = watch::channel(false);

    let store_addr = format!("127.0.0.1:{}", args.demo_store_port);
    let store_listener = listen::bind(&store_addr)
        .await
        .with_context(|| format!("bind demo store {store_addr}"))?;
    let journal = args.layout.data_dir.join(DEMO_STORE_JOURNAL);
    let store = DemoStore::open(&journal).context("open the demo store's journal")?;
    let store_writes = store.writes();
    let store_task = tokio::spawn(store.serve(store_listener, stopped(stop_rx.clone())));

    let members = args.layout.members()?;
    // The nodes live in this process only, so a secret made now and shared in memory is
    // enough; a restart makes a new one for all three at once.
    let secret = PeerSecret::new(&PeerSecret::generate())?;
    // Every port is bound before any node starts: the first node's vote requests then wait
    // in the others' accept queues instead of failing as "connection refused", a port in use
    // stops the start before anything runs, and no node's outgoing connection can take a
    // port a proxy has yet to bind.
    let mut listeners = Vec::new();
    for (addrs, proxy_port) in members.values().zip(&args.proxy_ports) {
        let proxy_addr = format!("127.0.0.1:{proxy_port}");
        let proxy_listener = listen::bind_std(&proxy_addr)
            .await
            .with_context(|| format!("bind proxy {proxy_addr}"))?;
        listeners.push((
            bind(&addrs.api).await?,
            bind(&addrs.peer).await?,
            (proxy_addr, proxy_listener),
        ));
    }
    // The three nodes' listeners share this process's file descriptors.
    let defaults = (
        args.layout.node_config(1, &members, &secret),
        ProxyConfig::dev(String::new(), String::new()).limits,
    );
    let caps = fit(
        Caps::of(&defaults.0, Some(&defaults.1)),
        members.len() as u64,
    );
    // The credential for the admin UI's actions: fresh on every start, printed below.
    let admin_token = format!("{:032x}", rand::random::<u128>());
    let mut running = Vec::new();
    // Highest id first: node 1 initialises the cluster and asks the others for votes at once,
    // so it starts last, when they already serve. Otherwise its first requests wait on a
    // node still opening its store, time out, and openraft logs them as errors.
    for ((id, _), (listener, peer_listener, (proxy_addr, proxy_listener))) in
        members.iter().zip(listeners).rev()
    {
        let mut config = args.layout.node_config(*id, &members, &secret);
        let mut proxy_config = ProxyConfig::dev(proxy_addr, store_addr.clone());
        caps.apply(&mut config, Some(&mut proxy_config.limits));
        config.enable_fault_injection = args.enable_fault_injection;
        config.admin_token = Some(admin_token.clone());
        if args.auth {
            config.auth = AuthMode::On;
        }
        let handle =
            lock_core::server::start(config, listener, peer_listener, stopped(stop_rx.clone()))
                .await?;
        let proxy_task = fencegate_proxy::server::start(
            handle.node.clone(),
            &proxy_config,
            proxy_listener,
            stopped(stop_rx.clone()),
        )?;
        running.push((handle, proxy_task));
    }

    let api = &members[&1].api;
    let proxy = format!("127.0.0.1:{}", args.proxy_ports[0]);
    println!(
        "fencegate dev is running (data in {}):",
        args.layout.data_dir.display()
    );
    for (id, addrs) in &members {
        let p = args.proxy_ports[*id as usize - 1];
        println!(
            "  node {id}: API http://{}  proxy http://127.0.0.1:{p}  (peers: {})",
            addrs.api, addrs.peer
        );
    }
    println!("  admin UI: http://{api}/ui   metrics: http://{api}/metrics");
    // With keys on, the curl lines below carry the bootstrap admin key.
    let auth_header = if args.auth {
        println!("  admin key (default tenant; the UI's credential): {admin_token}");
        println!(
            "  lock API authentication: on (every /v1 call needs 'Authorization: Bearer <key>'; \
             make keys with: fencegate keys create --tenant NAME --admin-token {admin_token})"
        );
        println!(
            "  proxy tenants: from the API key (idempotency records, quotas and the locks a \
             write is fenced with are the key's tenant's; an X-Tenant header must name it)"
        );
        format!(" -H 'Authorization: Bearer {admin_token}'")
    } else {
        println!("  admin token (for the UI's operator actions): {admin_token}");
        println!(
            "  lock API authentication: off (any local client may call /v1/locks; \
             start with --auth to require API keys)"
        );
        println!("  proxy tenants: from the X-Tenant header (default demo)");
        String::new()
    };
    println!(
        "  demo store: http://{store_addr}  (GET /kv/KEY, GET /log, POST /orders, \
         GET /orders/by-key/KEY; {store_writes} writes kept in {})",
        journal.display()
    );
    println!();
    println!("Try it: take the lock, write through the proxy with its token, release:");
    println!(
        r#"  curl -s -XPOST http://{api}/v1/locks/kv:demo/acquire{auth_header} -d '{{"request_id":"r1"}}'"#
    );
    println!(
        "  curl -s -XPUT http://{proxy}/kv/demo{auth_header} -H 'Fence-Token: <fencing_token>' -d hello"
    );
    println!(
        r#"  curl -s -XPOST http://{api}/v1/locks/kv:demo/release{auth_header} -d '{{"lease_id":"<lease_id>"}}'"#
    );
    println!("Create an order; repeat the same line and the answer is replayed, not re-run:");
    println!(
        r#"  curl -si -XPOST http://{proxy}/orders{auth_header} -H 'Idempotency-Key: order-1' -d '{{"item":"book"}}'"#
    );
    println!();
    println!("Ctrl-C stops it; restarting with the same --data-dir keeps all state.");
    shutdown_signal().await;
    println!("stopping...");
    let _ = stop_tx.send(true);
    let grace = std::time::Duration::from_secs(2);
    for (handle, proxy_task) in running {
        let _ = tokio::time::timeout(grace, proxy_task).await;
        handle.stopped().await;
    }
    let _ = tokio::time::timeout(grace, store_task).await;
    Ok(())
}

async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    listen::bind(addr)
        .await
        .with_context(|| format!("bind {addr} (is another fencegate running?)"))
}
