//! Client-wide options and per-acquire options.

use std::time::Duration;

/// Options for a [`Client`](super::Client). Start from `ClientOptions::default()` and set
/// the fields you need.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Longest one HTTP attempt may take (connect + answer). Keep it above the server's
    /// `write_timeout_ms` (2 s by default) so a slow commit is answered with `503` rather than
    /// cut off. Renewals cap it further at the guard's local deadline. Default 3 s.
    pub request_timeout: Duration,
    /// How long one logical call (acquire beyond its wait, renew, release) keeps retrying
    /// uncertain failures before giving up with [`Error::Timeout`](super::Error::Timeout).
    /// Default 10 s.
    pub call_timeout: Duration,
    /// Fixed part of the safety margin subtracted from every lease's local deadline: covers
    /// timer lateness, scheduling delays and the time between checking the guard and acting.
    /// Default 200 ms. See `docs/client.md`.
    pub safety_margin: Duration,
    /// Part of the safety margin proportional to the TTL: covers the client's and the
    /// leader's clocks running at slightly different rates. Default 0.01 (1 % of the TTL).
    pub safety_margin_ratio: f64,
    /// First retry backoff; doubles per attempt up to `backoff_max`, with jitter. Default 50 ms.
    pub backoff_base: Duration,
    /// Longest retry backoff. Default 1 s.
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
    /// The margin for a lease of `ttl`: `safety_margin + ttl × safety_margin_ratio`.
    pub fn margin_for(&self, ttl: Duration) -> Duration {
        let ratio = self.safety_margin_ratio.clamp(0.0, 1.0);
        self.safety_margin + ttl.mul_f64(ratio)
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
    /// with [`Error::LockHeld`](super::Error::LockHeld).
    pub wait_timeout: Duration,
    /// A free-form name shown in the admin UI and `GET /v1/locks/{resource}`.
    pub holder: Option<String>,
    /// Total time the acquire may take, waiting included. `None` means
    /// `wait_timeout + ClientOptions::call_timeout`.
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
