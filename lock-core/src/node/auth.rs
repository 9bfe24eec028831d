//! Who is calling: API keys checked against the replicated key table, the bootstrap admin
//! credential, and the per-tenant request rate.
//!
//! Keys are `fgk_<id>_<secret>` with 64 random bits of id and 256 random bits of secret. The
//! table stores SHA-256 of the whole key. A fast hash is enough here: a slow KDF (argon2,
//! bcrypt) exists to make guessing *low-entropy* passwords from a stolen digest expensive, but
//! a 256-bit random secret cannot be guessed at any speed, and a slow hash would cost every
//! call milliseconds of CPU. The id in the key finds the record; the digests are then compared
//! in constant time, so timing tells nothing about how much of a guess was right.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Node;
use crate::machine::TenantLimits;
use crate::wire::{api_key_id, KeyRole, API_KEY_PREFIX, DEFAULT_TENANT};

/// Whether the public API requires API keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every `/v1` call needs `Authorization: Bearer <api key>`; tenants are kept apart.
    On,
    /// The lock API is open: one implicit tenant, as before keys existed.
    #[default]
    Off,
}

/// Per-tenant bounds, applied with authentication on.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantPolicy {
    /// Leases one tenant may hold at once (cluster-wide, in the replicated state).
    pub max_leases: u32,
    /// Waiting acquires one tenant may have at once (cluster-wide).
    pub max_waiters: u32,
    /// Lock calls per second one tenant may make *to one node* (a local token bucket per
    /// tenant on each node, so the cluster-wide rate is up to this times the node count);
    /// 0 turns the rate limit off.
    pub rate_per_s: u32,
    /// Calls a tenant may make at once beyond its rate (the bucket's size).
    pub burst: u32,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        TenantPolicy {
            max_leases: 100_000,
            max_waiters: 100_000,
            rate_per_s: 10_000,
            burst: 20_000,
        }
    }
}

impl TenantPolicy {
    pub fn limits(&self) -> TenantLimits {
        TenantLimits {
            max_leases: self.max_leases,
            max_waiters: self.max_waiters,
        }
    }
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    pub role: KeyRole,
    /// The key's id; `None` for the bootstrap admin credential from the node's config.
    pub key_id: Option<String>,
}

impl Caller {
    /// How the audit log names the caller: the key id, never the key.
    pub fn audit_name(&self) -> String {
        match &self.key_id {
            Some(id) => format!("key:{id}"),
            None => "key:bootstrap".to_string(),
        }
    }
}

/// Why a call was not authenticated (the metric label and audit outcome).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A bearer value that is no key of this cluster (unknown id, revoked, wrong secret).
    Invalid,
    /// A valid key whose role does not allow the call.
    Role,
    /// A valid key sent with a request that names another tenant (the fencing proxy's tenant
    /// header): the key decides the tenant, and a request claiming another is refused.
    Tenant,
}

impl Denied {
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::Missing => "missing",
            Denied::Invalid => "invalid",
            Denied::Role => "role",
            Denied::Tenant => "tenant",
        }
    }
}

/// A new key: its id and the full secret key. Only the digest of the key is ever stored.
pub fn new_api_key() -> (String, String) {
    let id = format!("{:016x}", rand::random::<u64>());
    let secret: [u8; 32] = rand::random();
    let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let key = format!("{API_KEY_PREFIX}{id}_{secret}");
    (id, key)
}

/// SHA-256 of a key, lowercase hex: what the key table stores.
pub fn key_digest(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was
/// right.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Node {
    /// Whether the public API requires keys.
    pub fn auth_on(&self) -> bool {
        self.config.auth == AuthMode::On
    }

    /// The caller a bearer value stands for: a key in this node's copy of the replicated
    /// table, or the bootstrap admin credential (`admin_token`), which acts as an admin key of
    /// the default tenant so that the first keys can be created.
    pub fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, Denied> {
        let presented = bearer.ok_or(Denied::Missing)?;
        if let Some(id) = api_key_id(presented) {
            let digest = key_digest(presented);
            let found = self.machine.read(|m| {
                m.api_key(id)
                    .filter(|k| constant_time_eq(k.digest.as_bytes(), digest.as_bytes()))
                    .map(|k| (k.tenant.clone(), k.role))
            });
            if let Some((tenant, role)) = found {
                return Ok(Caller {
                    tenant,
                    role,
                    key_id: Some(id.to_string()),
                });
            }
        }
        match self.config.admin_token.as_deref() {
            Some(admin) if constant_time_eq(presented.as_bytes(), admin.as_bytes()) => Ok(Caller {
                tenant: DEFAULT_TENANT.to_string(),
                role: KeyRole::Admin,
                key_id: None,
            }),
            _ => Err(Denied::Invalid),
        }
    }

    /// Counts a refused call and writes it to the audit log: the key id when the value had
    /// the shape of a key, never the value itself.
    pub fn record_denied(&self, denied: Denied, method: &str, path: &str, bearer: Option<&str>) {
        self.metrics
            .auth_denied
            .with_label_values(&[denied.reason()])
            .inc();
        let caller = bearer.map(|b| match api_key_id(b) {
            Some(id) => format!("key:{id}"),
            None => format!("digest:{}", &key_digest(b)[..16]),
        });
        self.record_denial(denied.reason(), caller, format!("{method} {path}"));
    }
}

/// A token bucket per tenant, local to this node.
#[derive(Default)]
pub struct TenantRates {
    buckets: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl TenantRates {
    /// Takes one call from `tenant`'s bucket, or says in how many ms one is available.
    pub fn take(&self, tenant: &str, policy: &TenantPolicy, now: Instant) -> Result<(), u64> {
        if policy.rate_per_s == 0 {
            return Ok(());
        }
        let rate = f64::from(policy.rate_per_s);
        let size = f64::from(policy.burst.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = buckets.entry(tenant.to_string()).or_insert(Bucket {
            tokens: size,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * rate).min(size);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err((((1.0 - b.tokens) / rate) * 1000.0).ceil() as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn new_keys_are_well_formed_and_distinct() {
        let (id, key) = new_api_key();
        assert_eq!(api_key_id(&key), Some(id.as_str()));
        let (_, other) = new_api_key();
        assert_ne!(key, other);
        assert_eq!(key_digest(&key).len(), 64);
        assert!(!key_digest(&key).contains(&key[4..20]));
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let rates = TenantRates::default();
        let policy = TenantPolicy {
            rate_per_s: 10,
            burst: 3,
            ..TenantPolicy::default()
        };
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(rates.take("a", &policy, t0), Ok(()));
        }
        let wait = rates.take("a", &policy, t0).expect_err("burst used up");
        assert_eq!(wait, 100);
        // Another tenant has its own bucket.
        assert_eq!(rates.take("b", &policy, t0), Ok(()));
        // A tenth of a second later one call is back, not more.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(rates.take("a", &policy, t1), Ok(()));
        assert!(rates.take("a", &policy, t1).is_err());
    }
}
