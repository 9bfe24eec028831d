//! Operator CLI verbs: thin HTTP calls to any node, printing the JSON answer.

use std::time::Duration;

use anyhow::Context;
use lock_core::client::{AcquireOptions, Client};
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Any node's API address.
    #[arg(long, default_value = "127.0.0.1:7001", global = true)]
    node: String,
    /// The admin credential (`admin_token` in the node config; `fencegate dev` prints it):
    /// membership changes need it on a node that has one.
    #[arg(long, global = true)]
    admin_token: Option<String>,
    #[command(subcommand)]
    cmd: ClusterCmd,
}

#[derive(clap::Subcommand)]
enum ClusterCmd {
    /// Leader, term, members, log and lock counts.
    Status,
    /// Add a node (learner first, then voter once it caught up).
    Add {
        #[arg(long)]
        id: u64,
        #[arg(long)]
        addr: String,
    },
    /// Remove a voter.
    Remove {
        #[arg(long)]
        id: u64,
    },
}

#[derive(clap::Args)]
pub struct LockArgs {
    /// Node API addresses, comma-separated (any node serves any call).
    #[arg(long, default_value = "127.0.0.1:7001", global = true)]
    node: String,
    #[command(subcommand)]
    cmd: LockCmd,
}

#[derive(clap::Subcommand)]
enum LockCmd {
    Acquire {
        resource: String,
        /// Reuse the same id when retrying the same logical acquire.
        #[arg(long)]
        request_id: Option<String>,
        #[arg(long)]
        holder: Option<String>,
        #[arg(long)]
        ttl_ms: Option<u64>,
        #[arg(long)]
        wait_timeout_ms: Option<u64>,
    },
    Renew {
        resource: String,
        #[arg(long)]
        lease_id: lock_core::wire::LeaseId,
    },
    Release {
        resource: String,
        #[arg(long)]
        lease_id: lock_core::wire::LeaseId,
    },
    Status {
        resource: String,
    },
}

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> anyhow::Result<()> {
    call_as(method, url, body, None).await
}

async fn call_as(
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
    admin_token: Option<&str>,
) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let mut req = client.request(method, &url);
    if let Some(token) = admin_token {
        req = req.bearer_auth(token);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.with_context(|| format!("request {url}"))?;
    let status = resp.status();
    let text = resp.text().await?;
    let pretty = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(text);
    println!("{pretty}");
    anyhow::ensure!(status.is_success(), "HTTP {status}");
    Ok(())
}

fn path_segment(resource: &str) -> String {
    // Resources are [A-Za-z0-9._:/-]; none of those needs escaping in a path. Anything else is
    // sent as-is and the server answers 400.
    resource.to_string()
}

pub async fn cluster(args: ClusterArgs) -> anyhow::Result<()> {
    let base = format!("http://{}", args.node);
    match args.cmd {
        ClusterCmd::Status => call(reqwest::Method::GET, format!("{base}/v1/cluster"), None).await,
        ClusterCmd::Add { id, addr } => {
            let body = json!({ "node_id": id, "addr": addr });
            call_as(
                reqwest::Method::POST,
                format!("{base}/v1/cluster/members/add"),
                Some(body),
                args.admin_token.as_deref(),
            )
            .await
        }
        ClusterCmd::Remove { id } => {
            let body = json!({ "node_id": id });
            call_as(
                reqwest::Method::POST,
                format!("{base}/v1/cluster/members/remove"),
                Some(body),
                args.admin_token.as_deref(),
            )
            .await
        }
    }
}

/// `--node` may list several nodes (`a:7001,b:7002`); the client moves between them on
/// connection errors and `503`s. Bare `host:port` means `http://host:port`.
fn node_urls(node: &str) -> Vec<String> {
    node.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            if n.starts_with("http://") || n.starts_with("https://") {
                n.to_string()
            } else {
                format!("http://{n}")
            }
        })
        .collect()
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub async fn lock(args: LockArgs) -> anyhow::Result<()> {
    let nodes = node_urls(&args.node);
    let client = || Client::new(nodes.clone()).context("lock client");
    match args.cmd {
        LockCmd::Acquire {
            resource,
            request_id,
            holder,
            ttl_ms,
            wait_timeout_ms,
        } => {
            let mut opts = AcquireOptions::default();
            opts.ttl = ttl_ms.map(Duration::from_millis);
            opts.wait_timeout = Duration::from_millis(wait_timeout_ms.unwrap_or(0));
            opts.holder = holder;
            opts.request_id = request_id;
            let guard = client()?.acquire(&resource, opts).await?;
            // The CLI exits right away: keep the lease (no renewal, no release) and print it,
            // so `lock renew` / `lock release` can use its id.
            print_json(&guard.detach())
        }
        LockCmd::Renew { resource, lease_id } => {
            print_json(&client()?.renew(&resource, lease_id).await?)
        }
        LockCmd::Release { resource, lease_id } => {
            let released = client()?.release(&resource, lease_id).await?;
            print_json(&json!({ "released": released }))
        }
        LockCmd::Status { resource } => {
            let base = nodes.first().context("--node is empty")?;
            let url = format!("{base}/v1/locks/{}", path_segment(&resource));
            call(reqwest::Method::GET, url, None).await
        }
    }
}
