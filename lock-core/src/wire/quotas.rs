//! Bodies of the operator's quota endpoints: `GET /v1/admin/quotas` (the definitions, the
//! shares leased to each proxy, utilisation) and `PUT /v1/admin/quotas/{name}` (change a
//! quota at run time). See docs/quotas.md.

use serde::{Deserialize, Serialize};

/// A quota's definition as operators see and set it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaDefinition {
    pub name: String,
    /// Global refill rate R per tenant, requests per second.
    pub rate_per_s: u64,
    /// Global burst B per tenant, requests.
    pub burst: u64,
    /// How long one leased share lasts.
    pub lease_ms: u64,
    /// `strict` or `emergency`.
    pub policy: String,
    /// Emergency allowance E per proxy (0 under `strict`).
    pub allowance: u64,
    /// Set by an operator at run time: the proxies' config files no longer change it.
    pub set_at_run_time: bool,
}

/// One proxy's share of one tenant's pool, summed over the leases that count now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuotaShareView {
    pub tenant: String,
    /// The proxy's node id.
    pub proxy: u64,
    /// Requests per second.
    pub rate_per_s: f64,
    /// Requests.
    pub burst: f64,
    /// Leases that count now (at most three chains per proxy and pool).
    pub leases: usize,
    /// The latest end of those leases, log time (ms since the Unix epoch).
    pub expires_at_ms: u64,
    /// Requests per second the proxy last reported it was offered for this tenant.
    pub demand_per_s: f64,
}

/// A quota with its current shares.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuotaView {
    #[serde(flatten)]
    pub definition: QuotaDefinition,
    pub shares: Vec<QuotaShareView>,
    /// Per tenant: leased rate now / R, and reported demand / R.
    pub tenants: Vec<QuotaTenantView>,
}

/// A tenant's pool of one quota: how much of R is leased out and asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuotaTenantView {
    pub tenant: String,
    /// Sum of the rate shares that count now, over R.
    pub leased_fraction: f64,
    /// Sum of the proxies' reported demand, over R (above 1: the tenant wants more than R).
    pub demand_fraction: f64,
}

/// `GET /v1/admin/quotas`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuotaList {
    /// Log time the shares were read at (ms since the Unix epoch).
    pub now_ms: u64,
    /// Renewals whose successor was smaller, since the cluster began (capacity moved).
    pub rebalances: u64,
    pub quotas: Vec<QuotaView>,
}

/// `PUT /v1/admin/quotas/{name}`: the new definition, and who asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetQuotaRequest {
    #[serde(default)]
    pub operator: String,
    pub rate_per_s: u64,
    pub burst: u64,
    pub lease_ms: u64,
    /// `strict` (default) or `emergency`.
    #[serde(default)]
    pub policy: Option<String>,
    /// Emergency allowance E per proxy; required with `emergency`, refused with `strict`.
    #[serde(default)]
    pub allowance: Option<u64>,
}

/// Bounds on a quota lease: long enough for a commit round trip and renewing at half time,
/// short enough that a stopped proxy's share comes back soon.
pub const MIN_QUOTA_LEASE_MS: u64 = 500;
pub const MAX_QUOTA_LEASE_MS: u64 = 60_000;
/// Largest R (requests per second) and B (requests) of a quota: a proxy's bucket counts in
/// millionths of a request in 64 bits, and every sum of shares must fit.
pub const MAX_QUOTA_RATE_PER_S: u64 = 1_000_000_000_000;
pub const MAX_QUOTA_BURST: u64 = 1_000_000_000_000;
/// Longest quota name (names appear in metric labels and the ledger).
pub const MAX_QUOTA_NAME_LEN: usize = 64;
