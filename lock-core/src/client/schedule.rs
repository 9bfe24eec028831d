//! Pure timing decisions (renewal schedule, retry backoff, request ids), testable without a
//! clock: callers pass the random source.

use std::time::Duration;

use rand::Rng;

/// Share of the renewal interval by which a renewal is moved earlier or later at random.
pub const RENEW_JITTER: f64 = 0.2;

/// When to renew a lease of `ttl` next, counted from the last successful acquire or renewal:
/// `ttl / 3`, moved by a uniform ±20 %. The jitter spreads the renewals of leases acquired
/// together (e.g. after a restart) so they do not hit the leader in one burst.
///
/// Even the latest renewal (0.4 × ttl) leaves more than half of the TTL for retries before
/// the guard's local deadline.
pub fn renew_delay<R: Rng + ?Sized>(ttl: Duration, rng: &mut R) -> Duration {
    let factor = rng.random_range((1.0 - RENEW_JITTER)..=(1.0 + RENEW_JITTER));
    (ttl / 3).mul_f64(factor)
}

/// Pause before retry number `attempt` (1 = the first retry): exponential from `base`,
/// capped at `max`, with "equal jitter" (a uniform pick in the upper half), so clients that
/// failed together do not retry together yet never retry in a tight loop.
pub fn backoff_delay<R: Rng + ?Sized>(
    attempt: u32,
    base: Duration,
    max: Duration,
    rng: &mut R,
) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    let full = exp.min(max);
    let half = full / 2;
    half + half.mul_f64(rng.random_range(0.0..=1.0))
}

/// A fresh idempotency key for one logical acquire: 128 random bits in hex.
pub fn new_request_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}
