//! Global rate limits at the proxy: a pure token bucket per (quota, tenant) pool ([`bucket`])
//! fed with shares leased from the cluster's quota ledger by a background lessor
//! ([`limiter`]), which reports the pool's demand measured by a pure [`demand`] meter. See
//! docs/quotas.md.

pub mod bucket;
pub mod demand;
pub mod limiter;

pub use limiter::{Limited, QuotaLimiter};
