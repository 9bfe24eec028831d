//! The idempotent create-order clients.
//!
//! An **orderer** places orders through the fencing proxies' `POST /orders` route, which
//! requires an `Idempotency-Key`. Each logical order has its own (tenant, key) and body; every
//! attempt of it carries exactly those, through a random node's proxy, so the store must end
//! up with at most one order per (tenant, key) however the attempts went (invariant 7 of the checker):
//!
//! - an attempt without a definite answer (timeout, reset, a 5xx, an answer the
//!   drop-responses nemesis threw away) or refused for now (`idempotency_key_in_use`,
//!   `idempotency_outcome_unknown` while the lost attempt's claim runs out) is retried with
//!   the same key after a short pause, until it gets an answer or its retry budget ends;
//! - now and then an order is sent as two or three concurrent attempts (a client racing
//!   itself), and after a success one more attempt is sent anyway (a client that never saw
//!   the answer): both must be replays or refusals, never a second order;
//! - some orders ask the store to hold its answer back past the proxy's upstream timeout
//!   after creating the order: the answer is lost after the effect, the record becomes
//!   `unknown`, and a retry must find the order through the reconciliation lookup;
//! - two tenants share key names (`acme` and `globex` both place key `o3-7` now and then):
//!   their orders are independent, and reconciling one must never find the other's.
//!
//! With `--unsafe-no-idempotency` the proxies forward every attempt: the retries and races
//! above create duplicate orders, which the checker must report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::client::Outcome;
use super::history::OrderCall;
use super::workers::Workload;

const TENANTS: [&str; 2] = ["acme", "globex"];

/// How long one logical order is retried: past a lost attempt's claim (the route's upstream
/// timeout plus the proxy's 2 s margin), so a retry gets to reconcile it.
const RETRY_BUDGET: Duration = Duration::from_secs(8);

/// The proxies' upstream timeout in the chaos cluster (`cluster_spec`); a held-back answer
/// waits longer than this.
const UPSTREAM_TIMEOUT_MS: u64 = 1_000;

pub async fn orderer(w: Arc<Workload>, id: usize, seed: u64) {
    let process = format!("o{id}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !w.stopping() {
        n += 1;
        let tenant = TENANTS.choose(&mut rng).copied().unwrap_or("acme");
        let key = format!("{process}-{n}");
        place(&w, &process, &mut rng, tenant, &key).await;
        if rng.random_bool(0.2) && !w.stopping() {
            // The same key for the other tenant: a different order, not a duplicate.
            let other = if tenant == TENANTS[0] {
                TENANTS[1]
            } else {
                TENANTS[0]
            };
            place(&w, &process, &mut rng, other, &key).await;
        }
        w.pause(&mut rng, 0, 200).await;
    }
}

/// One logical order, with its retries.
async fn place(w: &Workload, process: &str, rng: &mut StdRng, tenant: &str, key: &str) {
    let call = OrderCall {
        tenant: tenant.to_string(),
        key: key.to_string(),
        body: serde_json::json!({ "tenant": tenant, "key": key, "by": process }).to_string(),
        answer_delay_ms: rng
            .random_bool(0.15)
            .then(|| rng.random_range(UPSTREAM_TIMEOUT_MS + 200..=UPSTREAM_TIMEOUT_MS + 800)),
        concurrent: false,
    };
    let give_up = Instant::now() + RETRY_BUDGET;
    let mut done = if rng.random_bool(0.2) {
        race(w, process, rng, &call).await
    } else {
        let node = w.node(rng);
        matches!(w.client.order(process, node, &call).await, Outcome::Ok(_))
    };
    while !done && Instant::now() < give_up && !w.stopping() {
        w.pause(rng, 100, 600).await;
        let node = w.node(rng);
        done = matches!(w.client.order(process, node, &call).await, Outcome::Ok(_));
    }
    if done && rng.random_bool(0.25) {
        // A client that never saw the answer sends the order once more: a replay.
        let node = w.node(rng);
        w.client.order(process, node, &call).await;
    }
}

/// Two or three attempts of one order at once, through different proxies; true if any
/// succeeded.
async fn race(w: &Workload, process: &str, rng: &mut StdRng, call: &OrderCall) -> bool {
    let call = OrderCall {
        concurrent: true,
        ..call.clone()
    };
    let mut attempts = tokio::task::JoinSet::new();
    for _ in 0..rng.random_range(2..=3) {
        let (client, call, process) = (w.client.clone(), call.clone(), process.to_string());
        let node = w.node(rng);
        attempts.spawn(async move { client.order(&process, node, &call).await });
    }
    let mut any = false;
    while let Some(done) = attempts.join_next().await {
        any |= matches!(done, Ok(Outcome::Ok(_)));
    }
    any
}
