//! `fencegate-loadtest quota`: how much of a global rate limit a tenant gets while its demand
//! moves between proxies, and whether the proxies together ever admit more than allowed.
//!
//! ```text
//! fencegate-loadtest quota --out /tmp/quota        # R = 100/s, B = 200, 300/s offered
//! ```
//!
//! Starts three `fencegate node` processes with proxies and the demo store (no faults), with a
//! quota on `/limited/{key}`. Two phases of `--phase-s` each, open loop at `--offered-per-s`
//! for one tenant: phase 1 sends everything through proxy 1, phase 2 everything through
//! proxy 3 — the capacity proxy 1 holds must move to proxy 3.
//!
//! Reported: per second, admitted requests per proxy and refusals; per phase, utilisation
//! (admitted / (R·t + B)) and the time until the hot proxy admits 90 % of R (convergence);
//! overall, the worst window against R·t + B (overshoot, must be 0: the run fails otherwise).
//! With `--out`: `quota.json` (summary and per-second series) and `quota.svg`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use crate::cluster::process::find_fencegate_bin;
use crate::cluster::{ClusterSpec, LocalCluster, ProxySpec, QuotaSetup};
use crate::config::prepare_out;
use crate::plot::{self, Series};
use crate::quota_window::{self, Admitted};
use crate::report::write_file;
use crate::stats::Event;

#[derive(Args, Clone, Debug)]
pub struct QuotaArgs {
    /// Global refill rate R (requests/s per tenant).
    #[arg(long, default_value_t = 100)]
    rate_per_s: u64,
    /// Global burst B.
    #[arg(long, default_value_t = 200)]
    burst: u64,
    #[arg(long, default_value_t = 2_000)]
    lease_ms: u64,
    /// Requests per second offered (open loop), all through the phase's proxy.
    #[arg(long, default_value_t = 300)]
    offered_per_s: u64,
    /// Length of each of the two phases.
    #[arg(long, default_value_t = 20)]
    phase_s: u64,
    /// Write quota.json and quota.svg here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The `fencegate` binary (default: next to this binary, then target/release, then
    /// target/debug, then PATH).
    #[arg(long)]
    fencegate_bin: Option<PathBuf>,
}

/// One request's fate, times in seconds since the load started.
#[derive(Clone, Copy, Debug)]
struct Sample {
    sent: f64,
    done: f64,
    proxy: usize,
    admitted: bool,
}

/// One second of the run.
#[derive(Clone, Debug, Serialize)]
pub struct QuotaSecond {
    pub t: u64,
    /// Admitted requests, by proxy (node 1, 2, 3).
    pub admitted: Vec<u64>,
    pub rejected: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PhaseReport {
    /// The proxy (node id) all demand went through.
    pub proxy: u64,
    pub admitted: u64,
    /// R·t + B over the phase.
    pub allowed: f64,
    pub utilisation: f64,
    /// Seconds from the phase's start until the proxy first admitted 90 % of R in one second.
    pub convergence_s: Option<u64>,
    /// Admitted / (R·t) from convergence to the phase's end.
    pub utilisation_after_convergence: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct QuotaReport {
    pub rate_per_s: u64,
    pub burst: u64,
    pub lease_ms: u64,
    pub offered_per_s: u64,
    pub phase_s: u64,
    pub phases: Vec<PhaseReport>,
    /// The worst window: admitted above R·t + B (≤ 0 means within the bound).
    pub worst_window_excess: f64,
    pub worst_window_s: f64,
    pub worst_window_admitted: u64,
    pub overshoot: f64,
    pub seconds: Vec<QuotaSecond>,
}

impl QuotaArgs {
    fn validate(&self) -> anyhow::Result<()> {
        if self.rate_per_s == 0 || self.offered_per_s == 0 || self.lease_ms == 0 {
            bail!("--rate-per-s, --offered-per-s and --lease-ms must be positive");
        }
        if self.phase_s == 0 {
            bail!("--phase-s must be at least 1 (seconds per phase)");
        }
        Ok(())
    }
}

pub async fn run(args: QuotaArgs) -> anyhow::Result<()> {
    args.validate()?;
    if let Some(dir) = &args.out {
        prepare_out(dir)?;
    }
    let bin = find_fencegate_bin(args.fencegate_bin.as_deref())?;
    let spec = ClusterSpec {
        tmp_prefix: "fencegate-quota-",
        log_env: "FENCEGATE_QUOTA_NODE_LOG",
        proxies: Some(ProxySpec {
            quota: Some(QuotaSetup {
                rate_per_s: args.rate_per_s,
                burst: args.burst,
                lease_ms: args.lease_ms,
                unsafe_refill_on_renew: false,
            }),
            ..ProxySpec::LOAD
        }),
        fault_injection: false,
    };
    let (cluster, _) = LocalCluster::start_ready(bin, None, spec, Duration::from_secs(60)).await?;
    let proxies = cluster.proxy_urls();
    if proxies.len() < 3 {
        bail!("the quota scenario needs three proxies");
    }
    eprintln!(
        "quota: R = {}/s, B = {}, lease {} ms; {}/s offered via proxy 1 for {} s, then via proxy 3",
        args.rate_per_s, args.burst, args.lease_ms, args.offered_per_s, args.phase_s
    );
    let samples = drive(&args, &proxies).await?;
    drop(cluster);
    let report = analyse(&args, &samples);
    print(&report);
    if let Some(dir) = &args.out {
        write_file(&dir.join("quota.json"), serde_json::to_vec_pretty(&report)?)?;
        let svg = dir.join("quota.svg");
        draw(&report, &svg).with_context(|| format!("write {}", svg.display()))?;
        eprintln!("quota: wrote {}/quota.json and quota.svg", dir.display());
    }
    if samples.iter().all(|s| !s.admitted) {
        bail!(
            "nothing was measured: the proxies admitted none of {} requests (see the nodes' logs)",
            samples.len()
        );
    }
    if report.overshoot > 0.0 {
        bail!(
            "the proxies admitted {} requests in {:.2} s, {:.1} above R·t + B",
            report.worst_window_admitted,
            report.worst_window_s,
            report.overshoot
        );
    }
    Ok(())
}

/// The two phases, open loop: each request in its own task, so slow answers never lower the
/// offered rate.
async fn drive(args: &QuotaArgs, proxies: &[String]) -> anyhow::Result<Vec<Sample>> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(64)
        .build()?;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let every = Duration::from_secs_f64(1.0 / args.offered_per_s.max(1) as f64);
    let total = Duration::from_secs(args.phase_s * 2);
    let mut tasks = Vec::new();
    let mut n = 0u64;
    loop {
        let at = every * n as u32;
        if at >= total {
            break;
        }
        tokio::time::sleep_until((started + at).into()).await;
        let proxy = if at.as_secs() < args.phase_s { 0 } else { 2 };
        let url = format!("{}/limited/b{n}", proxies[proxy]);
        let (http, samples) = (http.clone(), samples.clone());
        tasks.push(tokio::spawn(async move {
            let sent = started.elapsed().as_secs_f64();
            let admitted = http
                .get(url)
                .header("X-Tenant", "bench")
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            let done = started.elapsed().as_secs_f64();
            samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Sample {
                    sent,
                    done,
                    proxy,
                    admitted,
                });
        }));
        n += 1;
    }
    for t in tasks {
        let _ = t.await;
    }
    let out = samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(out)
}

fn analyse(args: &QuotaArgs, samples: &[Sample]) -> QuotaReport {
    let (r, b) = (args.rate_per_s, args.burst);
    let secs = args.phase_s * 2;
    let mut seconds: Vec<QuotaSecond> = (0..secs)
        .map(|t| QuotaSecond {
            t,
            admitted: vec![0; 3],
            rejected: 0,
        })
        .collect();
    for s in samples {
        let Some(sec) = seconds.get_mut(s.sent as usize) else {
            continue;
        };
        if s.admitted {
            sec.admitted[s.proxy] += 1;
        } else {
            sec.rejected += 1;
        }
    }
    let phases = [(0usize, 0u64), (2, args.phase_s)]
        .iter()
        .map(|&(proxy, from)| {
            let range = &seconds[from as usize..(from + args.phase_s) as usize];
            let admitted: u64 = range.iter().map(|s| s.admitted.iter().sum::<u64>()).sum();
            let allowed = (r * args.phase_s + b) as f64;
            let convergence = range
                .iter()
                .position(|s| s.admitted[proxy] as f64 >= 0.9 * r as f64);
            let after = convergence.filter(|&c| c + 1 < range.len()).map(|c| {
                let rest = &range[c..];
                let n: u64 = rest.iter().map(|s| s.admitted.iter().sum::<u64>()).sum();
                n as f64 / (r * rest.len() as u64) as f64
            });
            PhaseReport {
                proxy: proxy as u64 + 1,
                admitted,
                allowed,
                utilisation: admitted as f64 / allowed,
                convergence_s: convergence.map(|c| c as u64),
                utilisation_after_convergence: after,
            }
        })
        .collect();
    let admitted: Vec<Admitted> = samples
        .iter()
        .filter(|s| s.admitted)
        .map(|s| Admitted {
            sent: s.sent * 1000.0,
            at: s.done * 1000.0,
        })
        .collect();
    let worst = quota_window::worst(&admitted, |span| quota_window::bound(r, b, 0, span));
    let (excess, span, count) = worst.map_or((f64::NEG_INFINITY, 0.0, 0), |w| {
        (w.excess(), (w.to - w.from) / 1000.0, w.count)
    });
    QuotaReport {
        rate_per_s: r,
        burst: b,
        lease_ms: args.lease_ms,
        offered_per_s: args.offered_per_s,
        phase_s: args.phase_s,
        phases,
        worst_window_excess: excess,
        worst_window_s: span,
        worst_window_admitted: count,
        overshoot: excess.max(0.0),
        seconds,
    }
}

fn print(r: &QuotaReport) {
    println!();
    println!(
        "quota: R = {}/s, B = {}, lease {} ms, {}/s offered",
        r.rate_per_s, r.burst, r.lease_ms, r.offered_per_s
    );
    for (i, p) in r.phases.iter().enumerate() {
        println!(
            "  phase {} (all via proxy {}): admitted {} of R·t + B = {:.0} ({:.0} %), \
             converged after {}, then {} of R",
            i + 1,
            p.proxy,
            p.admitted,
            p.allowed,
            p.utilisation * 100.0,
            p.convergence_s
                .map_or("never".to_string(), |s| format!("{s} s")),
            p.utilisation_after_convergence
                .map_or("—".to_string(), |u| format!("{:.0} %", u * 100.0)),
        );
    }
    println!(
        "  worst window: {} admitted in {:.2} s, {:.1} {} R·t + B; overshoot {:.1}",
        r.worst_window_admitted,
        r.worst_window_s,
        r.worst_window_excess.abs(),
        if r.worst_window_excess > 0.0 {
            "above"
        } else {
            "below"
        },
        r.overshoot
    );
    let line: Vec<String> = r
        .seconds
        .iter()
        .map(|s| format!("{}", s.admitted.iter().sum::<u64>()))
        .collect();
    println!("  admitted per second: {}", line.join(" "));
}

fn draw(r: &QuotaReport, path: &std::path::Path) -> anyhow::Result<()> {
    let per_proxy = |i: usize| Series {
        label: format!("admitted via proxy {}", i + 1),
        points: r
            .seconds
            .iter()
            .map(|s| (s.t as f64 + 0.5, s.admitted[i] as f64))
            .collect(),
    };
    let end = r.seconds.len() as f64;
    let series = vec![
        per_proxy(0),
        per_proxy(2),
        Series {
            label: "R".into(),
            points: vec![(0.0, r.rate_per_s as f64), (end, r.rate_per_s as f64)],
        },
    ];
    let events = vec![Event {
        t_s: r.phase_s as f64,
        what: "demand moves to proxy 3".into(),
    }];
    plot::timeline(
        path,
        &format!(
            "quota R = {}/s, B = {}, lease {} ms: admitted per second",
            r.rate_per_s, r.burst, r.lease_ms
        ),
        "requests/s",
        &series,
        &events,
        false,
    )
}
