//! `fencegate-loadtest timer-lateness`: how late the open loop's requests go out against
//! their schedule, with tokio's timer and with the harness's own ([`crate::timer`]).
//!
//! ```text
//! fencegate-loadtest timer-lateness                        # 4,000 sends at 2,000/s per timer
//! fencegate-loadtest timer-lateness --rate 500 --count 1000
//! ```
//!
//! The open loop's pattern without a cluster: one arrival loop sleeps until each slot of an
//! evenly spaced schedule and starts a task per send; the task takes one of `--connections`
//! keep-alive connections (the harness's own HTTP/1.1 client) to a trivial responder on
//! 127.0.0.1 and sends. Reported per timer, p50 / p99 / max: how late the arrival loop woke,
//! and how late the request went out — the part of a run's `harness_wait` that is the
//! harness's alone. It is a measurement, not a test: the numbers depend on the machine and on
//! what else runs on it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use hyper::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::backend::http1::ConnPool;
use crate::cluster::process::process_cpu_s;
use crate::stats::{new_hist, quantiles_ms};

#[derive(Args, Clone, Debug)]
pub struct LatenessArgs {
    /// Sends per second (evenly spaced).
    #[arg(long, default_value_t = 2_000.0)]
    rate: f64,
    /// Sends per timer.
    #[arg(long, default_value_t = 4_000)]
    count: u64,
    /// Keep-alive connections to the responder.
    #[arg(long, default_value_t = 16)]
    connections: usize,
}

/// Which sleep the arrival loop uses.
#[derive(Clone, Copy)]
enum Sleep {
    Tokio,
    Harness,
}

impl Sleep {
    fn name(self) -> &'static str {
        match self {
            Sleep::Tokio => "tokio::time::sleep_until",
            Sleep::Harness => "harness timer (timer.rs)",
        }
    }

    async fn until(self, at: Instant) {
        match self {
            Sleep::Tokio => tokio::time::sleep_until(at.into()).await,
            Sleep::Harness => crate::timer::sleep_until(at).await,
        }
    }
}

/// Lateness of one timer's run, in µs.
struct Lateness {
    woke: Histogram<u64>,
    sent: Histogram<u64>,
    failed: u64,
}

pub async fn run(args: LatenessArgs) -> anyhow::Result<()> {
    if !(args.rate >= 1.0 && args.rate <= 100_000.0) {
        bail!("--rate must be in [1, 100000] sends per second");
    }
    if args.count == 0 || args.connections == 0 {
        bail!("--count and --connections must be at least 1");
    }
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind 127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(respond(listener));
    println!(
        "timer lateness: {} sends at {}/s per timer over {} connections to a responder on {addr}",
        args.count, args.rate, args.connections
    );
    for sleep in [Sleep::Tokio, Sleep::Harness] {
        let cpu = process_cpu_s();
        let l = measure(sleep, &args, &format!("http://{addr}")).await?;
        // The responder's share included: the same for both timers.
        let cpu_ms = (process_cpu_s() - cpu) * 1000.0;
        let [w50, _, w99, wmax] = quantiles_ms(&l.woke);
        let [s50, _, s99, smax] = quantiles_ms(&l.sent);
        println!(
            "  {:<26} woke late p50 {w50:.3} / p99 {w99:.3} / max {wmax:.3} ms · sent late \
             p50 {s50:.3} / p99 {s99:.3} / max {smax:.3} ms · CPU {cpu_ms:.0} ms",
            sleep.name()
        );
        if l.failed > 0 {
            bail!("{} of {} sends got no answer", l.failed, args.count);
        }
    }
    server.abort();
    Ok(())
}

/// One run of the schedule with `sleep`.
async fn measure(sleep: Sleep, args: &LatenessArgs, base: &str) -> anyhow::Result<Lateness> {
    let pool = Arc::new(ConnPool::new(
        base,
        Duration::from_secs(1),
        Duration::from_secs(5),
    )?);
    let req = pool
        .request(Method::GET, "/", [], Bytes::new())
        .context("request")?;
    let permits = Arc::new(Semaphore::new(args.connections));
    let sent = Arc::new(Mutex::new(new_hist()));
    let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut woke = new_hist();
    let gap = Duration::from_secs_f64(1.0 / args.rate);
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::with_capacity(args.count as usize);
    for n in 0..args.count {
        let at = start + gap.mul_f64(n as f64);
        sleep.until(at).await;
        let _ = woke.record(micros(Instant::now() - at));
        let (pool, req, permits, sent, failed) = (
            pool.clone(),
            req.clone(),
            permits.clone(),
            sent.clone(),
            failed.clone(),
        );
        tasks.push(tokio::spawn(async move {
            // Semaphores are never closed here.
            let _permit = permits.acquire().await.ok();
            let late = Instant::now() - at;
            let _ = sent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(micros(late));
            if pool.send(req).await.is_err() {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.context("send task")?;
    }
    let sent = std::mem::replace(
        &mut *sent.lock().unwrap_or_else(|e| e.into_inner()),
        new_hist(),
    );
    Ok(Lateness {
        woke,
        sent,
        failed: failed.load(std::sync::atomic::Ordering::Relaxed),
    })
}

fn micros(d: Duration) -> u64 {
    d.as_micros().max(1) as u64
}

/// A responder that answers every request head with an empty 200, on kept-alive
/// connections.
async fn respond(listener: TcpListener) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            loop {
                let n = match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                // The requests carry no body: each head ends a request.
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}
