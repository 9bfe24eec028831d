//! One line of the closed loop: `clients` tasks on the harness's one runtime, each sending its
//! next call as soon as the previous one is answered, for a warm-up and then the measured
//! span.
//!
//! Each task counts into its own histograms and counters and hands them back when the line
//! ends, so recording costs no lock and no allocation per call; the histograms are merged
//! once. A call counts when it started after the warm-up and was answered before the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::check::Check;
use crate::backend::{Backend, Call, Failure, Grant};
use crate::config::Loop;
use crate::stats::new_hist;

/// An upper bound on the calls of one client in one line, beside the time bound (a call
/// answered in 1 µs for the whole line would not reach it).
const MAX_CALLS_PER_CLIENT: u64 = 50_000_000;

/// What every client of a line shares.
#[derive(Clone)]
pub struct Plan {
    pub what: Loop,
    pub backend: Arc<Backend>,
    pub check: Arc<Check>,
    /// Makes request ids unique across runs against one cluster (fencegate dedups them).
    pub run_id: u64,
    pub line: usize,
    pub resources: u32,
    pub ttl_ms: u64,
    pub wait_ms: u64,
    pub seed: u64,
    pub warm_end: Instant,
    pub end: Instant,
}

/// What one client (or, merged, a line) counted in the measured span.
pub struct Tally {
    /// Whole cycles (acquire + release), or renewals.
    pub hist: Histogram<u64>,
    pub acquire: Histogram<u64>,
    pub release: Histogram<u64>,
    pub ok: u64,
    /// Calls that ended in an error, by the final code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Failed attempts that a retry then covered (fencegate retries uncertain outcomes).
    pub retried_attempts: u64,
}

impl Tally {
    pub fn empty() -> Self {
        Tally {
            hist: new_hist(),
            acquire: new_hist(),
            release: new_hist(),
            ok: 0,
            errors_by_code: BTreeMap::new(),
            retried_attempts: 0,
        }
    }

    pub fn errors(&self) -> u64 {
        self.errors_by_code.values().sum()
    }

    pub fn merge(&mut self, other: Tally) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.hist.add(&other.hist);
        let _ = self.acquire.add(&other.acquire);
        let _ = self.release.add(&other.release);
        self.ok += other.ok;
        for (code, n) in other.errors_by_code {
            *self.errors_by_code.entry(code).or_default() += n;
        }
        self.retried_attempts += other.retried_attempts;
    }

    fn error(&mut self, code: &str) {
        match self.errors_by_code.get_mut(code) {
            Some(n) => *n += 1,
            None => {
                self.errors_by_code.insert(code.to_string(), 1);
            }
        }
    }

    /// The attempts of `call` that failed before its final one.
    fn count_retries<T>(&mut self, call: &Call<T>) {
        let failed = call.errors.len() as u64;
        self.retried_attempts += if call.result.is_err() {
            failed.saturating_sub(1)
        } else {
            failed
        };
    }
}

fn micros(from: Instant, to: Instant) -> u64 {
    (to - from).as_micros().max(1) as u64
}

impl Plan {
    /// Inside the measured span: started after the warm-up, answered before the end.
    fn measured(&self, start: Instant, done: Instant) -> bool {
        start >= self.warm_end && done <= self.end
    }

    fn request_id(&self, buf: &mut String, client: usize, n: u64) {
        buf.clear();
        let _ = write!(buf, "cl-{:x}-{}-{client}-{n}", self.run_id, self.line);
    }
}

/// Runs one client to the end of the line.
pub async fn client(plan: Plan, id: usize) -> Tally {
    match plan.what {
        Loop::Cycle => cycles(&plan, id).await,
        Loop::Renew => renewals(&plan, id).await,
    }
}

/// Acquire a random resource, release it, again.
async fn cycles(p: &Plan, id: usize) -> Tally {
    let mut t = Tally::empty();
    let mut rng = StdRng::seed_from_u64(p.seed ^ ((p.line as u64) << 32) ^ id as u64);
    let mut request_id = String::with_capacity(48);
    for n in 0..MAX_CALLS_PER_CLIENT {
        let start = Instant::now();
        if start >= p.end {
            break;
        }
        let resource = rng.random_range(0..p.resources);
        p.request_id(&mut request_id, id, n);
        let acq = p
            .backend
            .acquire(resource, &request_id, p.ttl_ms, p.wait_ms)
            .await;
        let acquired = Instant::now();
        let measured = p.measured(start, acquired);
        if measured {
            t.count_retries(&acq);
        }
        let grant = match acq.result {
            Ok(g) => g,
            Err(f) => {
                // An uncertain failure may have left a lease behind: its TTL ends it, and
                // an acquire that meets it waits or times out like any other.
                if measured {
                    t.error(&f.code);
                }
                continue;
            }
        };
        p.check.granted(resource, &grant);
        p.check.releasing(resource, &grant);
        let rel = p.backend.release(resource, &grant).await;
        let done = Instant::now();
        if !p.measured(start, done) {
            continue;
        }
        t.count_retries(&rel);
        match rel.result {
            Ok(true) => {
                t.ok += 1;
                let _ = t.hist.record(micros(start, done));
                let _ = t.acquire.record(micros(start, acquired));
                let _ = t.release.record(micros(acquired, done));
            }
            // Released a lease granted a moment ago and not released yet: the server no
            // longer had it as current.
            Ok(false) => t.error("release_not_current"),
            Err(f) => t.error(&f.code),
        }
    }
    t
}

/// Hold one lease on the client's own resource and renew it, again.
async fn renewals(p: &Plan, id: usize) -> Tally {
    let mut t = Tally::empty();
    // Consecutive resources from `line * 1000`: no two clients of a line share one (there are
    // at least as many resources as clients), and a lease a previous line could not release
    // is rarely in the way.
    let resource = ((p.line as u64 * 1_000 + id as u64) % p.resources as u64) as u32;
    let mut request_id = String::with_capacity(48);
    p.request_id(&mut request_id, id, 0);
    let acq = p
        .backend
        .acquire(resource, &request_id, p.ttl_ms, p.wait_ms)
        .await;
    let grant = match acq.result {
        Ok(g) => g,
        Err(f) => {
            t.error(&format!("hold_{}", f.code));
            return t;
        }
    };
    p.check.granted(resource, &grant);
    let mut valid_from = acq.first_send;
    let renewed = renew_until_end(p, &mut t, resource, &grant, &mut valid_from).await;
    if let Err(f) = renewed {
        t.error(&format!("keepalive_{}", f.code));
    }
    p.check.releasing(resource, &grant);
    let _ = p.backend.release(resource, &grant).await;
    t
}

async fn renew_until_end(
    p: &Plan,
    t: &mut Tally,
    resource: u32,
    grant: &Grant,
    valid_from: &mut Instant,
) -> Result<(), Failure> {
    let mut renewer = p.backend.renewer(resource, grant.clone()).await?;
    let ttl = Duration::from_millis(p.ttl_ms);
    for _ in 0..MAX_CALLS_PER_CLIENT {
        let start = Instant::now();
        if start >= p.end {
            break;
        }
        let call = renewer.renew().await;
        let done = Instant::now();
        let measured = p.measured(start, done);
        if measured {
            t.count_retries(&call);
        }
        match call.result {
            Ok(true) => {
                // The renewal was stamped after it went out: valid for a TTL from there.
                *valid_from = call.first_send;
                if measured {
                    t.ok += 1;
                    let _ = t.hist.record(micros(start, done));
                }
            }
            Ok(false) => {
                let left = (*valid_from + ttl)
                    .checked_duration_since(call.answered)
                    .map(|d| d.as_millis() as u64);
                p.check.lost(resource, grant, left);
                t.error("lease_lost");
                return Ok(());
            }
            Err(f) => {
                if measured {
                    t.error(&f.code);
                }
            }
        }
    }
    Ok(())
}
