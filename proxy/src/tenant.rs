//! Whose request it is: where a route takes the tenant from, and the API-key check of routes
//! that take it from the key.
//!
//! A route's tenant names the idempotency records and quota buckets a request uses and, for
//! fenced routes, the namespace its resource is fenced in. It comes from one of two sources:
//!
//! - `header`: a request header the client sets (`X-Tenant` by default). Anyone who can reach
//!   the proxy can name any tenant; right for an open cluster (`auth = "off"`), where the lock
//!   API has one implicit tenant anyway.
//! - `api_key`: the tenant of the API key in `Authorization: Bearer fgk_...`, checked against
//!   the node's copy of the replicated key table exactly as the node's API checks it. A client
//!   can then use only its own tenant's records, quota and locks.
//!
//! A route that does not say follows the node: keys on means tenant from the key.

use lock_core::node::{Caller, Denied, Node};
use pingora::http::RequestHeader;
use serde::{Deserialize, Serialize};

use crate::route::RouteConfig;

/// Where a route takes a request's tenant from (`tenant = "header" | "api_key"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TenantSource {
    /// The route's tenant header, chosen by the client.
    Header,
    /// The tenant of the request's API key.
    ApiKey,
}

impl TenantSource {
    pub fn as_str(&self) -> &'static str {
        match self {
            TenantSource::Header => "header",
            TenantSource::ApiKey => "api_key",
        }
    }
}

impl RouteConfig {
    /// The route's tenant source on a node with keys on (`auth_on`) or off: what the route
    /// says, else the key's tenant exactly when the node checks keys.
    pub fn tenant_source(&self, auth_on: bool) -> TenantSource {
        self.tenant.unwrap_or(if auth_on {
            TenantSource::ApiKey
        } else {
            TenantSource::Header
        })
    }

    /// The headers a client could name a tenant with on this route (the quota's and the
    /// idempotency records'; usually both `X-Tenant`).
    pub fn tenant_headers(&self) -> impl Iterator<Item = &str> {
        let quota = self.tenant_header.as_str();
        let idem = self.idempotency_options.tenant_header.as_str();
        std::iter::once(quota).chain((!idem.eq_ignore_ascii_case(quota)).then_some(idem))
    }
}

/// The bearer value of `Authorization: Bearer <key>`, as the node's API reads it.
/// The header that carries the API key to the proxy when `Authorization` is the store's (an S3
/// signature, a store's own password): the key alone or as `Bearer <key>`. The proxy takes it
/// off the request it forwards, and then leaves `Authorization` as the client sent it.
pub const KEY_HEADER: &str = "fencegate-key";

/// Whether header `n` is `name` as a store may read it: any case, and `_` for `-` (CGI-style
/// servers — WSGI, Rack, PHP — read `Fence_Token` and `Fence-Token` as one variable).
pub(crate) fn spelled_as(n: &str, name: &str) -> bool {
    n.len() == name.len()
        && n.bytes().zip(name.bytes()).all(|(a, b)| {
            let a = if a == b'_' { b'-' } else { a };
            a.eq_ignore_ascii_case(&b)
        })
}

/// The key a request presents: `Fencegate-Key` if it has one, else `Authorization: Bearer`.
/// Two copies of `Fencegate-Key` (in any spelling) present no valid key: which one a store or
/// another proxy would read is anyone's guess.
fn bearer(req: &RequestHeader) -> Option<&str> {
    let mut keys = req
        .headers
        .iter()
        .filter(|(n, _)| spelled_as(n.as_str(), KEY_HEADER));
    if let Some((_, value)) = keys.next() {
        if keys.next().is_some() {
            return Some("");
        }
        let value = value.to_str().ok()?.trim();
        return Some(lock_core::wire::headers::bearer_token(value).unwrap_or(value));
    }
    req.headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(lock_core::wire::headers::bearer_token)
}

/// Whether the request's key came in `Authorization` (which is then the proxy's, not the
/// store's, and is not forwarded).
pub fn key_in_authorization(req: &RequestHeader) -> bool {
    !req.headers
        .keys()
        .any(|n| spelled_as(n.as_str(), KEY_HEADER))
}

/// Whether a request header must not reach the store: `Fencegate-Key` in any spelling, and an
/// `Authorization` that carried the request's key (`key_route` and no `Fencegate-Key`) or holds
/// one of this cluster's API keys.
pub fn withheld_from_store(
    name: &str,
    value: &[u8],
    key_route: bool,
    key_in_authorization: bool,
) -> bool {
    if spelled_as(name, KEY_HEADER) {
        return true;
    }
    if !name.eq_ignore_ascii_case("authorization") {
        return false;
    }
    let cluster_key = std::str::from_utf8(value)
        .ok()
        .and_then(lock_core::wire::headers::bearer_token)
        .is_some_and(|k| k.starts_with(lock_core::wire::API_KEY_PREFIX));
    cluster_key || (key_route && key_in_authorization)
}

/// Authenticates a request on a route that takes its tenant from the key: the key must be in
/// the node's key table (or be the bootstrap admin credential), and every tenant header the
/// request carries must name the key's own tenant. Both roles may write through the proxy.
/// A refusal is counted and audited like the node API's, naming the key by its id only.
pub fn authenticate(
    node: &Node,
    route: &RouteConfig,
    req: &RequestHeader,
) -> Result<Caller, Denied> {
    let presented = bearer(req);
    let checked = node.authenticate(presented).and_then(|caller| {
        if names_another_tenant(route, req, &caller.tenant) {
            Err(Denied::Tenant)
        } else {
            Ok(caller)
        }
    });
    if let Err(denied) = checked {
        let path = format!("{} (fencing proxy)", req.uri.path());
        node.record_denied(denied, req.method.as_str(), &path, presented);
    }
    checked
}

/// Whether any copy of any of the route's tenant headers names another tenant than `tenant`
/// (every copy counts: a store may read another one than the proxy did).
fn names_another_tenant(route: &RouteConfig, req: &RequestHeader, tenant: &str) -> bool {
    route.tenant_headers().any(|name| {
        req.headers
            .get_all(name)
            .iter()
            .any(|v| v.as_bytes() != tenant.as_bytes())
    })
}

/// The sentence a refused client reads.
pub fn refusal_message(denied: Denied, route: &RouteConfig) -> String {
    match denied {
        Denied::Missing => "This proxy route takes the tenant from an API key: send \
                            'Authorization: Bearer <api key>', or 'Fencegate-Key: <api key>' \
                            when Authorization is the store's (an admin creates keys with \
                            'fencegate keys create')."
            .to_string(),
        Denied::Invalid => {
            "The API key is not valid here (unknown, revoked or mistyped); nothing was forwarded."
                .to_string()
        }
        Denied::Role => {
            "This API key's role may not use this route; nothing was forwarded.".to_string()
        }
        Denied::Tenant => format!(
            "The request's {} header names another tenant than its API key: the key decides \
             the tenant. Drop the header or send the key's tenant; nothing was forwarded.",
            route.tenant_headers().collect::<Vec<_>>().join(" / ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_follows_the_node_unless_it_says_otherwise() {
        let mut route = RouteConfig::new("/kv/{key}", "kv:{key}", "127.0.0.1:9");
        assert_eq!(route.tenant_source(false), TenantSource::Header);
        assert_eq!(route.tenant_source(true), TenantSource::ApiKey);
        route.tenant = Some(TenantSource::Header);
        assert_eq!(route.tenant_source(true), TenantSource::Header);
        route.tenant = Some(TenantSource::ApiKey);
        assert_eq!(route.tenant_source(false), TenantSource::ApiKey);
    }

    #[test]
    fn every_copy_of_every_tenant_header_must_name_the_keys_tenant() {
        let mut route = RouteConfig::new("/o", "o", "127.0.0.1:9");
        route.idempotency_options.tenant_header = "X-Org".into();
        let request = |headers: &[(&'static str, &'static str)]| {
            let mut req = RequestHeader::build("POST", b"/o", None).expect("head");
            for (n, v) in headers {
                req.append_header(*n, *v).expect("header");
            }
            req
        };
        let check = |headers| names_another_tenant(&route, &request(headers), "acme");
        assert!(!check(&[]));
        assert!(!check(&[("x-tenant", "acme"), ("x-org", "acme")]));
        assert!(check(&[("x-tenant", "bolt")]));
        assert!(check(&[("x-org", "bolt")]));
        assert!(check(&[("x-tenant", "acme"), ("x-tenant", "bolt")]));
        assert!(check(&[("x-tenant", "ACME")]));
        assert!(check(&[("x-tenant", "")]));
    }

    #[test]
    fn tenant_headers_are_listed_once() {
        let mut route = RouteConfig::new("/kv/{key}", "kv:{key}", "127.0.0.1:9");
        assert_eq!(route.tenant_headers().collect::<Vec<_>>(), ["X-Tenant"]);
        route.idempotency_options.tenant_header = "x-tenant".into();
        assert_eq!(route.tenant_headers().collect::<Vec<_>>(), ["X-Tenant"]);
        route.idempotency_options.tenant_header = "X-Org".into();
        assert_eq!(
            route.tenant_headers().collect::<Vec<_>>(),
            ["X-Tenant", "X-Org"]
        );
    }
}
