//! The clients: honest workers and zombies.
//!
//! A **worker** loops: acquire a contended key (try-once or waiting in the FIFO queue) →
//! write a unique value tagged with its token through a random node's proxy → maybe renew and
//! write again → release (or, sometimes, walk away and let the lease expire). It follows the
//! client rule of docs/client.md: it writes only while its lease is valid by its *own* clock,
//! measured from when it sent the request. Every ambiguous answer is retried on a random node
//! — an acquire with the same `request_id`, so a retry after a lost response must return the
//! original lease (invariant 5). Now and then a worker takes a long lease on a private
//! resource and never releases it, so the final state has live leases to account for
//! (invariant 4).
//!
//! A **zombie** acquires with a short TTL, writes once, then stalls past its lease (a GC
//! pause, a VM migration) — and keeps stalling until the store shows that a newer holder's
//! write has landed on its key. Then it sends its delayed write with the old token, sometimes
//! also a write to another key with that token (a token not issued for that resource), and a
//! stale release. With fencing every one of these must be refused; with
//! `--unsafe-no-fencing` the delayed write lands after the newer one: a lost update the
//! checker must report (invariant 3).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::wire::LeaseId;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::client::{Client, Outcome};
use super::history::{token_in_value, written_value, WriteRole};

/// What the clients share.
pub struct Workload {
    pub client: Client,
    /// The contended keys (resource `kv:{key}` through the proxy route).
    pub keys: Vec<String>,
    pub stop: Arc<AtomicBool>,
}

/// A lease as a client knows it.
struct Held {
    resource: String,
    lease_id: LeaseId,
    token: u64,
    ttl_ms: u64,
    /// The end of the lease by this client's own clock (from sending the request).
    valid_until: Instant,
}

/// Margin a worker keeps before its own-clock lease end: it never starts a write later.
const CLIENT_MARGIN: Duration = Duration::from_millis(400);

impl Workload {
    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub(super) fn node(&self, rng: &mut StdRng) -> u64 {
        self.client.nodes.choose(rng).map_or(1, |n| n.id)
    }

    pub(super) async fn pause(&self, rng: &mut StdRng, lo: u64, hi: u64) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(lo..=hi))).await;
    }

    /// Acquires with retries on unknown outcomes (same `request_id`, random node each time).
    async fn acquire(
        &self,
        process: &str,
        rng: &mut StdRng,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Option<Held> {
        let first_sent = Instant::now();
        for attempt in 0..6 {
            if attempt > 0 && self.stopping() {
                return None;
            }
            let node = self.node(rng);
            match self
                .client
                .acquire(process, node, resource, request_id, ttl_ms, wait_ms)
                .await
            {
                Outcome::Ok(granted) => {
                    return Some(Held {
                        resource: resource.to_string(),
                        lease_id: granted.lease_id,
                        token: granted.fencing_token,
                        ttl_ms,
                        // The grant may come from the first attempt whose answer was lost.
                        valid_until: first_sent + Duration::from_millis(ttl_ms),
                    });
                }
                Outcome::Fail => return None,
                Outcome::Unreachable | Outcome::Info => {}
            }
            self.pause(rng, 20, 250).await;
        }
        None
    }

    /// Renews until it is answered or the lease is over by the client's clock.
    async fn renew(&self, process: &str, rng: &mut StdRng, held: &mut Held) -> bool {
        for _ in 0..5 {
            if Instant::now() + CLIENT_MARGIN >= held.valid_until {
                return false;
            }
            let sent = Instant::now();
            let node = self.node(rng);
            match self
                .client
                .renew(process, node, &held.resource, held.lease_id)
                .await
            {
                Outcome::Ok(_) => {
                    held.valid_until = held
                        .valid_until
                        .max(sent + Duration::from_millis(held.ttl_ms));
                    return true;
                }
                Outcome::Fail => return false,
                Outcome::Unreachable | Outcome::Info => {}
            }
            self.pause(rng, 20, 150).await;
        }
        false
    }

    /// Releases; true if the cluster acknowledged that this call ended the lease.
    async fn release(&self, process: &str, rng: &mut StdRng, held: &Held) -> bool {
        for _ in 0..4 {
            let node = self.node(rng);
            match self
                .client
                .release(process, node, &held.resource, held.lease_id)
                .await
            {
                Outcome::Ok(r) => return r.released,
                Outcome::Fail => return false,
                Outcome::Unreachable | Outcome::Info => {}
            }
            self.pause(rng, 20, 150).await;
        }
        false
    }

    /// A fenced write of a unique value, if the lease is still valid by the client's clock.
    async fn write(&self, process: &str, rng: &mut StdRng, held: &Held, seq: u64) -> bool {
        if Instant::now() + CLIENT_MARGIN >= held.valid_until {
            return false;
        }
        let key = key_of(&held.resource);
        let value = written_value(process, held.token, seq);
        let node = self.node(rng);
        matches!(
            self.client
                .write(process, node, key, held.token, &value, WriteRole::Normal)
                .await,
            Outcome::Ok(_)
        )
    }
}

fn key_of(resource: &str) -> &str {
    resource.strip_prefix("kv:").unwrap_or(resource)
}

pub async fn worker(w: Arc<Workload>, id: usize, seed: u64) {
    let process = format!("w{id}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    let mut seq = 0u64;
    while !w.stopping() {
        n += 1;
        let request_id = format!("{process}-{n}");
        if rng.random_bool(0.1) {
            // A long lease on a private resource, never released: it must still be there,
            // with at least its acknowledged expiry, in the final state (invariant 4). Half
            // of these ask to wait although the lock is free — a client that always passes a
            // wait timeout — which puts abandoned requests on the path where the lock is
            // granted at once.
            let resource = format!("hold:{process}:{n}");
            let ttl = rng.random_range(60_000..=120_000);
            let wait = if rng.random_bool(0.5) { 0 } else { 5_000 };
            if let Some(mut held) = w
                .acquire(&process, &mut rng, &resource, &request_id, ttl, wait)
                .await
            {
                if rng.random_bool(0.5) {
                    w.renew(&process, &mut rng, &mut held).await;
                }
            }
            continue;
        }
        let Some(key) = w.keys.choose(&mut rng).cloned() else {
            return;
        };
        let resource = format!("kv:{key}");
        let ttl = rng.random_range(1_500..=3_000);
        let wait = if rng.random_bool(0.5) {
            0
        } else {
            rng.random_range(500..=3_000)
        };
        let Some(mut held) = w
            .acquire(&process, &mut rng, &resource, &request_id, ttl, wait)
            .await
        else {
            w.pause(&mut rng, 20, 200).await;
            continue;
        };
        seq += 1;
        w.write(&process, &mut rng, &held, seq).await;
        if !w.stopping() && rng.random_bool(0.6) && w.renew(&process, &mut rng, &mut held).await {
            seq += 1;
            w.write(&process, &mut rng, &held, seq).await;
        }
        w.pause(&mut rng, 0, 300).await;
        if w.stopping() {
            // Leave it: the final state must account for it.
            return;
        }
        if rng.random_bool(0.85)
            && w.release(&process, &mut rng, &held).await
            && rng.random_bool(0.3)
        {
            // A holder that writes again right after its release was acknowledged (through
            // any proxy, including the one that still had a grant): never forwarded.
            seq += 1;
            let value = written_value(&process, held.token, seq);
            let node = w.node(&mut rng);
            w.client
                .write(
                    &process,
                    node,
                    key_of(&held.resource),
                    held.token,
                    &value,
                    WriteRole::AfterRelease,
                )
                .await;
        }
    }
}

pub async fn zombie(w: Arc<Workload>, id: usize, seed: u64) {
    let process = format!("z{id}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    let mut seq = 0u64;
    while !w.stopping() {
        n += 1;
        let Some(key) = w.keys.choose(&mut rng).cloned() else {
            return;
        };
        let resource = format!("kv:{key}");
        let request_id = format!("{process}-{n}");
        let ttl = rng.random_range(1_000..=1_500);
        let Some(held) = w
            .acquire(&process, &mut rng, &resource, &request_id, ttl, 3_000)
            .await
        else {
            w.pause(&mut rng, 50, 300).await;
            continue;
        };
        seq += 1;
        w.write(&process, &mut rng, &held, seq).await;

        // The stall: past the lease by our own clock, then until a newer holder's write is
        // visible in the store (bounded, so a quiet key does not stall us forever).
        tokio::time::sleep_until((held.valid_until + Duration::from_millis(200)).into()).await;
        let give_up = Instant::now() + Duration::from_secs(8);
        while Instant::now() < give_up && !w.stopping() {
            if let Outcome::Ok(v) = w.client.read_kv(&process, &key).await {
                if token_in_value(&v).is_some_and(|t| t > held.token) {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        if w.stopping() {
            return;
        }
        // The delayed write with the old token.
        seq += 1;
        let value = written_value(&process, held.token, seq);
        let node = w.node(&mut rng);
        w.client
            .write(&process, node, &key, held.token, &value, WriteRole::Zombie)
            .await;
        // Sometimes also a token that was never issued for the key it is sent with.
        if rng.random_bool(0.3) {
            if let Some(other) = w.keys.iter().find(|k| **k != key) {
                seq += 1;
                let value = written_value(&process, held.token, seq);
                let node = w.node(&mut rng);
                w.client
                    .write(
                        &process,
                        node,
                        other,
                        held.token,
                        &value,
                        WriteRole::Foreign,
                    )
                    .await;
            }
        }
        // A stale release must leave the new holder alone: only the current lease id
        // releases.
        w.release(&process, &mut rng, &held).await;
        w.pause(&mut rng, 50, 400).await;
    }
}
