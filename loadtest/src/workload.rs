//! The open-loop workload engine.
//!
//! Arrivals come at a fixed rate (evenly spaced, or Poisson), each starting one *lock cycle*
//! in its own task: acquire a free resource, renew on schedule while holding it, optionally
//! write through the fencing proxy, release at the end of the hold. Nothing waits for a
//! previous response before the next arrival, and every operation's latency is measured from
//! the moment the schedule said it should start (see `stats`).
//!
//! Model: with arrival rate λ and mean hold h, Little's law gives λ·h active locks,
//! so the hold defaults to `active_locks / rate` (10 s at the seed: 20,000 / 2,000/s), drawn
//! uniformly from [h/2, 3h/2]. A holder renews every `renew_interval` (±jitter), its first
//! renewal at a uniformly random phase of the interval — clients' renewal timers are not
//! aligned with their acquisitions — so renewals run at `active / interval` (2,000/s at the
//! seed, the renewal load the service is sized for).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::wire::ErrorCode;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::backend::{Backend, Call};
use crate::cluster::ProxySpec;
use crate::config::Workload;
use crate::ledger::Ledger;
use crate::stats::{Op, Outcome, Recorder};
// Not tokio's: its millisecond ticks made every operation start up to 1 ms after its slot,
// and that lateness counts in the latency (see `crate::timer`).
use crate::timer::sleep_until;

/// Resource slot states in `busy`.
const FREE: u64 = 0;
const HELD: u64 = u64::MAX;
/// Safety cap on concurrently running cycles (beyond it arrivals are dropped and counted).
const MAX_ACTIVE_CYCLES: u64 = 500_000;
/// After a hold with fenced writes the service defers reissuing the resource while the
/// proxy's admission grant may live: the harness leaves such a resource alone a little longer
/// than the grant of the clusters it starts, so acquires stay uncontended.
const REISSUE_HOLD_MS: u64 = ProxySpec::LOAD.grant_ms + 500;
/// A lease is reported lost only if the server dropped it with more than this left on the
/// client's conservative clock (absorbs ms rounding of TTLs).
const LOST_MARGIN: Duration = Duration::from_millis(10);

#[derive(Default)]
pub struct Counters {
    pub cycles_started: AtomicU64,
    pub cycles_active: AtomicU64,
    pub ops_ok: AtomicU64,
    pub ops_failed: AtomicU64,
    /// Arrivals that found no free resource or hit the active-cycle cap.
    pub dropped: AtomicU64,
}

struct Ctx {
    backend: Backend,
    rec: Arc<Recorder>,
    ledger: Arc<Ledger>,
    w: Workload,
    /// Per resource: FREE, HELD (held or an acquire in flight), or "tainted until" in ms
    /// since t0 (an acquire whose outcome is unknown may hold it until its TTL runs out).
    busy: Vec<AtomicU64>,
    rate_bits: AtomicU64,
    /// Next index for `--sweep`.
    cursor: AtomicU64,
    stop: AtomicBool,
    drain_tx: watch::Sender<bool>,
    counters: Counters,
    run_nonce: u64,
}

#[derive(Clone)]
pub struct Engine {
    ctx: Arc<Ctx>,
}

impl Engine {
    pub fn new(backend: Backend, rec: Arc<Recorder>, ledger: Arc<Ledger>, w: Workload) -> Self {
        let busy = (0..w.resources).map(|_| AtomicU64::new(FREE)).collect();
        let (drain_tx, _) = watch::channel(false);
        let rate = w.rate;
        Engine {
            ctx: Arc::new(Ctx {
                backend,
                rec,
                ledger,
                busy,
                rate_bits: AtomicU64::new(rate.to_bits()),
                cursor: AtomicU64::new(0),
                stop: AtomicBool::new(false),
                drain_tx,
                counters: Counters::default(),
                run_nonce: rand::rng().random(),
                w,
            }),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.ctx.counters
    }

    pub fn rate(&self) -> f64 {
        f64::from_bits(self.ctx.rate_bits.load(Ordering::Relaxed))
    }

    pub fn set_rate(&self, rate: f64) {
        self.ctx.rate_bits.store(rate.to_bits(), Ordering::Relaxed);
    }

    /// Starts the arrival loop at `start`. It runs until `stop_arrivals` or `max_arrivals`.
    pub fn start(&self, start: Instant, max_arrivals: u64) -> tokio::task::JoinHandle<()> {
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.w.seed);
            let mut next = start;
            let mut n: u64 = 0;
            while !ctx.stop.load(Ordering::Relaxed) && n < max_arrivals {
                let rate = f64::from_bits(ctx.rate_bits.load(Ordering::Relaxed));
                let gap = if ctx.w.poisson {
                    -(1.0 - rng.random::<f64>()).ln() / rate
                } else {
                    1.0 / rate
                };
                sleep_until(next).await;
                if ctx.stop.load(Ordering::Relaxed) {
                    break;
                }
                if ctx.counters.cycles_active.load(Ordering::Relaxed) >= MAX_ACTIVE_CYCLES {
                    ctx.counters.dropped.fetch_add(1, Ordering::Relaxed);
                } else {
                    let seed = rng.random::<u64>();
                    ctx.counters.cycles_started.fetch_add(1, Ordering::Relaxed);
                    ctx.counters.cycles_active.fetch_add(1, Ordering::Relaxed);
                    let c = ctx.clone();
                    let intended = next;
                    tokio::spawn(async move {
                        cycle(&c, intended, n, rate, seed).await;
                        c.counters.cycles_active.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                n += 1;
                next += Duration::from_secs_f64(gap);
            }
        })
    }

    pub fn stop_arrivals(&self) {
        self.ctx.stop.store(true, Ordering::Relaxed);
    }

    /// Ends every hold now (releases are not recorded) and waits for the cycles to finish.
    pub async fn drain(&self, timeout: Duration) -> bool {
        self.stop_arrivals();
        let _ = self.ctx.drain_tx.send(true);
        let deadline = Instant::now() + timeout;
        while self.ctx.counters.cycles_active.load(Ordering::Relaxed) > 0 {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

impl Ctx {
    fn now_ms(&self) -> u64 {
        self.rec.t0.elapsed().as_millis() as u64
    }

    /// Claims a random resource that is neither held nor tainted (outside the hot set).
    fn claim_free(&self, rng: &mut impl Rng) -> Option<u32> {
        let lo = self.w.hot_resources;
        let now = self.now_ms();
        let span = u64::from(self.w.resources - lo);
        for _ in 0..64 {
            let idx = if self.w.sweep {
                lo + (self.cursor.fetch_add(1, Ordering::Relaxed) % span) as u32
            } else {
                rng.random_range(lo..self.w.resources)
            };
            let slot = &self.busy[idx as usize];
            let v = slot.load(Ordering::Relaxed);
            if v != HELD
                && v <= now
                && slot
                    .compare_exchange(v, HELD, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return Some(idx);
            }
        }
        None
    }

    fn free(&self, idx: u32, hot: bool) {
        if !hot {
            self.busy[idx as usize].store(FREE, Ordering::Release);
        }
    }

    /// The outcome of an acquire is unknown: the lease may exist until its TTL runs out.
    fn taint(&self, idx: u32, hot: bool) {
        self.busy_for(idx, hot, self.w.ttl_ms + 2_000);
    }

    fn busy_for(&self, idx: u32, hot: bool, ms: u64) {
        if !hot {
            let until = self.now_ms() + ms;
            self.busy[idx as usize].store(until, Ordering::Release);
        }
    }

    /// One line of a lease's history: times since t0.
    fn trail<T>(&self, op: &str, call: &Call<T>, result: &str) -> String {
        let t = |i: Instant| i.saturating_duration_since(self.rec.t0).as_secs_f64();
        format!(
            "{op} sent {:.3}s..{:.3}s answered {:.3}s: {result} (failed attempts {:?})",
            t(call.first_send),
            t(call.last_send),
            t(call.answered),
            call.errors
        )
    }

    fn finish<T>(&self, op: Op, intended: Instant, call: &Call<T>, outcome: Outcome, record: bool) {
        match outcome {
            Outcome::Ok => self.counters.ops_ok.fetch_add(1, Ordering::Relaxed),
            _ => self.counters.ops_failed.fetch_add(1, Ordering::Relaxed),
        };
        if record {
            self.rec.finish(
                op,
                intended,
                (call.first_send, call.connection_wait),
                &outcome,
                &call.errors,
            );
        }
    }
}

enum Step {
    Renew,
    Write,
}

async fn cycle(ctx: &Ctx, intended: Instant, n: u64, rate: f64, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let w = &ctx.w;
    let hot = w.hot_resources > 0 && rng.random::<f64>() < w.hot_fraction;
    let res = if hot {
        rng.random_range(0..w.hot_resources)
    } else {
        match ctx.claim_free(&mut rng) {
            Some(r) => r,
            None => {
                ctx.counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    };
    let mut drain = ctx.drain_tx.subscribe();
    if *drain.borrow() {
        ctx.free(res, hot);
        return;
    }

    // ---- acquire ----
    let request_id = format!("lt{:016x}-{n}", ctx.run_nonce);
    let wait = if hot { w.wait_timeout_ms } else { 0 };
    ctx.rec.begin(intended);
    let call = ctx.backend.acquire(res, &request_id, w.ttl_ms, wait).await;
    let grant = match &call.result {
        Ok(g) => {
            ctx.finish(Op::Acquire, intended, &call, Outcome::Ok, true);
            ctx.ledger.grant(res, g.lease_num(), g.token, !hot);
            g.clone()
        }
        Err(f) if f.definite && is_conflict(&f.code) => {
            ctx.finish(
                Op::Acquire,
                intended,
                &call,
                Outcome::Conflict(f.code.clone()),
                true,
            );
            if !hot {
                ctx.ledger.unexpected_conflict(res, &f.code);
            }
            ctx.free(res, hot);
            return;
        }
        Err(f) => {
            ctx.finish(
                Op::Acquire,
                intended,
                &call,
                Outcome::Failed(f.code.clone()),
                true,
            );
            if f.definite {
                ctx.free(res, hot);
            } else {
                ctx.taint(res, hot);
            }
            return;
        }
    };
    // The lease's history, for the report if the service loses it.
    let mut trail = vec![ctx.trail("acquire", &call, &format!("token {}", grant.token))];
    let ttl = Duration::from_millis(w.ttl_ms);
    // Counted from the first attempt: a retried acquire may return the original grant.
    let mut valid_until = call.first_send + ttl;

    // ---- hold: renewals and fenced writes ----
    let hold = ctx_hold(w, rate, &mut rng);
    let hold_end = intended + hold;
    let interval = Duration::from_millis(w.renew_interval_ms);
    let mut steps: Vec<(Instant, Step)> = Vec::new();
    let mut t = intended + interval.mul_f64(rng.random::<f64>());
    while t < hold_end {
        steps.push((t, Step::Renew));
        let j = 1.0 + w.renew_jitter * (2.0 * rng.random::<f64>() - 1.0);
        t += interval.mul_f64(j);
    }
    if ctx.backend.supports_writes() {
        for k in 0..w.writes_per_hold {
            let frac = (k as f64 + 0.5) / w.writes_per_hold as f64;
            steps.push((intended + hold.mul_f64(frac), Step::Write));
        }
    }
    steps.sort_by_key(|(t, _)| *t);

    let mut drained = false;
    let mut wrote = false;
    for (at, step) in steps {
        tokio::select! {
            _ = sleep_until(at) => {}
            _ = drain.wait_for(|d| *d) => { drained = true; }
        }
        if drained {
            break;
        }
        ctx.rec.begin(at);
        match step {
            Step::Renew => {
                let call = ctx.backend.renew(res, &grant).await;
                trail.push(ctx.trail(
                    "renew",
                    &call,
                    &format!("{:?}", call.result.as_ref().map_err(|f| &f.code)),
                ));
                match &call.result {
                    Ok(true) => {
                        ctx.finish(Op::Renew, at, &call, Outcome::Ok, true);
                        valid_until = valid_until.max(call.last_send + ttl);
                    }
                    Ok(false) => {
                        ctx.finish(
                            Op::Renew,
                            at,
                            &call,
                            Outcome::Failed(ErrorCode::LeaseLost.to_string()),
                            true,
                        );
                        ctx.ledger.lease_gone(
                            res,
                            grant.token,
                            left(valid_until, call.answered),
                            &trail,
                        );
                        ctx.free(res, hot);
                        return;
                    }
                    Err(f) => {
                        ctx.finish(Op::Renew, at, &call, Outcome::Failed(f.code.clone()), true);
                    }
                }
            }
            Step::Write => {
                wrote = true;
                if let Some(call) = ctx.backend.write(res, &grant).await {
                    let outcome = match &call.result {
                        Ok(()) => Outcome::Ok,
                        Err(f) => Outcome::Failed(f.code.clone()),
                    };
                    ctx.finish(Op::Write, at, &call, outcome, true);
                }
            }
        }
    }

    // ---- release ----
    let (at, record) = if drained || *drain.borrow() {
        (Instant::now(), false)
    } else {
        tokio::select! {
            _ = sleep_until(hold_end) => (hold_end, true),
            _ = drain.wait_for(|d| *d) => (Instant::now(), false),
        }
    };
    if record {
        ctx.rec.begin(at);
    }
    let call = ctx.backend.release(res, &grant).await;
    trail.push(ctx.trail(
        "release",
        &call,
        &format!("{:?}", call.result.as_ref().map_err(|f| &f.code)),
    ));
    match &call.result {
        Ok(true) => {
            ctx.finish(Op::Release, at, &call, Outcome::Ok, record);
            if wrote {
                ctx.busy_for(res, hot, REISSUE_HOLD_MS);
            } else {
                ctx.free(res, hot);
            }
        }
        Ok(false) => {
            // "Not released" is ambiguous: the lease may have been lost, or an earlier try of
            // this very release (ours, or a follower's forward the leader answered before a
            // crash) already released it. Counted, not judged; renewals judge lost leases.
            ctx.finish(Op::Release, at, &call, Outcome::Ok, record);
            ctx.ledger.release_not_current(
                res,
                grant.token,
                left(valid_until, call.answered),
                &trail,
            );
            ctx.free(res, hot);
        }
        Err(f) => {
            ctx.finish(
                Op::Release,
                at,
                &call,
                Outcome::Failed(f.code.clone()),
                record,
            );
            ctx.taint(res, hot);
        }
    }
}

/// A definite refusal that is part of a contended workload, not an error.
fn is_conflict(code: &str) -> bool {
    [ErrorCode::LockHeld, ErrorCode::TooManyWaiters]
        .iter()
        .any(|c| c.as_str() == code)
}

fn ctx_hold(w: &Workload, rate: f64, rng: &mut impl Rng) -> Duration {
    w.hold_at(rate).mul_f64(0.5 + rng.random::<f64>())
}

/// Time the lease still had by the client's conservative clock when the server's "gone"
/// answer arrived (the server decided before that), if more than the margin.
fn left(valid_until: Instant, answered: Instant) -> Option<u64> {
    let left = valid_until.saturating_duration_since(answered);
    (left > LOST_MARGIN).then_some(left.as_millis() as u64)
}
