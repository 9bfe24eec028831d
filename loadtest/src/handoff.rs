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
    /// Its write through the proxy succeeded (the proxy then held a grant to revoke).
    wrote: bool,
}

/// Errors by count, with the first few for the report (a broken target fails every call:
/// keeping them all would grow without bound).
#[derive(Default)]
struct Errors {
    count: u64,
    first: Vec<String>,
}

impl Errors {
    /// Counts `e` if `counts`; keeps it as an example while there are few.
    fn push(errors: &Mutex<Errors>, e: String, counts: bool) {
        let mut errors = errors.lock().unwrap_or_else(|p| p.into_inner());
        errors.count += u64::from(counts);
        if errors.first.len() < 5 && (counts || errors.first.is_empty()) {
            errors.first.push(e);
        }
    }
}

/// A client that fails waits before it tries again, doubling up to this: a target that is
/// not a fencegate API answers at once, and the loop must not turn into a flood.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

pub async fn run(args: HandoffArgs) -> anyhow::Result<()> {
    for url in args.target.iter().chain(&args.proxy_target) {
        if !(url.contains("://127.0.0.1:") || url.contains("://localhost:")) {
            bail!("{url}: the hand-off benchmark only targets 127.0.0.1");
        }
    }
    if args.clients == 0 || args.proxy_target.is_empty() {
        bail!("need at least one client and one proxy");
    }
    if args.duration_s == 0 || args.max_cycles == 0 {
        bail!("--duration-s and --max-cycles must be at least 1");
    }
    let client = Client::new(args.target.clone()).context("lock client")?;
    let http = reqwest::Client::new();
    let resource = format!("kv:{}", args.key);
    let turns = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Errors::default()));
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
            let mut backoff = Duration::ZERO;
            while Instant::now() < end
                && cycles.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < max
            {
                if !backoff.is_zero() {
                    let left = end.saturating_duration_since(Instant::now());
                    tokio::time::sleep(backoff.min(left)).await;
                }
                let left = end.saturating_duration_since(Instant::now());
                let opts = AcquireOptions::new(Duration::from_secs(10))
                    .wait_timeout(left.max(Duration::from_millis(1)))
                    .holder(format!("handoff-{i}"));
                // The client retries an unclear answer for up to its call timeout; the run's
                // end bounds it here.
                let acquired = tokio::time::timeout(left, client.acquire(&resource, opts)).await;
                let guard = match acquired {
                    Ok(Ok(g)) => g,
                    Ok(Err(e)) => {
                        // A waiter the run's end cut off is no error; but the reason of a
                        // target that never granted anything is kept.
                        Errors::push(&errors, format!("acquire: {e}"), Instant::now() < end);
                        backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_BACKOFF);
                        continue;
                    }
                    Err(_) => break,
                };
                let granted = Instant::now();
                let token = guard.token();
                let wrote = match guard
                    .fenced_request(&http, reqwest::Method::PUT, &url)
                    .body(format!("client {i} token {token}"))
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => true,
                    Ok(r) => {
                        Errors::push(
                            &errors,
                            format!("write with token {token}: {}", r.status()),
                            true,
                        );
                        false
                    }
                    Err(e) => {
                        Errors::push(&errors, format!("write with token {token}: {e}"), true);
                        false
                    }
                };
                let release_sent = Instant::now();
                if let Err(e) = guard.release().await {
                    Errors::push(&errors, format!("release: {e}"), true);
                }
                backoff = if wrote {
                    Duration::ZERO
                } else {
                    (backoff * 2).clamp(Duration::from_millis(10), MAX_BACKOFF)
                };
                turns.lock().unwrap_or_else(|p| p.into_inner()).push(Turn {
                    token,
                    granted,
                    release_sent,
                    wrote,
                });
            }
        }));
    }
    for t in tasks {
        t.await.context("client task")?;
    }
    let elapsed = started.elapsed();
    let mut turns = turns.lock().unwrap_or_else(|p| p.into_inner()).clone();
    turns.sort_by_key(|t| t.token);
    // A hand-off is measured from a holder whose write went through the proxy (so its release
    // had a grant to revoke) to the next grant.
    let mut hist = new_hist();
    for pair in turns.windows(2).filter(|p| p[0].wrote) {
        let gap = pair[1]
            .granted
            .saturating_duration_since(pair[0].release_sent);
        hist.record(gap.as_micros().max(1) as u64)?;
    }
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(|p| p.into_inner()));
    // Counted as before: each grant is the lock passing to a holder.
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
    println!("errors: {}", errors.count);
    for e in &errors.first {
        println!("  {e}");
    }
    if hist.is_empty() {
        bail!(
            "nothing was measured: no hand-off after a write through the proxy ({} grants, {} \
             writes through the proxy, {} errors). Is --target a fencegate API and \
             --proxy-target its fencing proxies?",
            turns.len(),
            turns.iter().filter(|t| t.wrote).count(),
            errors.count
        );
    }
    Ok(())
}
