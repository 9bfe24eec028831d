//! `fencegate-loadtest handoff`: how fast one hot lock passes between holders that write
//! through the fencing proxy.
//!
//! Each client loops: acquire the resource (waiting in its FIFO queue), write once through a
//! proxy with the token, release. Every write makes the proxy hold an admission grant for the
//! token, so every release has a grant to revoke: this measures the hand-off path, not just the
//! lock. Reported: hand-offs per second, and the hand-off latency — from the moment a holder
//! sent its release to the moment the next holder was granted (matched by token order).
//! Bounded by `--duration-s` and `--max-cycles`; targets 127.0.0.1 only.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use lock_core::client::{AcquireOptions, Client};

use crate::stats::new_hist;

#[derive(Args, Clone, Debug)]
pub struct HandoffArgs {
    /// API URLs of a running cluster (default: `fencegate dev`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003"
    )]
    target: Vec<String>,
    /// Fencing proxy URLs; client i writes through proxy i mod n.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8001,http://127.0.0.1:8002,http://127.0.0.1:8003"
    )]
    proxy_target: Vec<String>,
    /// The contended resource (the `fencegate dev` route `/kv/{key}` fences `kv:{key}`).
    #[arg(long, default_value = "handoff")]
    key: String,
    /// Clients contending for the lock.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    #[arg(long, default_value_t = 15)]
    duration_s: u64,
    /// Stop after this many hand-offs in total.
    #[arg(long, default_value_t = 100_000)]
    max_cycles: u64,
}

/// One holder's turn: when it was granted and when it sent its release.
#[derive(Clone, Copy)]
struct Turn {
    token: u64,
    granted: Instant,
    release_sent: Instant,
}

pub async fn run(args: HandoffArgs) -> anyhow::Result<()> {
    for url in args.target.iter().chain(&args.proxy_target) {
        if !(url.contains("://127.0.0.1:") || url.contains("://localhost:")) {
            bail!("{url}: the hand-off benchmark only targets 127.0.0.1");
        }
    }
    if args.clients == 0 || args.proxy_target.is_empty() {
        bail!("need at least one client and one proxy");
    }
    let client = Client::new(args.target.clone()).context("lock client")?;
    let http = reqwest::Client::new();
    let resource = format!("kv:{}", args.key);
    let turns = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let end = started + Duration::from_secs(args.duration_s);
    let cycles = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let (client, http, resource, turns, errors, cycles) = (
            client.clone(),
            http.clone(),
            resource.clone(),
            turns.clone(),
            errors.clone(),
            cycles.clone(),
        );
        let url = format!(
            "{}/kv/{}",
            args.proxy_target[i % args.proxy_target.len()],
            args.key
        );
        let max = args.max_cycles;
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end
                && cycles.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < max
            {
                let left = end.saturating_duration_since(Instant::now());
                let opts = AcquireOptions::new(Duration::from_secs(10))
                    .wait_timeout(left.max(Duration::from_millis(1)))
                    .holder(format!("handoff-{i}"));
                let guard = match client.acquire(&resource, opts).await {
                    Ok(g) => g,
                    Err(e) => {
                        if Instant::now() < end {
                            errors.lock().expect("errors").push(format!("acquire: {e}"));
                        }
                        continue;
                    }
                };
                let granted = Instant::now();
                let token = guard.token();
                match guard
                    .fenced_request(&http, reqwest::Method::PUT, &url)
                    .body(format!("client {i} token {token}"))
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => {}
                    Ok(r) => errors
                        .lock()
                        .expect("errors")
                        .push(format!("write with token {token}: {}", r.status())),
                    Err(e) => errors
                        .lock()
                        .expect("errors")
                        .push(format!("write with token {token}: {e}")),
                }
                let release_sent = Instant::now();
                if let Err(e) = guard.release().await {
                    errors.lock().expect("errors").push(format!("release: {e}"));
                }
                turns.lock().expect("turns").push(Turn {
                    token,
                    granted,
                    release_sent,
                });
            }
        }));
    }
    for t in tasks {
        t.await.context("client task")?;
    }
    let elapsed = started.elapsed();
    let mut turns = turns.lock().expect("turns").clone();
    turns.sort_by_key(|t| t.token);
    let mut hist = new_hist();
    for pair in turns.windows(2) {
        let gap = pair[1]
            .granted
            .saturating_duration_since(pair[0].release_sent);
        hist.record(gap.as_micros().max(1) as u64)?;
    }
    let errors = errors.lock().expect("errors").clone();
    println!(
        "hand-offs: {} in {:.1} s = {:.1}/s with {} clients writing through {} proxies",
        turns.len(),
        elapsed.as_secs_f64(),
        turns.len() as f64 / elapsed.as_secs_f64(),
        args.clients,
        args.proxy_target.len()
    );
    if !hist.is_empty() {
        let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1_000.0;
        println!(
            "hand-off latency (release sent → next grant): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(0.5),
            ms(0.99),
            hist.max() as f64 / 1_000.0
        );
    }
    println!("errors: {}", errors.len());
    for e in errors.iter().take(5) {
        println!("  {e}");
    }
    Ok(())
}
