//! When the client renews and retries: jittered, spread out, bounded.

use std::time::Duration;

use lock_core::client::{backoff_delay, renew_delay};
use rand::SeedableRng;

use super::SEC;

/// Renewals come well before expiry, spread out so that many clients do not renew together.
#[test]
fn t60_renew_delay_spreads_renewals_over_the_interval() {
    let ttl = Duration::from_secs(30);
    let nominal = ttl / 3;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let delays: Vec<Duration> = (0..1_000).map(|_| renew_delay(ttl, &mut rng)).collect();

    // Every renewal stays within ±20 % of ttl/3, so it comes well before the lease runs out.
    let lo = nominal.mul_f64(0.8);
    let hi = nominal.mul_f64(1.2);
    assert!(delays.iter().all(|d| (lo..=hi).contains(d)));

    // Spread: the picks cover most of the jitter window...
    let min = delays.iter().min().copied().unwrap_or_default();
    let max = delays.iter().max().copied().unwrap_or_default();
    assert!(max - min > nominal.mul_f64(0.35), "span {:?}", max - min);
    // ...and no tenth of it holds more than a quarter of the leases (uniform is ~10 %).
    let mut buckets = [0usize; 10];
    for d in &delays {
        let pos = (d.as_secs_f64() - lo.as_secs_f64()) / (hi - lo).as_secs_f64();
        buckets[((pos * 10.0) as usize).min(9)] += 1;
    }
    assert!(buckets.iter().all(|b| *b <= 250), "{buckets:?}");
    assert!(buckets.iter().all(|b| *b >= 50), "{buckets:?}");
}

/// Retries back off exponentially with jitter, never in a tight loop and never beyond the cap.
#[test]
fn t61_retry_backoff_grows_with_jitter_and_stays_bounded() {
    let (base, max) = (Duration::from_millis(50), SEC);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for attempt in 1..=40u32 {
        let full = base.saturating_mul(1 << (attempt - 1).min(16)).min(max);
        let picks: Vec<Duration> = (0..200)
            .map(|_| backoff_delay(attempt, base, max, &mut rng))
            .collect();
        // Upper half of the (capped) exponential step: never a tight loop, never above the cap.
        assert!(
            picks.iter().all(|d| *d >= full / 2 && *d <= full),
            "attempt {attempt}"
        );
        // Jittered: clients that failed together do not retry together.
        let distinct: std::collections::BTreeSet<_> = picks.iter().collect();
        assert!(
            distinct.len() > 150,
            "attempt {attempt}: {} distinct",
            distinct.len()
        );
    }
}
