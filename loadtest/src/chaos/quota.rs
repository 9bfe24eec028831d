//! The quota workload: clients hammer the proxies' rate-limited route `/limited/{key}` for one
//! tenant, through all three proxies, while the nemesis breaks things; the store records every
//! request that got through, and the quota check ([`super::checker`]) judges that record
//! against R·t + B over every window.
//!
//! The quota is small (R = 10/s, B = 20, leases of 1 s) and the demand far above it (each
//! client offers about 50 requests/s), so the proxies run at their limit all the time. The
//! demand moves: every few seconds another proxy gets most of it, so capacity is rebalanced
//! between proxies during the run, the part of the design where capacity could count twice.
//! With `--unsafe-refill-on-renew` each proxy refills its bucket to its burst share on every
//! lease renewal (about once a lease): some B more per second on top of R, an overshoot the
//! check cannot miss over any window of a few seconds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::task::JoinHandle;

use super::client::Client;
use super::history::{History, QuotaNote};
use crate::cluster::QuotaSetup;

/// The tenant every quota client sends for (`X-Tenant`).
pub const TENANT: &str = "chaos";
/// How long one proxy gets most of the demand before it moves on.
const PHASE: Duration = Duration::from_secs(4);

/// The quota of the run: small, so that the clients exceed it many times over.
pub fn setup(unsafe_refill_on_renew: bool) -> QuotaSetup {
    QuotaSetup {
        rate_per_s: 10,
        burst: 20,
        lease_ms: 1_000,
        unsafe_refill_on_renew,
    }
}

/// Records the quota in the history, for the check (and a later `--recheck`).
pub fn note(hist: &History, q: &QuotaSetup, proxies: usize) {
    let note = QuotaNote {
        rate_per_s: q.rate_per_s,
        burst: q.burst,
        allowance: 0,
        proxies: proxies as u64,
        lease_ms: q.lease_ms,
        unsafe_refill_on_renew: q.unsafe_refill_on_renew,
    };
    hist.note(
        "harness",
        "quota",
        None,
        serde_json::to_value(&note).unwrap_or_else(|_| json!({})),
    );
}

/// `clients` quota clients, each with its own seed, until `stop`.
pub fn spawn(
    client: &Client,
    clients: usize,
    stop: &Arc<AtomicBool>,
    seed: u64,
) -> Vec<JoinHandle<()>> {
    let started = Instant::now();
    (0..clients)
        .map(|i| {
            let (client, stop) = (client.clone(), stop.clone());
            let seed = seed.wrapping_add(2_000 + i as u64);
            tokio::spawn(hammer(client, i, stop, seed, started))
        })
        .collect()
}

/// One client: a request every 10–30 ms, each with a fresh key, mostly to the phase's hot
/// proxy. It never retries: what reached the store is what the check counts.
async fn hammer(client: Client, i: usize, stop: Arc<AtomicBool>, seed: u64, started: Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    let process = format!("q{i}");
    let ids: Vec<u64> = client.nodes.iter().map(|n| n.id).collect();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let phase = (started.elapsed().as_millis() / PHASE.as_millis()) as usize;
        let hot = ids[phase % ids.len().max(1)];
        let node = if rng.random_bool(0.7) {
            hot
        } else {
            ids.choose(&mut rng).copied().unwrap_or(hot)
        };
        n += 1;
        let key = format!("{process}-{n}");
        let _ = client.limited(&process, node, &key, TENANT).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..=30))).await;
    }
}
