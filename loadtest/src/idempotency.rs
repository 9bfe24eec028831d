//! `fencegate-loadtest idempotency`: create-order traffic with `Idempotency-Key` through the
//! proxies of a running `fencegate dev`, with a share of retried and of concurrent duplicate
//! requests; then the store's log is checked for a second order under any key.
//!
//! Three closed-loop phases of `--duration-s` each, one after the other:
//! 1. `POST /orders` with a key through the proxies (the idempotent route; some requests repeat
//!    an earlier key, some send one new key through two proxies at once);
//! 2. `GET /kv/{key}` through the proxies (a proxied route without idempotency);
//! 3. `POST /orders` straight to the store (no proxy).
//!
//! Reported: p50/p99 of each and what the idempotent route adds, the answers by kind, and
//! duplicates (keys with more than one order in the store): must be 0, else the run fails.
//! Targets 127.0.0.1 only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Deserialize;

use crate::stats::new_hist;

#[derive(Args, Clone, Debug)]
pub struct IdempotencyArgs {
    /// Fencing proxy URLs; requests go round-robin.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8001,http://127.0.0.1:8002,http://127.0.0.1:8003"
    )]
    proxy_target: Vec<String>,
    /// The demo store (for its log, and the phase without the proxy).
    #[arg(long, default_value = "http://127.0.0.1:9000")]
    store: String,
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Length of each of the three phases.
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    /// Share of requests that repeat one of the client's earlier keys (a retry).
    #[arg(long, default_value_t = 0.2)]
    duplicate_share: f64,
    /// Share of new keys sent through two proxies at once.
    #[arg(long, default_value_t = 0.05)]
    concurrent_share: f64,
}

/// An order in the store's log, as far as this check needs it.
#[derive(Deserialize)]
struct Logged {
    #[serde(default)]
    idempotency_key: Option<String>,
}

#[derive(Default)]
struct Tally {
    hist: Option<Histogram<u64>>,
    answers: BTreeMap<String, u64>,
    /// Answers with a 2xx status.
    success: u64,
    /// Requests that got an HTTP answer at all.
    answered: u64,
}

impl Tally {
    fn record(&mut self, took: Duration, answer: String, status: Option<u16>) {
        let hist = self.hist.get_or_insert_with(new_hist);
        let _ = hist.record(took.as_micros().max(1) as u64);
        *self.answers.entry(answer).or_default() += 1;
        if let Some(status) = status {
            self.answered += 1;
            self.success += u64::from((200..300).contains(&status));
        }
    }
}

type Shared = Arc<Mutex<Tally>>;

/// One request; records its latency and a label for its answer. Whether an HTTP answer came.
async fn timed(tally: &Shared, req: reqwest::RequestBuilder) -> bool {
    let started = Instant::now();
    let (answer, status) = match req.send().await {
        Ok(r) => {
            let replayed = r.headers().contains_key("idempotent-replayed");
            let status = r.status().as_u16();
            let _ = r.bytes().await;
            let label = match (status, replayed) {
                (s, true) => format!("{s} replayed"),
                (s, false) => s.to_string(),
            };
            (label, Some(status))
        }
        Err(e) => (format!("transport error: {e}"), None),
    };
    tally
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .record(started.elapsed(), answer, status);
    status.is_some()
}

fn order(http: &reqwest::Client, base: &str, key: &str) -> reqwest::RequestBuilder {
    http.post(format!("{base}/orders"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(format!("{{\"item\":\"{key}\"}}"))
}

/// A client whose request got no answer (nothing listens there) waits this long before the
/// next, so a wrong address is not hammered in a tight loop.
const NO_ANSWER_PAUSE: Duration = Duration::from_millis(100);

/// Runs `clients` loops of `step(client, iteration)` for `duration`; `step` says whether its
/// requests got an answer.
async fn phase<F, Fut>(clients: usize, duration: Duration, step: F) -> anyhow::Result<()>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let step = Arc::new(step);
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let step = step.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while Instant::now() < end {
                if !step(c, i).await {
                    tokio::time::sleep(NO_ANSWER_PAUSE).await;
                }
                i += 1;
            }
        }));
    }
    for t in tasks {
        t.await.context("client task")?;
    }
    Ok(())
}

/// The store's log of orders (`GET /log`).
async fn store_log(http: &reqwest::Client, store: &str) -> anyhow::Result<Vec<Logged>> {
    let url = format!("{store}/log");
    let resp = http
        .get(&url)
        .send()
        .await
        .with_context(|| format!("read the demo store's log at {url}"))?;
    if !resp.status().is_success() {
        bail!(
            "GET {url} answered {}: is --store the demo store of a `fencegate dev`?",
            resp.status()
        );
    }
    resp.json()
        .await
        .with_context(|| format!("GET {url}: not the demo store's log (JSON)"))
}

/// An error if a phase got no successful answer: its latencies would measure a refusal.
fn measured(tally: &Shared, what: &str, should_be: &str) -> anyhow::Result<()> {
    let t = tally.lock().unwrap_or_else(|p| p.into_inner());
    if t.success == 0 {
        bail!(
            "nothing was measured: no request of {what} succeeded (answers: {:?}); is the \
             target the {should_be}?",
            t.answers
        );
    }
    Ok(())
}

pub async fn run(args: IdempotencyArgs) -> anyhow::Result<()> {
    for url in args.proxy_target.iter().chain([&args.store]) {
        if !(url.contains("://127.0.0.1:") || url.contains("://localhost:")) {
            bail!("{url}: the idempotency benchmark only targets 127.0.0.1");
        }
    }
    if args.clients == 0 || args.proxy_target.is_empty() {
        bail!("need at least one client and one proxy");
    }
    if args.duration_s == 0 {
        bail!("--duration-s must be at least 1 (seconds per phase)");
    }
    let shares = [args.duplicate_share, args.concurrent_share];
    if shares.iter().any(|s| !(0.0..=1.0).contains(s)) || shares.iter().sum::<f64>() > 1.0 {
        bail!("--duplicate-share and --concurrent-share must be in [0, 1] and sum to at most 1");
    }
    let http = reqwest::Client::new();
    // The store's log is read at the end; an address that is not the demo store is refused
    // now, not after three phases.
    store_log(&http, &args.store).await?;
    let run_id: u32 = rand::random();
    let duration = Duration::from_secs(args.duration_s);
    let proxies = Arc::new(args.proxy_target.clone());

    let idem = Shared::default();
    {
        let (http, tally, proxies) = (http.clone(), idem.clone(), proxies.clone());
        let (dup, conc) = (args.duplicate_share, args.concurrent_share);
        phase(args.clients, duration, move |c, i| {
            let (http, tally, proxies) = (http.clone(), tally.clone(), proxies.clone());
            async move {
                let via = |n: u64| proxies[(c + n as usize) % proxies.len()].clone();
                let roll: f64 = rand::random();
                if i > 0 && roll < dup {
                    // A retry of one of this client's earlier keys.
                    let earlier = rand::random::<u64>() % i;
                    let key = format!("bench-{run_id}-{c}-{earlier}");
                    timed(&tally, order(&http, &via(i), &key)).await
                } else if roll < dup + conc {
                    // One new key through two proxies at once.
                    let key = format!("bench-{run_id}-{c}-{i}");
                    let (a, b) = tokio::join!(
                        timed(&tally, order(&http, &via(i), &key)),
                        timed(&tally, order(&http, &via(i + 1), &key)),
                    );
                    a && b
                } else {
                    let key = format!("bench-{run_id}-{c}-{i}");
                    timed(&tally, order(&http, &via(i), &key)).await
                }
            }
        })
        .await?;
    }
    measured(
        &idem,
        "POST /orders through the proxies",
        "fencing proxies of a `fencegate dev`",
    )?;

    let plain = Shared::default();
    {
        let (http, tally, proxies) = (http.clone(), plain.clone(), proxies.clone());
        phase(args.clients, duration, move |c, i| {
            let (http, tally, proxies) = (http.clone(), tally.clone(), proxies.clone());
            async move {
                let base = &proxies[(c + i as usize) % proxies.len()];
                timed(&tally, http.get(format!("{base}/kv/bench-{c}"))).await
            }
        })
        .await?;
    }
    // The store has no key bench-{c}: the proxied route answers 404 from the store, and what
    // is measured is that round trip. No answer at all measured nothing.
    if plain.lock().unwrap_or_else(|p| p.into_inner()).answered == 0 {
        bail!("nothing was measured: GET /kv through the proxies got no answer at all");
    }

    let direct = Shared::default();
    {
        let (http, tally, store) = (http.clone(), direct.clone(), args.store.clone());
        phase(args.clients, duration, move |c, i| {
            let (http, tally, store) = (http.clone(), tally.clone(), store.clone());
            async move {
                let key = format!("direct-{run_id}-{c}-{i}");
                timed(&tally, order(&http, &store, &key)).await
            }
        })
        .await?;
    }
    measured(
        &direct,
        "POST /orders straight to the store",
        "demo store (--store)",
    )?;

    let log = store_log(&http, &args.store).await?;
    let prefix = format!("bench-{run_id}-");
    let mut per_key: BTreeMap<String, u64> = BTreeMap::new();
    for entry in log {
        if let Some(k) = entry.idempotency_key.filter(|k| k.starts_with(&prefix)) {
            *per_key.entry(k).or_default() += 1;
        }
    }
    let duplicates: Vec<(&String, &u64)> = per_key.iter().filter(|(_, n)| **n > 1).collect();

    let quantiles = |t: &Shared| {
        let t = t.lock().unwrap_or_else(|p| p.into_inner());
        let (p50, p99) = t.hist.as_ref().map_or((0.0, 0.0), |h| {
            (
                h.value_at_quantile(0.5) as f64 / 1_000.0,
                h.value_at_quantile(0.99) as f64 / 1_000.0,
            )
        });
        (p50, p99, t.answers.clone())
    };
    let (ip50, ip99, answers) = quantiles(&idem);
    let (pp50, pp99, plain_answers) = quantiles(&plain);
    let (dp50, dp99, direct_answers) = quantiles(&direct);
    println!(
        "{} clients, {} s per phase, {} proxies",
        args.clients,
        args.duration_s,
        proxies.len()
    );
    println!("POST /orders with Idempotency-Key via proxy: p50 {ip50:.2} ms, p99 {ip99:.2} ms; answers {answers:?}");
    println!("GET /kv via proxy (no idempotency):          p50 {pp50:.2} ms, p99 {pp99:.2} ms; answers {plain_answers:?}");
    println!("POST /orders straight to the store:          p50 {dp50:.2} ms, p99 {dp99:.2} ms; answers {direct_answers:?}");
    println!(
        "added by the idempotent route over the proxied route without it: p50 {:.2} ms, p99 {:.2} ms",
        ip50 - pp50,
        ip99 - pp99
    );
    println!(
        "keys with an order: {}; duplicates (keys with more than one order): {}",
        per_key.len(),
        duplicates.len()
    );
    if !duplicates.is_empty() {
        for (k, n) in duplicates.iter().take(5) {
            println!("  {k}: {n} orders");
        }
        bail!("a key produced more than one order");
    }
    Ok(())
}
