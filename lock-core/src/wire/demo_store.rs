//! Bodies of the bundled demo store (`fencegate demo-store`), the token-blind upstream the
//! fencing proxy protects: its log of accepted writes is how tests and the chaos harness prove
//! what landed, and in which order.

use serde::{Deserialize, Serialize};

/// One accepted write, as `GET /log` lists them (in the order the store applied them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreLogEntry {
    /// Position in the log, from 1.
    pub seq: u64,
    pub key: String,
    /// The `Fence-Token` header the write carried: the store records it, it cannot check it.
    pub fence_token: Option<u64>,
    pub value: String,
    /// The `Idempotency-Key` header a created order carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The tenant a created order belongs to (`X-Tenant`, `demo` without one); only orders
    /// have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl StoreLogEntry {
    /// Whether the entry is a created order (`POST /orders`) rather than a key-value write.
    pub fn is_order(&self) -> bool {
        self.tenant.is_some()
    }
}

/// One created order, as `POST /orders` and `GET /orders/by-key/{key}` return it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// `ord-N`, unique in the store.
    pub id: String,
    /// `X-Tenant` of the post, `demo` without one.
    pub tenant: String,
    pub idempotency_key: Option<String>,
    pub body: String,
}

/// One request the store answered on its rate-limited route (`/limited/{key}`), as
/// `GET /limited-log` lists them: the record of what the proxies admitted, stamped with the
/// store's own clock, which is what the chaos harness judges a quota's bound by.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LimitedLogEntry {
    /// Position in the log, from 1 (entries dropped from a full log leave a gap).
    pub seq: u64,
    pub key: String,
    /// The `X-Tenant` header the request carried, if any.
    pub tenant: Option<String>,
    /// When the store received it: wall clock, ms since the Unix epoch (µs resolution).
    pub at_ms: f64,
}
