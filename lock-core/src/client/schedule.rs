//! Pure timing decisions (renewal schedule, retry backoff, request ids), testable without a
//! clock: callers pass the random source.

use std::time::{Duration, Instant};

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
    let third = ttl / 3;
    // `mul_f64` panics past `Duration::MAX`; a TTL that long has no schedule to keep anyway.
    Duration::try_from_secs_f64(third.as_secs_f64() * factor).unwrap_or(third)
}

/// `start + d`, or a point decades away when `d` is too long to add (options such as
/// `Duration::MAX` mean "no bound"): deadlines never panic on overflow.
pub(crate) fn instant_after(start: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    start
        .checked_add(d)
        .or_else(|| start.checked_add(FAR))
        .unwrap_or(start)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_of_forever_saturate_instead_of_panicking() {
        let now = Instant::now();
        let far = instant_after(now, Duration::MAX);
        assert!(far > instant_after(now, Duration::from_secs(365 * 24 * 3600)));
        assert_eq!(
            instant_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        let mut rng = rand::rng();
        assert!(renew_delay(Duration::MAX, &mut rng) >= Duration::MAX / 3 / 2);
    }
}
