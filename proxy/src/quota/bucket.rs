//! The local token bucket of one (quota, tenant) pool on one proxy. Pure: time is an input
//! (milliseconds of the proxy's monotonic clock), so it is tested without pingora or tokio.
//!
//! The bucket refills at the sum of the rate shares that cover the current moment and is
//! capped at the sum of their burst shares. Shares come from quota leases, translated to
//! local time by the lessor: a lease's local end is measured from when its request was *sent*
//! (so the proxy stops no later than the ledger stops counting it), a fresh lease's local start
//! from when its answer *arrived* (so the proxy never starts before the ledger counts it), and
//! a renewal's successor starts where the lease it renews ends (it never has a larger share,
//! so switching a little early is safe).
//!
//! - A new share never adds tokens: a renewal keeps the balance, it never refills.
//! - When the cap drops (a lease ends, a smaller successor starts) the balance is truncated.
//! - With no share covering the moment the cap is zero: the balance is gone, and after such a
//!   gap the bucket starts from zero.
//! - `strict`: nothing is admitted without a share. `emergency`: while the lessor cannot reach
//!   the cluster, up to the allowance E is admitted per disconnection.
//!
//! Units: rates in milli-requests per second, bursts in milli-requests, the balance in
//! micro-requests (a milli-request per second refills one micro-request per millisecond).

/// A leased share in local time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub from_ms: u64,
    pub until_ms: u64,
    pub rate_milli: u64,
    pub burst_milli: u64,
}

/// Why a request was not admitted, and when it may succeed if that is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Local time from which the request would be admitted under the shares known now (the
    /// next refill), or the next expected lease; `None` when nobody can tell.
    pub retry_at_ms: Option<u64>,
}

const MICRO_PER_REQUEST: u64 = 1_000_000;

/// More capacity the lessor expects, while it holds less than the ledger's target for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// Local time from which it expects to hold more.
    pub at_ms: u64,
    /// The rate share it expects to gain (0: unknown). A new share starts empty, so a request
    /// waits for its refill at this rate after `at_ms`.
    pub rate_milli: u64,
}

#[derive(Clone, Debug)]
pub struct Bucket {
    balance: u64,
    at_ms: u64,
    shares: Vec<Share>,
    /// Emergency allowance E (0 under `strict`), in requests, and what is left of it.
    allowance: u64,
    allowance_left: u64,
    /// The lessor's last attempt to reach the cluster failed.
    disconnected: bool,
    /// When the lessor expects more capacity, if it is asking for more.
    expected: Option<Expected>,
}

impl Bucket {
    pub fn new(now_ms: u64, allowance: u64) -> Self {
        Bucket {
            balance: 0,
            at_ms: now_ms,
            shares: Vec::new(),
            allowance,
            allowance_left: allowance,
            disconnected: false,
            expected: None,
        }
    }

    /// Adds a leased share. The balance is unchanged: tokens only come from refilling.
    pub fn add(&mut self, share: Share, now_ms: u64) {
        self.advance(now_ms);
        if share.until_ms > share.from_ms && share.until_ms > now_ms {
            self.shares.push(share);
        }
    }

    /// The lessor reached the cluster (`true`) or failed to (`false`). Reconnecting restores
    /// the emergency allowance for the next disconnection.
    pub fn set_connected(&mut self, connected: bool) {
        self.disconnected = !connected;
        if connected {
            self.allowance_left = self.allowance;
        }
    }

    /// A new emergency allowance (the quota was changed); what is left of it is capped.
    pub fn set_allowance(&mut self, allowance: u64) {
        self.allowance = allowance;
        self.allowance_left = self.allowance_left.min(allowance);
    }

    pub fn set_expected(&mut self, expected: Option<Expected>) {
        self.expected = expected;
    }

    /// Admits a request of weight `cost` (requests) at `now_ms`, or says when to retry.
    pub fn try_take(&mut self, cost: u64, now_ms: u64) -> Result<(), Refusal> {
        self.advance(now_ms);
        let need = cost.saturating_mul(MICRO_PER_REQUEST);
        if self.balance >= need && self.cap_at(now_ms) > 0 {
            self.balance -= need;
            return Ok(());
        }
        if self.disconnected && self.cap_at(now_ms) == 0 && self.allowance_left >= cost {
            self.allowance_left -= cost;
            return Ok(());
        }
        let refill = self.refilled_by(need, now_ms);
        // Once the expected share arrives, the shares held then refill the bucket with it.
        let expected = self.expected.map(|e| {
            let from = e.at_ms.max(now_ms);
            let refill = match e.rate_milli {
                0 => 0,
                gain => need.div_ceil(self.rate_at(from).saturating_add(gain)),
            };
            from.saturating_add(refill)
        });
        let retry_at_ms = match (refill, expected) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Err(Refusal { retry_at_ms })
    }

    /// DEMONSTRATIONS ONLY: fills the balance to the current cap, as a bucket that wrongly
    /// refills on renewal would. Breaks the R·t + B bound; exists so that the chaos harness can
    /// show its quota check catches that.
    pub fn unsafe_refill(&mut self, now_ms: u64) {
        self.advance(now_ms);
        self.balance = self.cap_at(now_ms);
    }

    /// Current balance in requests (rounded down), for metrics and tests.
    pub fn balance(&self) -> u64 {
        self.balance / MICRO_PER_REQUEST
    }

    /// Sum of the rate shares covering `t`, in milli-requests per second.
    pub fn rate_at(&self, t: u64) -> u64 {
        self.covering(t)
            .map(|s| s.rate_milli)
            .fold(0, u64::saturating_add)
    }

    /// Sum of the burst shares covering `t`, in milli-requests.
    pub fn burst_at(&self, t: u64) -> u64 {
        self.covering(t)
            .map(|s| s.burst_milli)
            .fold(0, u64::saturating_add)
    }

    /// Sum of the burst shares covering `t`, in micro-requests.
    fn cap_at(&self, t: u64) -> u64 {
        self.covering(t)
            .map(|s| s.burst_milli.saturating_mul(1_000))
            .fold(0, u64::saturating_add)
    }

    /// The latest local end of any known share: nothing is admitted (strict) after it unless
    /// a new lease arrives.
    pub fn horizon_ms(&self) -> u64 {
        self.shares
            .iter()
            .map(|s| s.until_ms)
            .max()
            .unwrap_or(self.at_ms)
    }

    fn covering(&self, t: u64) -> impl Iterator<Item = &Share> {
        self.shares
            .iter()
            .filter(move |s| s.from_ms <= t && t < s.until_ms)
    }

    /// The share boundaries in `(from, to)`, sorted, then `to`.
    fn pieces(&self, from: u64, to: u64) -> Vec<u64> {
        let mut points: Vec<u64> = self
            .shares
            .iter()
            .flat_map(|s| [s.from_ms, s.until_ms])
            .filter(|&p| p > from && p < to)
            .collect();
        points.sort_unstable();
        points.dedup();
        points.push(to);
        points
    }

    /// Refills from `at_ms` to `now_ms`, piece by piece between share boundaries, truncating
    /// to the cap at the start of each piece.
    fn advance(&mut self, now_ms: u64) {
        if now_ms <= self.at_ms {
            return;
        }
        let mut t = self.at_ms;
        for p in self.pieces(t, now_ms) {
            let cap = self.cap_at(t);
            let rate = self.rate_at(t);
            self.balance = self
                .balance
                .min(cap)
                .saturating_add(rate.saturating_mul(p - t))
                .min(cap);
            t = p;
        }
        self.balance = self.balance.min(self.cap_at(now_ms));
        self.shares.retain(|s| s.until_ms > now_ms);
        self.at_ms = now_ms;
    }

    /// When the balance reaches `need` under the known shares, if it does.
    fn refilled_by(&self, need: u64, now_ms: u64) -> Option<u64> {
        let mut balance = self.balance;
        let mut t = now_ms;
        for p in self.pieces(now_ms, self.horizon_ms()) {
            let (cap, rate) = (self.cap_at(t), self.rate_at(t));
            balance = balance.min(cap);
            if cap >= need && rate > 0 {
                let wait = (need.saturating_sub(balance)).div_ceil(rate);
                if t.saturating_add(wait) <= p {
                    return Some(t + wait);
                }
            }
            balance = balance.saturating_add(rate.saturating_mul(p - t)).min(cap);
            t = p;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 requests/s, burst 20, for ten seconds from t = 0.
    fn share(from_ms: u64, until_ms: u64, rate: u64, burst: u64) -> Share {
        Share {
            from_ms,
            until_ms,
            rate_milli: rate * 1_000,
            burst_milli: burst * 1_000,
        }
    }

    fn admitted(b: &mut Bucket, n: u64, now: u64) -> u64 {
        (0..n).filter(|_| b.try_take(1, now).is_ok()).count() as u64
    }

    #[test]
    fn a_new_bucket_starts_empty_and_refills_at_the_leased_rate() {
        let mut b = Bucket::new(0, 0);
        b.add(share(0, 10_000, 10, 20), 0);
        assert_eq!(admitted(&mut b, 5, 0), 0, "a lease brings no tokens");
        assert_eq!(admitted(&mut b, 5, 500), 5, "10/s for 0.5 s");
        assert_eq!(admitted(&mut b, 50, 5_000), 20, "capped at the burst share");
    }

    #[test]
    fn renewal_keeps_the_balance_and_never_refills() {
        let mut b = Bucket::new(0, 0);
        b.add(share(0, 2_000, 10, 20), 0);
        assert_eq!(admitted(&mut b, 15, 1_500), 15);
        // The successor arrives: no tokens added, the remaining balance is kept.
        b.add(share(2_000, 4_000, 10, 20), 1_500);
        assert_eq!(b.balance(), 0);
        assert_eq!(admitted(&mut b, 5, 2_000), 5, "only the 0.5 s of refill");
    }

    #[test]
    fn a_smaller_successor_truncates_the_balance() {
        let mut b = Bucket::new(0, 0);
        b.add(share(0, 2_000, 10, 20), 0);
        b.add(share(2_000, 4_000, 2, 4), 1_000);
        assert_eq!(b.try_take(0, 1_999), Ok(()));
        assert_eq!(b.balance(), 19);
        assert_eq!(
            admitted(&mut b, 30, 2_000),
            4,
            "truncated to the new burst share"
        );
    }

    #[test]
    fn strict_stops_at_expiry_and_starts_from_zero_after_a_gap() {
        let mut b = Bucket::new(0, 0);
        b.add(share(0, 2_000, 10, 20), 0);
        assert_eq!(b.try_take(0, 1_999), Ok(()));
        assert_eq!(b.balance(), 19);
        assert_eq!(admitted(&mut b, 5, 2_000), 0, "expired: nothing admitted");
        b.set_connected(false);
        assert_eq!(admitted(&mut b, 5, 2_500), 0, "strict has no allowance");
        b.add(share(3_000, 5_000, 10, 20), 3_000);
        assert_eq!(
            admitted(&mut b, 5, 3_000),
            0,
            "after a gap the bucket starts empty"
        );
    }

    #[test]
    fn emergency_admits_at_most_the_allowance_while_disconnected() {
        let mut b = Bucket::new(0, 7);
        b.add(share(0, 1_000, 10, 20), 0);
        assert_eq!(
            admitted(&mut b, 5, 1_500),
            0,
            "connected but without a share"
        );
        b.set_connected(false);
        assert_eq!(admitted(&mut b, 100, 2_000), 7);
        assert_eq!(
            admitted(&mut b, 100, 60_000),
            0,
            "the allowance is per disconnection"
        );
        b.set_connected(true);
        b.set_connected(false);
        assert_eq!(admitted(&mut b, 100, 61_000), 7);
    }

    #[test]
    fn retry_at_is_the_next_refill_or_the_expected_lease_or_unknown() {
        let mut b = Bucket::new(0, 0);
        b.add(share(0, 2_000, 10, 20), 0);
        assert_eq!(
            b.try_take(1, 0),
            Err(Refusal {
                retry_at_ms: Some(100)
            })
        );
        assert_eq!(
            b.try_take(3, 50),
            Err(Refusal {
                retry_at_ms: Some(300)
            })
        );
        // Cost above the burst share can never be refilled under this lease.
        assert_eq!(b.try_take(50, 100), Err(Refusal { retry_at_ms: None }));
        b.set_expected(Some(Expected {
            at_ms: 1_200,
            rate_milli: 0,
        }));
        assert_eq!(
            b.try_take(50, 100),
            Err(Refusal {
                retry_at_ms: Some(1_200)
            })
        );
    }

    /// A proxy waiting for a share: a retry is worth it once the share is expected *and* has
    /// refilled one request's worth (a new share starts empty), not at once.
    #[test]
    fn retry_at_while_waiting_for_a_share_includes_its_first_refill() {
        let mut b = Bucket::new(0, 0);
        b.set_expected(Some(Expected {
            at_ms: 750,
            rate_milli: 4_000,
        }));
        assert_eq!(
            b.try_take(1, 100),
            Err(Refusal {
                retry_at_ms: Some(1_000)
            }),
            "at 750 ms, then 250 ms for one request at 4/s"
        );
        assert_eq!(
            b.try_take(1, 900),
            Err(Refusal {
                retry_at_ms: Some(1_150)
            }),
            "an expectation already due counts from now"
        );
    }

    /// At the largest R and B a quota may have, three proxies' shares and the bucket's sums
    /// stay exact: a request is admitted as soon as one request's worth has refilled.
    #[test]
    fn the_largest_quota_admits_without_overflow() {
        let max = lock_core::wire::MAX_QUOTA_BURST;
        let mut b = Bucket::new(0, 0);
        for i in 0..3 {
            // Three chains of a third each (the most a proxy can hold of one pool).
            b.add(share(0, 10_000 + i, max / 3, max / 3), 0);
        }
        assert_eq!(b.burst_at(1), max / 3 * 3 * 1_000);
        assert_eq!(b.try_take(1, 1), Ok(()), "1e12/s refills in a millisecond");
        assert_eq!(b.try_take(max / 2, 5_000), Ok(()), "half the burst");
    }

    #[test]
    fn weighted_cost_takes_that_many_tokens() {
        let mut b = Bucket::new(0, 0);
        b.add(share(0, 10_000, 10, 20), 0);
        assert_eq!(b.try_take(5, 2_000), Ok(()));
        assert_eq!(b.balance(), 15);
    }

    /// Admissions over any window are at most rate·t + burst, whatever the request pattern
    /// and however renewals, shrinks and gaps interleave.
    #[test]
    fn admissions_never_exceed_rate_times_time_plus_burst() {
        let mut b = Bucket::new(0, 0);
        // 10/s burst 20 for 0..2 s, successor 10/s for 2..4 s, smaller 4..6 s, gap, fresh.
        b.add(share(0, 2_000, 10, 20), 0);
        b.add(share(2_000, 4_000, 10, 20), 1_000);
        b.add(share(4_000, 6_000, 4, 8), 3_000);
        b.add(share(7_000, 9_000, 10, 20), 6_500);
        let mut log = Vec::new();
        for t in (0..9_000).step_by(7) {
            if b.try_take(1, t).is_ok() {
                log.push(t);
            }
        }
        for (i, &start) in log.iter().enumerate() {
            for (j, &end) in log.iter().enumerate().skip(i) {
                let count = (j - i + 1) as u64;
                // Upper bound with the largest shares: 10/s and burst 20.
                let bound = 20 + (end - start) * 10 / 1_000 + 1;
                assert!(count <= bound, "{count} in [{start}, {end}] > {bound}");
            }
        }
        assert!(!log.is_empty());
    }
}
