//! A worker that holds a lock and writes through the fencing proxy with its token.
//!
//! ```text
//! fencegate dev &                       # 3 nodes on :7001-7003, proxies on :8001-8003
//! cargo run -p lock-core --example worker -- \
//!     --nodes http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003 \
//!     --proxy http://127.0.0.1:8001 --key demo --writes 10 --interval-ms 500
//! curl -s http://127.0.0.1:9000/log     # what landed, with which token
//! ```
//!
//! It acquires `kv:KEY`, then writes `N` values with `PUT {proxy}/kv/KEY`, printing one line
//! per write with its token. Without `--proxy` it just holds the lock for `N` intervals. When
//! the guard turns invalid it prints `lease lost` and stops: a worker must never keep writing
//! on a lease it cannot prove (pause it with `kill -STOP` past the TTL to see it happen).

use std::process::ExitCode;
use std::time::Duration;

use lock_core::client::{AcquireOptions, Client, Error};

struct Args {
    nodes: Vec<String>,
    proxy: Option<String>,
    key: String,
    writes: u64,
    interval: Duration,
    ttl: Duration,
    wait: Duration,
}

const USAGE: &str = "usage: worker --nodes URL[,URL...] [--proxy URL] --key KEY [--writes N] \
                     [--interval-ms MS] [--ttl-ms MS] [--wait-ms MS]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        nodes: Vec::new(),
        proxy: None,
        key: String::new(),
        writes: 10,
        interval: Duration::from_millis(1_000),
        ttl: Duration::from_secs(10),
        wait: Duration::from_secs(30),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let ms = |v: String| {
            v.parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|e| format!("{v}: {e}"))
        };
        match flag.as_str() {
            "--nodes" => {
                args.nodes = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            }
            "--proxy" => args.proxy = Some(value()?.trim_end_matches('/').to_string()),
            "--key" => args.key = value()?,
            "--writes" => args.writes = value()?.parse().map_err(|e| format!("--writes: {e}"))?,
            "--interval-ms" => args.interval = ms(value()?)?,
            "--ttl-ms" => args.ttl = ms(value()?)?,
            "--wait-ms" => args.wait = ms(value()?)?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if args.nodes.is_empty() || args.key.is_empty() {
        return Err(USAGE.into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, Error> {
    let client = Client::new(args.nodes)?;
    let resource = format!("kv:{}", args.key);
    let guard = client
        .acquire(
            &resource,
            AcquireOptions::new(args.ttl)
                .wait_timeout(args.wait)
                .holder(format!("worker-{}", std::process::id())),
        )
        .await?;
    println!("acquired {resource} token {}", guard.token());
    let http = reqwest::Client::new();
    for i in 1..=args.writes {
        if !guard.is_valid() {
            println!("lease lost");
            return Ok(ExitCode::FAILURE);
        }
        match &args.proxy {
            Some(proxy) => {
                let url = format!("{proxy}/kv/{}", args.key);
                let sent = guard
                    .fenced_request(&http, reqwest::Method::PUT, url)
                    .body(format!("write {i} token {}", guard.token()))
                    .send()
                    .await;
                match sent {
                    Ok(resp) => println!("write {i} token {} -> {}", guard.token(), resp.status()),
                    Err(Error::LeaseInvalid(_)) => {
                        println!("lease lost");
                        return Ok(ExitCode::FAILURE);
                    }
                    Err(e) => println!("write {i} token {} -> error: {e}", guard.token()),
                }
            }
            None => println!(
                "holding {resource} token {} ({i}/{})",
                guard.token(),
                args.writes
            ),
        }
        // Sleep between writes, but wake at once if the lease goes.
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            reason = guard.lost() => {
                println!("lease lost ({reason})");
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    let released = guard.release().await?;
    println!("released {resource}: {released}");
    Ok(ExitCode::SUCCESS)
}
