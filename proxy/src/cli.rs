//! Operator CLI verbs: thin HTTP calls to any node, printing the JSON answer.

use anyhow::Context;
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Any node's API address.
    #[arg(long, default_value = "127.0.0.1:7001", global = true)]
    node: String,
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
    /// Any node's API address.
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
        lease_id: String,
    },
    Release {
        resource: String,
        #[arg(long)]
        lease_id: String,
    },
    Status {
        resource: String,
    },
}

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let mut req = client.request(method, &url);
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
            call(
                reqwest::Method::POST,
                format!("{base}/v1/cluster/members/add"),
                Some(body),
            )
            .await
        }
        ClusterCmd::Remove { id } => {
            let body = json!({ "node_id": id });
            call(
                reqwest::Method::POST,
                format!("{base}/v1/cluster/members/remove"),
                Some(body),
            )
            .await
        }
    }
}

pub async fn lock(args: LockArgs) -> anyhow::Result<()> {
    let base = format!("http://{}/v1/locks", args.node);
    match args.cmd {
        LockCmd::Acquire {
            resource,
            request_id,
            holder,
            ttl_ms,
            wait_timeout_ms,
        } => {
            let request_id = request_id.unwrap_or_else(|| format!("cli-{:032x}", rand_id()));
            let mut body = json!({ "request_id": request_id });
            if let Some(h) = holder {
                body["holder"] = json!(h);
            }
            if let Some(t) = ttl_ms {
                body["ttl_ms"] = json!(t);
            }
            if let Some(w) = wait_timeout_ms {
                body["wait_timeout_ms"] = json!(w);
            }
            let url = format!("{base}/{}/acquire", path_segment(&resource));
            call(reqwest::Method::POST, url, Some(body)).await
        }
        LockCmd::Renew { resource, lease_id } => {
            let url = format!("{base}/{}/renew", path_segment(&resource));
            call(
                reqwest::Method::POST,
                url,
                Some(json!({ "lease_id": lease_id })),
            )
            .await
        }
        LockCmd::Release { resource, lease_id } => {
            let url = format!("{base}/{}/release", path_segment(&resource));
            call(
                reqwest::Method::POST,
                url,
                Some(json!({ "lease_id": lease_id })),
            )
            .await
        }
        LockCmd::Status { resource } => {
            let url = format!("{base}/{}", path_segment(&resource));
            call(reqwest::Method::GET, url, None).await
        }
    }
}

fn rand_id() -> u128 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    nanos ^ (u128::from(std::process::id()) << 64)
}
