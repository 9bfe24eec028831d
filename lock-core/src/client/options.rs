//! Client-wide options and per-acquire options.

use std::time::Duration;

/// Options for a [`Client`](super::Client). Start from `ClientOptions::default()` and set
/// the fields you need.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Longest one HTTP attempt may take (connect + answer). Keep it above the server's
    /// `write_timeout_ms` (2 s by default) so a slow commit is answered with `503` rather than
    /// cut off. Renewals cap it further at the guard's local deadline. Default 3 s; must be
    /// positive. A huge value (even `Duration::MAX`) means "no bound" and is safe.
    pub request_timeout: Duration,
    /// How long one logical call (acquire beyond its wait, renew, release) keeps retrying
    /// uncertain failures before giving up with [`Error::Timeout`](super::Error::Timeout).
    /// Default 10 s; must be positive. A huge value (even `Duration::MAX`) means "no bound".
    pub call_timeout: Duration,
    /// Fixed part of the safety margin subtracted from every lease's local deadline: covers
    /// timer lateness, scheduling delays and the time between checking the guard and acting.
    /// Default 200 ms. See `docs/client.md`.
    pub safety_margin: Duration,
    /// Part of the safety margin proportional to the TTL: covers the client's and the
    /// leader's clocks running at slightly different rates. Default 0.01 (1 % of the TTL);
    /// must be a number from 0 up to (not including) 0.5.
    pub safety_margin_ratio: f64,
    /// First retry backoff; doubles per attempt up to `backoff_max`, with jitter. Default 50 ms;
    /// must be positive.
    pub backoff_base: Duration,
    /// Longest retry backoff. Default 1 s; must be at least `backoff_base`.
    pub backoff_max: Duration,
    /// The API key sent as `Authorization: Bearer` on every call, for a cluster that requires
    /// keys. Default none.
    pub api_key: Option<String>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("request_timeout", &self.request_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("safety_margin", &self.safety_margin)
            .field("safety_margin_ratio", &self.safety_margin_ratio)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            // A bearer credential: debug output ends up in logs.
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(3),
            call_timeout: Duration::from_secs(10),
            safety_margin: Duration::from_millis(200),
            safety_margin_ratio: 0.01,
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
            api_key: None,
        }
    }
}

impl ClientOptions {
    /// The margin for a lease of `ttl`: `safety_margin + ttl × safety_margin_ratio`, saturating
    /// at `Duration::MAX`. A ratio that is not a number counts as 1 (the whole TTL), the most
    /// conservative reading; [`Client::with_options`](super::Client::with_options) refuses one.
    pub fn margin_for(&self, ttl: Duration) -> Duration {
        let ratio = if self.safety_margin_ratio.is_nan() {
            1.0
        } else {
            self.safety_margin_ratio.clamp(0.0, 1.0)
        };
        // `mul_f64` panics when rounding takes the product past `Duration::MAX`; a ratio of at
        // most 1 keeps it at most `ttl` otherwise.
        let part =
            Duration::try_from_secs_f64(ttl.as_secs_f64() * ratio).map_or(ttl, |p| p.min(ttl));
        self.safety_margin.saturating_add(part)
    }

    /// Refuses values that make no sense, with a sentence naming the field. Huge durations are
    /// fine: they mean "no bound" and every sum with them saturates.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.request_timeout.is_zero() || self.call_timeout.is_zero() {
            return Err("request_timeout and call_timeout must be positive".into());
        }
        let ratio = self.safety_margin_ratio;
        if !(0.0..0.5).contains(&ratio) {
            return Err(format!(
                "safety_margin_ratio must be a number from 0 up to (not including) 0.5, not \
                 {ratio}: the margin is a share of the TTL, and a TTL must be at least twice its \
                 margin"
            ));
        }
        if self.backoff_base.is_zero() || self.backoff_max.is_zero() {
            return Err(
                "backoff_base and backoff_max must be positive: without a pause between retries \
                 a call would hammer the nodes in a tight loop"
                    .into(),
            );
        }
        if self.backoff_max < self.backoff_base {
            return Err(format!(
                "backoff_max ({:?}) must be at least backoff_base ({:?})",
                self.backoff_max, self.backoff_base
            ));
        }
        Ok(())
    }
}

/// What to acquire and how long to try. `AcquireOptions::default()` asks for the server's
/// default TTL and does not wait.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// Lease TTL; `None` takes the server's policy default (30 s unless configured).
    pub ttl: Option<Duration>,
    /// Queue for the lock for up to this long if it is held; zero means try once and fail
    /// with [`Error::LockHeld`](super::Error::LockHeld). The server bounds it (5 min by
    /// default) and refuses a longer wait with `400 invalid_request`
    /// ([`Error::Api`](super::Error::Api)).
    pub wait_timeout: Duration,
    /// A free-form name shown in the admin UI and `GET /v1/locks/{resource}`.
    pub holder: Option<String>,
    /// Total time the acquire may take, waiting included. `None` means
    /// `wait_timeout + ClientOptions::call_timeout`. Zero is refused with
    /// [`Error::Invalid`](super::Error::Invalid); a huge value (even `Duration::MAX`) means
    /// "no bound".
    pub deadline: Option<Duration>,
    /// The idempotency key of this logical acquire. `None` draws a fresh random 128-bit id.
    /// Pass your own only to continue an acquire across process restarts.
    pub request_id: Option<String>,
}

impl AcquireOptions {
    /// Options with a TTL and no waiting.
    pub fn new(ttl: Duration) -> Self {
        AcquireOptions {
            ttl: Some(ttl),
            ..Default::default()
        }
    }

    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.wait_timeout = wait;
        self
    }

    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    type Case = (&'static str, fn(&mut ClientOptions));

    #[test]
    fn margin_for_never_panics() {
        let ttl = Duration::from_secs(30);
        let mut o = ClientOptions::default();
        assert_eq!(o.margin_for(ttl), Duration::from_millis(500));
        o.safety_margin = Duration::MAX;
        assert_eq!(o.margin_for(ttl), Duration::MAX);
        o.safety_margin = Duration::ZERO;
        o.safety_margin_ratio = f64::NAN;
        assert_eq!(o.margin_for(ttl), ttl);
        o.safety_margin_ratio = f64::INFINITY;
        assert_eq!(o.margin_for(Duration::MAX), Duration::MAX);
        o.safety_margin_ratio = -1.0;
        assert_eq!(o.margin_for(ttl), Duration::ZERO);
    }

    #[test]
    fn options_that_make_no_sense_are_refused_with_the_field_named() {
        assert_eq!(ClientOptions::default().validate(), Ok(()));
        let cases: [Case; 8] = [
            ("safety_margin_ratio", |o| o.safety_margin_ratio = f64::NAN),
            ("safety_margin_ratio", |o| o.safety_margin_ratio = -0.1),
            ("safety_margin_ratio", |o| o.safety_margin_ratio = 0.5),
            ("safety_margin_ratio", |o| {
                o.safety_margin_ratio = f64::INFINITY
            }),
            ("backoff_base", |o| o.backoff_base = Duration::ZERO),
            ("backoff_max", |o| o.backoff_max = Duration::ZERO),
            ("backoff_max", |o| o.backoff_max = Duration::from_millis(10)),
            ("call_timeout", |o| o.call_timeout = Duration::ZERO),
        ];
        for (field, set) in cases {
            let mut o = ClientOptions::default();
            set(&mut o);
            let why = o.validate().expect_err(field);
            assert!(why.contains(field), "{why}");
        }
        // "Forever" is a value, not an error.
        let o = ClientOptions {
            request_timeout: Duration::MAX,
            call_timeout: Duration::MAX,
            safety_margin: Duration::MAX,
            backoff_max: Duration::MAX,
            ..Default::default()
        };
        assert_eq!(o.validate(), Ok(()));
    }
}
