//! `fencegate`: the node, the embedded local cluster (`dev`) and an operator CLI.

mod cli;
mod demo;
mod dev;
mod node;
mod signal;

use clap::{Parser, Subcommand};

// glibc malloc's arena locks showed up under proxy load (many small, short-lived allocations
// across worker threads); mimalloc's thread-local heaps avoid them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "fencegate",
    version,
    about = "Fenced locks and an enforcing write proxy"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a complete local system: 3 raft nodes, their fencing proxies and the demo store.
    Dev(dev::DevArgs),
    /// Run one production node from a config file (see docs/operations.md).
    Node {
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Run the bundled demo store alone (a key-value store that cannot check tokens).
    DemoStore {
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: String,
    },
    /// Cluster status and membership changes.
    Cluster(cli::ClusterArgs),
    /// Acquire, renew, release or inspect a lock.
    Lock(cli::LockArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                "info,openraft=error,lsm_tree=warn,fjall=warn,fencegate::audit=warn".into()
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match Args::parse().cmd {
        Cmd::Dev(args) => dev::run(args).await,
        Cmd::Node { config } => node::run(&config).await,
        Cmd::DemoStore { listen } => demo::run(&listen).await,
        Cmd::Cluster(args) => cli::cluster(args).await,
        Cmd::Lock(args) => cli::lock(args).await,
    }
}
