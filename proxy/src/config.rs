//! Proxy configuration (the `[proxy]` table of a node's config file).

use std::collections::HashMap;

use lock_core::machine::{QuotaPolicy, QuotaSpec};
use lock_core::node::TlsFiles;
use serde::{Deserialize, Serialize};

use crate::conn_limits::ProxyLimits;
use crate::idempotency::{IdempotencyMode, IdempotencyOptions};
use crate::route::RouteConfig;
use crate::tenant::TenantSource;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Address the proxy listens on.
    pub listen: String,
    /// How long one admission lets this proxy forward a token's writes without asking the
    /// cluster again (capped at the lease's expiry). Must exceed every route's upstream
    /// timeout; a release defers the next lease of the resource by at most this much.
    #[serde(default = "default_grant_ms")]
    pub grant_ms: u64,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Global rate limits routes can refer to by name (see docs/quotas.md).
    #[serde(default, deserialize_with = "quota_entries")]
    pub quotas: Vec<QuotaSpec>,
    /// DEMONSTRATIONS ONLY: forward every request of a matched route without any fence check
    /// (lease-only locking, like a bare Redis lock). The chaos harness uses it to show what the
    /// fence prevents. Never enable in production.
    #[serde(default)]
    pub unsafe_no_fencing: bool,
    /// DEMONSTRATIONS ONLY: forward requests on idempotent routes without reading or writing
    /// any `Idempotency-Key` record, so a retried request runs again. The chaos harness uses it
    /// to show that its checker catches duplicate effects. Never enable in production.
    #[serde(default)]
    pub unsafe_no_idempotency: bool,
    /// DEMONSTRATIONS ONLY: refill a rate-limit bucket to its burst share whenever a quota
    /// lease is renewed, breaking the bound on what the proxies admit together. The chaos
    /// harness uses it to show that its quota check can fail. Never enable in production.
    #[serde(default)]
    pub unsafe_refill_on_renew: bool,
    /// Serve the proxy over TLS with this certificate (`[proxy.tls]`; plain HTTP without).
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// The listener's connection cap and request-head deadline (`[proxy.limits]`).
    #[serde(default)]
    pub limits: ProxyLimits,
}

/// A `[[proxy.quotas]]` entry as written: `policy` is optional (`strict`) and `allowance` goes
/// with `emergency`, checked by the same function as an operator's change.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaEntry {
    name: String,
    rate_per_s: u64,
    burst: u64,
    lease_ms: u64,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    allowance: Option<u64>,
}

fn quota_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<QuotaSpec>, D::Error> {
    Vec::<QuotaEntry>::deserialize(d)?
        .into_iter()
        .map(|q| {
            let policy = QuotaPolicy::from_parts(q.policy.as_deref(), q.allowance)
                .map_err(|e| serde::de::Error::custom(format!("quota {}: {e}", q.name)))?;
            Ok(QuotaSpec {
                name: q.name,
                rate_per_s: q.rate_per_s,
                burst: q.burst,
                lease_ms: q.lease_ms,
                policy,
            })
        })
        .collect()
}

/// Longest admission grant: how long a release waits at most for a proxy that cannot confirm
/// it stopped forwarding the released token.
pub const MAX_GRANT_MS: u64 = 5_000;

/// The quota of `fencegate dev`'s `/limited/{key}` route.
pub const DEV_QUOTA: &str = "limited";

fn default_grant_ms() -> u64 {
    2_000
}

impl ProxyConfig {
    /// The `fencegate dev` routes: `/kv/{key}` to the demo store, fenced on `kv:{key}`; and
    /// `/orders` to the demo store's create-order endpoint, not fenced, with `Idempotency-Key`
    /// required (tenant from `X-Tenant`, default `demo`) and lost answers reconciled through
    /// `GET /orders/by-key/{key}`; and `/limited/{key}` to the demo store, not fenced, limited
    /// per tenant (`X-Tenant`, default `demo`) to 100 requests/s with a burst of 200 across all
    /// proxies of the cluster, `strict`. The routes do not name a tenant source, so on nodes
    /// with keys on (`fencegate dev --auth`) every tenant is the request's API key's instead.
    pub fn dev(listen: String, demo_store: String) -> Self {
        ProxyConfig {
            listen,
            grant_ms: default_grant_ms(),
            unsafe_no_fencing: false,
            unsafe_no_idempotency: false,
            unsafe_refill_on_renew: false,
            tls: None,
            limits: ProxyLimits::default(),
            routes: vec![
                RouteConfig::new("/kv/{key}", "kv:{key}", &demo_store),
                RouteConfig {
                    protected_methods: Vec::new(),
                    idempotency: IdempotencyMode::Required,
                    idempotency_options: IdempotencyOptions {
                        reconcile: Some("/orders/by-key/{key}".into()),
                        ..IdempotencyOptions::default()
                    },
                    ..RouteConfig::new("/orders", "orders", &demo_store)
                },
                RouteConfig {
                    protected_methods: Vec::new(),
                    quota: Some(DEV_QUOTA.into()),
                    ..RouteConfig::new("/limited/{key}", "limited:{key}", &demo_store)
                },
            ],
            quotas: vec![QuotaSpec {
                name: DEV_QUOTA.into(),
                rate_per_s: 100,
                burst: 200,
                lease_ms: 2_000,
                policy: QuotaPolicy::Strict,
            }],
        }
    }

    /// Checks what serde cannot: the grant's bound and timeouts against the grant.
    pub fn validate(&self) -> Result<(), String> {
        // A release answers once the proxies confirmed its revocation, and waits at most this
        // long for a proxy that cannot confirm; the grant must be over by then.
        if self.grant_ms > MAX_GRANT_MS {
            return Err(format!(
                "grant_ms ({}) must be at most {MAX_GRANT_MS}",
                self.grant_ms
            ));
        }
        self.limits.validate()?;
        let mut quotas = HashMap::new();
        for q in &self.quotas {
            if quotas.insert(q.name.as_str(), q).is_some() {
                return Err(format!("quota names must be unique ('{}')", q.name));
            }
            q.validate()?;
        }
        for r in &self.routes {
            if let Some(q) = &r.quota {
                let Some(spec) = quotas.get(q.as_str()) else {
                    return Err(format!(
                        "route {}: quota '{q}' is not defined in quotas",
                        r.path
                    ));
                };
                // A request is admitted from one proxy's bucket, whose burst share is at most
                // B: a heavier request could never be admitted anywhere.
                if r.cost > spec.burst {
                    return Err(format!(
                        "route {}: cost ({}) is above the burst of quota '{q}' ({}), so no \
                         request could ever be admitted; raise the quota's burst or lower the \
                         cost",
                        r.path, r.cost, spec.burst
                    ));
                }
                if r.cost == 0 || r.tenant_header.trim().is_empty() {
                    return Err(format!(
                        "route {}: cost must be > 0 and tenant_header must name a header",
                        r.path
                    ));
                }
            }
            // Room for the 100 ms clock margin, the send slack and a commit round trip.
            if r.upstream_timeout_ms == 0 || r.upstream_timeout_ms + 500 > self.grant_ms {
                return Err(format!(
                    "route {}: upstream_timeout_ms ({}) must be > 0 and at least 500 ms below \
                     grant_ms ({})",
                    r.path, r.upstream_timeout_ms, self.grant_ms
                ));
            }
            let idem = &r.idempotency_options;
            if r.idempotency != IdempotencyMode::Off
                && (idem.retain_ms == 0 || idem.tenant_header.trim().is_empty())
            {
                return Err(format!(
                    "route {}: idempotency_options.retain_ms must be > 0 and tenant_header \
                     must name a header",
                    r.path
                ));
            }
        }
        // The patterns, methods and hosts, as the proxy compiles them when it starts: a route
        // it would refuse then is refused here, before anything starts.
        crate::route::Routes::new(self.routes.clone()).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Checks the routes' tenant sources against the node's authentication (`auth_on`: keys
    /// are checked) and returns one warning per route that lets clients name their tenant on
    /// a node that checks keys.
    pub fn check_tenants(&self, auth_on: bool) -> Result<Vec<String>, String> {
        let mut warnings = Vec::new();
        let mut quota_sources: HashMap<&str, (&str, TenantSource)> = HashMap::new();
        for r in &self.routes {
            let source = r.tenant_source(auth_on);
            if source == TenantSource::ApiKey && !auth_on {
                return Err(format!(
                    "route {}: tenant = \"api_key\" needs API keys, but the node has auth = \
                     \"off\"; set auth = \"on\" or take the tenant from a header \
                     (tenant = \"header\")",
                    r.path
                ));
            }
            if source == TenantSource::Header && auth_on {
                warnings.push(format!(
                    "route {}: tenant = \"header\" on a node with auth = \"on\": clients of \
                     this route choose their tenant ({}) for idempotency records and quotas, \
                     and its writes are fenced in the default tenant's namespace",
                    r.path, r.tenant_header
                ));
            }
            // A quota's buckets are per tenant: if one route names the tenant by key and another
            // by header, a header client could spend a keyed tenant's share.
            if let Some(q) = &r.quota {
                match quota_sources.get(q.as_str()) {
                    Some((other, s)) if *s != source => {
                        return Err(format!(
                            "quota '{q}' is used by route {other} (tenant from {}) and route {} \
                             (tenant from {}): its buckets would be shared by clients that \
                             name their tenant and clients whose key names it; give both \
                             routes the same tenant source or separate quotas",
                            s.as_str(),
                            r.path,
                            source.as_str()
                        ))
                    }
                    Some(_) => {}
                    None => {
                        quota_sources.insert(q, (&r.path, source));
                    }
                }
            }
        }
        Ok(warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::TenantSource;

    fn dev() -> ProxyConfig {
        ProxyConfig::dev("127.0.0.1:0".into(), "127.0.0.1:9".into())
    }

    #[test]
    fn routes_follow_the_nodes_auth_and_contradictions_stop_the_start() {
        // The dev routes say nothing: header tenants with keys off, key tenants with keys on.
        assert_eq!(dev().check_tenants(false), Ok(Vec::new()));
        assert_eq!(dev().check_tenants(true), Ok(Vec::new()));

        // A route that wants keys on a node that checks none.
        let mut keyed = dev();
        keyed.routes[0].tenant = Some(TenantSource::ApiKey);
        let err = keyed
            .check_tenants(false)
            .expect_err("api_key without auth");
        assert!(err.contains("/kv/{key}") && err.contains("auth"), "{err}");
        assert!(keyed.check_tenants(true).is_ok());

        // A header route on a node with keys on starts, with a warning naming the route.
        let mut open = dev();
        open.routes[1].tenant = Some(TenantSource::Header);
        let warnings = open.check_tenants(true).expect("allowed");
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("/orders"), "{warnings:?}");

        // One quota's buckets reached by key tenants and by header tenants.
        let mut mixed = dev();
        let mut second = mixed.routes[2].clone();
        second.path = "/limited2/{key}".into();
        second.tenant = Some(TenantSource::Header);
        mixed.routes.push(second);
        let err = mixed
            .check_tenants(true)
            .expect_err("mixed sources on one quota");
        assert!(err.contains("quota 'limited'"), "{err}");
        assert!(mixed.check_tenants(false).is_ok());
    }

    /// The config file and the admin API accept the same quota definitions: `policy` may be
    /// left out (strict), a strict quota has no allowance, an emergency one needs one > 0, R
    /// and B are bounded, and a route's cost fits its quota's burst.
    #[test]
    fn quota_entries_are_checked_like_the_admin_api_checks_them() {
        let text = |quota: &str| {
            format!(
                "listen = \"127.0.0.1:0\"\n[[routes]]\npath = \"/a/{{k}}\"\nresource = \"a:{{k}}\"\n\
                 upstream = \"127.0.0.1:9\"\nquota = \"q\"\n[[quotas]]\nname = \"q\"\n\
                 rate_per_s = 10\nlease_ms = 1000\n{quota}\n"
            )
        };
        let load = |quota: &str| {
            toml::from_str::<ProxyConfig>(&text(quota))
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map(|()| c))
        };
        let c = load("burst = 5").expect("policy defaults to strict");
        assert_eq!(c.quotas[0].policy, QuotaPolicy::Strict);
        let c = load("burst = 5\npolicy = \"emergency\"\nallowance = 3").expect("emergency");
        assert_eq!(c.quotas[0].policy, QuotaPolicy::Emergency { allowance: 3 });
        for bad in [
            "burst = 5\npolicy = \"emergency\"\nallowance = 0",
            "burst = 5\npolicy = \"emergency\"",
            "burst = 5\npolicy = \"strict\"\nallowance = 4",
            "burst = 5\npolicy = \"lenient\"",
            "burst = 5\nallowence = 4",
            "burst = 2000000000000",
        ] {
            let err = load(bad).expect_err(bad);
            assert!(
                err.contains("quota") || err.contains("unknown field"),
                "{bad}: {err}"
            );
        }
        let c = load("burst = 1").expect("cost 1 fits B = 1");
        let mut heavy = c.clone();
        heavy.routes[0].cost = 2;
        let err = heavy.validate().expect_err("cost above B");
        assert!(err.contains("cost (2)") && err.contains("burst"), "{err}");
    }

    #[test]
    fn the_tenant_source_is_read_from_the_route_table() {
        let text =
            "listen = \"127.0.0.1:0\"\n[[routes]]\npath = \"/a/{k}\"\nresource = \"a:{k}\"\n\
                    upstream = \"127.0.0.1:9\"\ntenant = \"api_key\"\n";
        let config: ProxyConfig = toml::from_str(text).expect("parses");
        assert_eq!(config.routes[0].tenant, Some(TenantSource::ApiKey));
        let bad = text.replace("api_key", "client");
        assert!(toml::from_str::<ProxyConfig>(&bad).is_err());
    }
}

/// A `[proxy]` table from a config file — arbitrary text, or TOML assembled from the real keys
/// with arbitrary values — parses and validates to a usable config or to an error, never a
/// panic.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::route::Routes;

    /// Parses, validates and compiles the routes, as a node's start does.
    fn load(text: &str) {
        if let Ok(config) = toml::from_str::<ProxyConfig>(text) {
            if config.validate().is_ok() {
                let _ = config.check_tenants(true);
                let _ = config.check_tenants(false);
                let _ = Routes::new(config.routes);
            }
        }
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            "[ -~]{0,12}".prop_map(|s| format!("{s:?}")),
            Just("true".to_string()),
            Just("[]".to_string()),
            Just("[\"GET\", \"PUT\"]".to_string()),
            Just("{}".to_string()),
        ]
    }

    fn line() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just("listen"),
            Just("grant_ms"),
            Just("unsafe_no_fencing"),
            Just("path"),
            Just("resource"),
            Just("upstream"),
            Just("upstream_timeout_ms"),
            Just("protected_methods"),
            Just("read_methods"),
            Just("idempotency"),
            Just("tenant_header"),
            Just("tenant"),
            Just("quota"),
            Just("cost"),
            Just("name"),
            Just("rate_per_s"),
            Just("burst"),
            Just("policy"),
            Just("lease_ms"),
            Just("max_connections"),
            Just("header_timeout_ms"),
        ];
        prop_oneof![
            (key, value()).prop_map(|(k, v)| format!("{k} = {v}")),
            Just("[[routes]]".to_string()),
            Just("[[quotas]]".to_string()),
            Just("[tls]".to_string()),
            Just("[limits]".to_string()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(lock_core::testkit::fuzz_cases(1_000)))]

        #[test]
        fn any_text_is_a_config_or_an_error(text in "\\PC{0,200}") {
            load(&text);
        }

        #[test]
        fn toml_from_real_keys_is_a_config_or_an_error(lines in proptest::collection::vec(line(), 0..16)) {
            load(&format!("listen = \"127.0.0.1:0\"\n{}", lines.join("\n")));
        }
    }
}
