//! Routes: which upstream a request goes to and which resource its writes are fenced on.
//!
//! A route pattern is a path of literal segments, `{name}` captures (one segment each) and an
//! optional trailing `**` (any rest). The resource template uses the captures, e.g. pattern
//! `/accounts/{id}/**` with template `account:{id}`. The client never chooses the resource.

use serde::{Deserialize, Serialize};

use crate::idempotency::{IdempotencyMode, IdempotencyOptions};
use crate::tenant::TenantSource;

/// One configured route.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Path pattern, e.g. `/kv/{key}`.
    pub path: String,
    /// Resource template, e.g. `kv:{key}`.
    pub resource: String,
    /// `host:port` of the protected store.
    pub upstream: String,
    /// Methods that must carry a fencing token. Of HTTP's own methods (GET, HEAD, OPTIONS,
    /// TRACE, POST, PUT, PATCH, DELETE) the others pass unchecked; any other method (WebDAV's
    /// MOVE, COPY, MKCOL, PROPPATCH, LOCK, a custom one) is fenced too unless it is listed in
    /// `read_methods`: a method the proxy does not know is taken for a write.
    #[serde(default = "default_protected")]
    pub protected_methods: Vec<String>,
    /// Methods outside HTTP's own that only read (WebDAV's PROPFIND, REPORT, SEARCH) and pass
    /// unchecked.
    #[serde(default)]
    pub read_methods: Vec<String>,
    /// Bound on how long a forwarded request may wait for the upstream's response header
    /// (and on each read/write to it). The epoch barrier's guarantee is stated in terms of it.
    #[serde(default = "default_upstream_timeout")]
    pub upstream_timeout_ms: u64,
    /// `Idempotency-Key` handling on this route's writes: `required`, `optional` or `off`
    /// (default), and its settings (see docs/idempotency.md).
    #[serde(default)]
    pub idempotency: IdempotencyMode,
    #[serde(default)]
    pub idempotency_options: IdempotencyOptions,
    /// Name of a quota (from the proxy's `quotas`) that limits this route's requests per
    /// tenant; none by default.
    #[serde(default)]
    pub quota: Option<String>,
    /// Where a request's tenant comes from: `header` (the client's tenant header) or
    /// `api_key` (the tenant of its `Authorization: Bearer` key). Unset: from the key when the
    /// node has `auth = "on"`, from the header when it has `auth = "off"`.
    #[serde(default)]
    pub tenant: Option<TenantSource>,
    /// Header naming the tenant a request is counted for (missing: tenant `demo`). With the
    /// tenant from the key, a request may carry it only with the key's tenant, and the proxy
    /// sets it to the key's tenant on the request it forwards.
    #[serde(default = "default_tenant_header")]
    pub tenant_header: String,
    /// Weight of one request of this route against its quota.
    #[serde(default = "default_cost")]
    pub cost: u64,
    /// The hosts this route serves (`Host`, or the authority of an absolute request URI): a
    /// name matches it on any port, `name:port` on that port only. Empty: every host. A store
    /// that picks its target by `Host` (S3's virtual-hosted buckets, name-based virtual hosts)
    /// needs this, or a token for one route's resource could write another host's data.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// The `Host` the upstream receives instead of the client's.
    #[serde(default)]
    pub upstream_host: Option<String>,
    /// Connect to the upstream over TLS (HTTPS), verifying its certificate.
    #[serde(default)]
    pub upstream_tls: bool,
    /// PEM file of the certificate authorities the upstream's certificate must chain to
    /// (default: the system's). Only with `upstream_tls`.
    #[serde(default)]
    pub upstream_ca_file: Option<std::path::PathBuf>,
    /// The name the upstream's certificate is checked against and sent as SNI (default:
    /// `upstream_host`, else the host part of `upstream`). Only with `upstream_tls`.
    #[serde(default)]
    pub upstream_sni: Option<String>,
}

fn default_tenant_header() -> String {
    "X-Tenant".into()
}

fn default_cost() -> u64 {
    1
}

impl RouteConfig {
    /// A route with default settings: protected writes, no idempotency, no quota.
    pub fn new(path: &str, resource: &str, upstream: &str) -> Self {
        RouteConfig {
            path: path.into(),
            resource: resource.into(),
            upstream: upstream.into(),
            protected_methods: default_protected(),
            read_methods: Vec::new(),
            upstream_timeout_ms: default_upstream_timeout(),
            idempotency: IdempotencyMode::Off,
            idempotency_options: IdempotencyOptions::default(),
            quota: None,
            tenant: None,
            tenant_header: default_tenant_header(),
            cost: default_cost(),
            hosts: Vec::new(),
            upstream_host: None,
            upstream_tls: false,
            upstream_ca_file: None,
            upstream_sni: None,
        }
    }
}

fn default_protected() -> Vec<String> {
    ["POST", "PUT", "PATCH", "DELETE"]
        .map(String::from)
        .to_vec()
}

/// HTTP's own request methods (RFC 9110), which `protected_methods` alone decides about.
/// CONNECT never reaches a route.
const HTTP_METHODS: [&str; 8] = [
    "GET", "HEAD", "OPTIONS", "TRACE", "POST", "PUT", "PATCH", "DELETE",
];

fn default_upstream_timeout() -> u64 {
    1_000
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Capture(String),
    Rest,
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteError {
    #[error("route pattern '{0}' must start with '/'")]
    NotAbsolute(String),
    #[error("route pattern '{0}': '**' may only be the last segment")]
    RestNotLast(String),
    #[error("route pattern '{pattern}' can never match: {why} (such request paths are refused)")]
    NeverMatches { pattern: String, why: String },
    #[error("resource template '{template}' uses '{{{name}}}', which pattern '{pattern}' does not capture")]
    UnknownCapture {
        template: String,
        pattern: String,
        name: String,
    },
    #[error(
        "route '{pattern}': {method} is in both protected_methods and read_methods; \
         a method is either fenced or not"
    )]
    MethodTwice { pattern: String, method: String },
    #[error(
        "route '{pattern}': read_methods lists {method}, one of HTTP's own methods; \
         those pass unchecked unless protected_methods lists them"
    )]
    ReadMethodStandard { pattern: String, method: String },
    #[error("route '{pattern}': '{host}' is not a host name or host:port")]
    BadHost { pattern: String, host: String },
    #[error("route '{pattern}': {why}")]
    UpstreamTls { pattern: String, why: String },
}

/// A piece of a compiled resource template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// The path segment at this index (a capture of the pattern).
    PathSegment(usize),
}

/// A compiled route.
#[derive(Clone, Debug)]
pub struct Route {
    pub config: RouteConfig,
    segments: Vec<Segment>,
    protected: Vec<String>,
    reads: Vec<String>,
    /// The resource template, split once so that matching a request allocates only the
    /// resource name itself.
    template: Vec<Piece>,
    /// `hosts`, normalised (see [`normal_host`]).
    hosts: Vec<String>,
    /// With `upstream_tls`: the name checked and sent as SNI, and the authorities from
    /// `upstream_ca_file` (none: the system's).
    pub tls: Option<UpstreamTls>,
}

/// How a route reaches its upstream over TLS.
#[derive(Clone, Debug)]
pub struct UpstreamTls {
    pub sni: String,
    pub ca: Option<std::sync::Arc<pingora::protocols::tls::CaType>>,
    /// Tells pooled connections apart by the authorities that verified them (a hash of the
    /// authorities' certificates; 0 for the system's).
    pub pool_key: u64,
}

/// Headers through which a store behind another proxy may take the host a request is for
/// (`X-Forwarded-Host`, `Forwarded: host=`, `X-Forwarded-Server`), in any spelling: a route
/// with `hosts` does not pass them on.
pub fn is_forwarding_header(name: &str) -> bool {
    ["x-forwarded-host", "forwarded", "x-forwarded-server"]
        .iter()
        .any(|f| crate::tenant::spelled_as(name, f))
}

/// The outcome of matching a path against the routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteMatch {
    pub route: usize,
    pub resource: String,
}

impl Route {
    pub fn compile(config: RouteConfig) -> Result<Route, RouteError> {
        let Some(rest) = config.path.strip_prefix('/') else {
            return Err(RouteError::NotAbsolute(config.path.clone()));
        };
        if let Err(why) = check_path(&config.path) {
            return Err(RouteError::NeverMatches {
                pattern: config.path.clone(),
                why,
            });
        }
        let mut segments = Vec::new();
        let parts: Vec<&str> = rest.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let seg = if *part == "**" {
                if i + 1 != parts.len() {
                    return Err(RouteError::RestNotLast(config.path.clone()));
                }
                Segment::Rest
            } else if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                Segment::Capture(name.to_string())
            } else {
                Segment::Literal(part.to_string())
            };
            segments.push(seg);
        }
        // Every {name} in the template must be captured by the pattern.
        let mut template = Vec::new();
        let mut t = config.resource.as_str();
        while let Some(start) = t.find('{') {
            let Some(len) = t[start..].find('}') else {
                break;
            };
            let name = &t[start + 1..start + len];
            let Some(index) = segments
                .iter()
                .position(|s| matches!(s, Segment::Capture(c) if c == name))
            else {
                return Err(RouteError::UnknownCapture {
                    template: config.resource.clone(),
                    pattern: config.path.clone(),
                    name: name.to_string(),
                });
            };
            if start > 0 {
                template.push(Piece::Text(t[..start].to_string()));
            }
            template.push(Piece::PathSegment(index));
            t = &t[start + len + 1..];
        }
        if !t.is_empty() {
            template.push(Piece::Text(t.to_string()));
        }
        let upper = |methods: &[String]| -> Vec<String> {
            methods.iter().map(|m| m.to_ascii_uppercase()).collect()
        };
        let (protected, reads) = (
            upper(&config.protected_methods),
            upper(&config.read_methods),
        );
        for method in &reads {
            let pattern = config.path.clone();
            if HTTP_METHODS.contains(&method.as_str()) {
                let method = method.clone();
                return Err(RouteError::ReadMethodStandard { pattern, method });
            }
            if protected.contains(method) {
                let method = method.clone();
                return Err(RouteError::MethodTwice { pattern, method });
            }
        }
        let mut hosts = Vec::new();
        for host in config.hosts.iter().chain(&config.upstream_host) {
            if !valid_host(host) {
                return Err(RouteError::BadHost {
                    pattern: config.path.clone(),
                    host: host.clone(),
                });
            }
        }
        for host in &config.hosts {
            hosts.push(normal_host(host));
        }
        let tls = upstream_tls(&config).map_err(|why| RouteError::UpstreamTls {
            pattern: config.path.clone(),
            why,
        })?;
        Ok(Route {
            config,
            segments,
            protected,
            reads,
            template,
            hosts,
            tls,
        })
    }

    /// Whether the route names `method` among its `read_methods`.
    pub fn is_named_read(&self, method: &str) -> bool {
        self.reads.iter().any(|m| m.eq_ignore_ascii_case(method))
    }

    /// Whether a request with `method` must carry a fencing token on this route.
    pub fn is_protected(&self, method: &str) -> bool {
        if self
            .protected
            .iter()
            .any(|m| m.eq_ignore_ascii_case(method))
        {
            return true;
        }
        let standard = HTTP_METHODS.iter().any(|m| m.eq_ignore_ascii_case(method));
        !standard && !self.is_named_read(method)
    }

    /// Whether the route serves requests for `host` (`None`: the request named none).
    fn serves(&self, host: Option<&str>) -> bool {
        if self.hosts.is_empty() {
            return true;
        }
        let Some(host) = host.map(normal_host) else {
            return false;
        };
        let name = host.rsplit_once(':').map_or(host.as_str(), |(name, port)| {
            // A bracketed IPv6 literal without a port has colons but no port.
            if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') {
                name
            } else {
                host.as_str()
            }
        });
        self.hosts
            .iter()
            .any(|h| *h == host || (!has_port(h) && h == name))
    }

    /// The resource this path maps to, if the path matches; an error for a path whose match
    /// depends on how the store reads it (see [`names_literal`]). Every request passes here: a
    /// plainly spelled path allocates the resource name and nothing else.
    fn resource_for(&self, path: &str) -> Result<Option<String>, String> {
        let Some(path) = path.strip_prefix('/') else {
            return Ok(None);
        };
        let mut parts = path.split('/');
        for seg in &self.segments {
            match seg {
                Segment::Rest => return Ok(Some(self.render(path))),
                Segment::Literal(l) => match parts.next() {
                    Some(part) if names_literal(part, l)? => {}
                    _ => return Ok(None),
                },
                Segment::Capture(_) => {
                    if parts.next().is_none_or(str::is_empty) {
                        return Ok(None);
                    }
                }
            }
        }
        if parts.next().is_some() {
            return Ok(None);
        }
        Ok(Some(self.render(path)))
    }

    /// The resource name for a matched path (without its leading '/').
    fn render(&self, path: &str) -> String {
        let mut resource = String::with_capacity(self.config.resource.len() + path.len());
        for piece in &self.template {
            match piece {
                Piece::Text(t) => resource.push_str(t),
                Piece::PathSegment(i) => resource.push_str(path.split('/').nth(*i).unwrap_or("")),
            }
        }
        resource
    }
}

/// The route table: first match wins.
#[derive(Clone, Debug, Default)]
pub struct Routes {
    routes: Vec<Route>,
}

impl Routes {
    pub fn new(configs: Vec<RouteConfig>) -> Result<Routes, RouteError> {
        Ok(Routes {
            routes: configs
                .into_iter()
                .map(Route::compile)
                .collect::<Result<_, _>>()?,
        })
    }

    pub fn get(&self, index: usize) -> Option<&Route> {
        self.routes.get(index)
    }

    /// Matches a request for `host` (the request's `Host`, if any) and `path` (without query
    /// string): the first route that serves the host and matches the path. An error says why
    /// the path cannot be routed safely (stores would read it in two ways the routes fence
    /// differently).
    pub fn find(&self, host: Option<&str>, path: &str) -> Result<Option<RouteMatch>, String> {
        for (i, r) in self.routes.iter().enumerate() {
            if !r.serves(host) {
                continue;
            }
            if let Some(resource) = r.resource_for(path)? {
                return Ok(Some(RouteMatch { route: i, resource }));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
impl Routes {
    /// [`Routes::find`] for a path that must not be refused.
    fn find_ok(&self, host: Option<&str>, path: &str) -> Option<RouteMatch> {
        self.find(host, path).expect("a path the routes can fence")
    }
}

/// The TLS settings of a route's upstream, checked: the certificate authorities are read now,
/// so a missing or unreadable file stops the start instead of every request.
fn upstream_tls(config: &RouteConfig) -> Result<Option<UpstreamTls>, String> {
    if !config.upstream_tls {
        if config.upstream_ca_file.is_some() || config.upstream_sni.is_some() {
            return Err("upstream_ca_file and upstream_sni need upstream_tls = true".into());
        }
        return Ok(None);
    }
    if config.idempotency != IdempotencyMode::Off {
        return Err(
            "upstream_tls is not supported on routes with idempotency handling (they forward \
             with their own plain-HTTP client)"
                .into(),
        );
    }
    let sni = match (&config.upstream_sni, &config.upstream_host) {
        (Some(sni), _) => sni.clone(),
        (None, Some(host)) => host_name(host).to_string(),
        (None, None) => host_name(&config.upstream).to_string(),
    };
    if !valid_host(&sni) || sni.contains(':') && !sni.starts_with('[') {
        return Err(format!("upstream_sni '{sni}' is not a host name"));
    }
    let mut pool_key = 0;
    let ca = match &config.upstream_ca_file {
        None => None,
        Some(file) => {
            let pem = std::fs::read(file)
                .map_err(|e| format!("upstream_ca_file {}: {e}", file.display()))?;
            let mut certs = Vec::new();
            for block in x509_parser::pem::Pem::iter_from_buffer(&pem) {
                let block =
                    block.map_err(|e| format!("upstream_ca_file {}: {e}", file.display()))?;
                if block.label != "CERTIFICATE" {
                    continue;
                }
                // Parsed here: pingora's own parse of a stored certificate panics on bad DER.
                if let Err(e) = block.parse_x509() {
                    return Err(format!("upstream_ca_file {}: {e}", file.display()));
                }
                let mut hasher = std::hash::DefaultHasher::new();
                std::hash::Hash::hash(&(pool_key, &block.contents), &mut hasher);
                pool_key = std::hash::Hasher::finish(&hasher) | 1;
                certs.push(pingora::utils::tls::WrappedX509::new(
                    block.contents,
                    pingora::utils::tls::parse_x509,
                ));
            }
            if certs.is_empty() {
                return Err(format!(
                    "upstream_ca_file {} holds no PEM certificate",
                    file.display()
                ));
            }
            Some(std::sync::Arc::from(certs.into_boxed_slice()))
        }
    };
    Ok(Some(UpstreamTls { sni, ca, pool_key }))
}

/// The host part of `host:port` (a bracketed IPv6 address keeps its brackets).
fn host_name(addr: &str) -> &str {
    match addr.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => addr,
    }
}

/// A host as compared: lowercase, without a trailing dot on the name.
fn normal_host(host: &str) -> String {
    let lower = host.trim().to_ascii_lowercase();
    match lower.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{}:{port}", name.strip_suffix('.').unwrap_or(name))
        }
        _ => lower.strip_suffix('.').unwrap_or(&lower).to_string(),
    }
}

/// Whether a normalised host names a port.
fn has_port(host: &str) -> bool {
    match host.rsplit_once(':') {
        Some((name, port)) => {
            !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':')
        }
        None => false,
    }
}

/// A host name, IPv4 address or bracketed IPv6 address, with an optional port (0–65535).
fn valid_host(host: &str) -> bool {
    if host.is_empty() || host.len() > 255 {
        return false;
    }
    let valid_port = |port: Option<&str>| port.is_none_or(|p| p.parse::<u16>().is_ok());
    if let Some(rest) = host.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return false;
        };
        let port = match after {
            "" => None,
            after => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return false,
            },
        };
        return !inside.is_empty()
            && inside
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            && valid_port(port);
    }
    let (name, port) = match host.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        && valid_port(port)
}

/// Whether path segment `part` names a pattern's literal segment `literal` as a store reads it.
/// Every store decodes percent-encoded bytes, so `%61dmin` is `admin`: matched byte for byte,
/// it would miss a route for `admin` and fall through to a wider route with another resource,
/// while the store wrote the first route's data. Servlet containers (Tomcat, Jetty, Spring) also
/// cut `;…` path parameters off, and other stores do not: `admin;x` is `admin` to some stores
/// and a name of its own to others. When the two readings disagree about the literal, no route
/// is right for every store, and the path is refused.
fn names_literal(part: &str, literal: &str) -> Result<bool, String> {
    if part == literal {
        return Ok(true);
    }
    if !part.contains(['%', ';']) {
        return Ok(false);
    }
    let wanted = percent_decoded(literal);
    let plain = percent_decoded(part) == wanted;
    let cut = match part.split_once(';') {
        Some((name, _)) if !literal.contains(';') => percent_decoded(name) == wanted,
        _ => plain,
    };
    if plain != cut {
        return Err(format!(
            "the path segment '{part}' is '{literal}' to stores that cut ';' path parameters off \
             (Tomcat, Jetty, Spring) and a name of its own to others, and the routes fence the \
             two differently"
        ));
    }
    Ok(plain)
}

/// `text` with its percent-encoded bytes decoded (a `%` without two hex digits after it stays
/// as it is; [`check_path`] refuses such paths).
fn percent_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        // Two hex digits, nothing else (`from_str_radix` would also take a sign).
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Refuses request paths that another component could read as a different path than the
/// proxy matched: dot segments (`.`, `..`), empty segments (`//`, a trailing `/`), backslashes
/// and percent-encoded dots, slashes, backslashes, percent signs or semicolons. A store that normalises
/// paths would otherwise resolve `/accounts/7/../8/x` — fenced as account 7 — to account 8.
/// Refusing instead of normalising means the path forwarded is exactly the path fenced.
///
/// A segment is judged by what comes before its first `;`: Java servlet containers (Tomcat,
/// Jetty, Spring) cut `;…` path parameters off each segment before they resolve dot segments,
/// so to them `/accounts/7/..;/8/x` is `/accounts/8/x`.
pub fn check_path(path: &str) -> Result<(), String> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("the path must start with '/'".into());
    };
    if rest.is_empty() {
        return Ok(());
    }
    if path.contains('\\') {
        return Err("backslashes are not allowed in the path".into());
    }
    // Every request passes here: scan the bytes instead of allocating a lowercase copy.
    let bytes = path.as_bytes();
    for (i, _) in bytes.iter().enumerate().filter(|(_, b)| **b == b'%') {
        let escape = bytes.get(i + 1..i + 3).map(|e| e.to_ascii_lowercase());
        // Lenient decoders read `%%32%65` or `%2%65` as `%2e`, the dot refused below.
        if !escape
            .as_ref()
            .is_some_and(|e| e.iter().all(u8::is_ascii_hexdigit))
        {
            return Err("a '%' in the path must start a percent-encoded byte (%XX)".into());
        }
        // `%3B` too: a store that decodes before it cuts off path parameters reads it as `;`.
        let refused = |e: &Vec<u8>| matches!(e.as_slice(), b"2e" | b"2f" | b"5c" | b"25" | b"3b");
        if let Some(e) = escape.filter(refused) {
            return Err(format!(
                "percent-encoded '%{}' is not allowed in the path",
                String::from_utf8_lossy(&e).to_ascii_uppercase()
            ));
        }
    }
    for segment in rest.split('/') {
        let (name, params) = match segment.split_once(';') {
            Some((name, _)) => (name, true),
            None => (segment, false),
        };
        match (name, params) {
            ("", false) => {
                return Err("empty path segments ('//' or a trailing '/') are not allowed".into())
            }
            ("" | "." | "..", true) => {
                let read_as = if name.is_empty() {
                    "an empty segment".to_string()
                } else {
                    format!("'{name}'")
                };
                return Err(format!(
                    "'{segment}' segments are not allowed in the path: stores that take ';' as the \
                     start of path parameters (Tomcat, Jetty, Spring) read it as {read_as}"
                ));
            }
            ("." | "..", false) => {
                return Err(format!("'{segment}' segments are not allowed in the path"))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The host (for an absolute URI) and path a `Destination` header names (WebDAV's MOVE and
/// COPY write there): an absolute URI (`http://host/a/b`) or an absolute path (`/a/b`), checked
/// like a request path. A query or fragment, another form, or a path [`check_path`] refuses is
/// an error.
pub fn destination(value: &[u8]) -> Result<(Option<&str>, &str), String> {
    let value = std::str::from_utf8(value)
        .ok()
        .filter(|v| v.is_ascii())
        .ok_or("the Destination header must be ASCII")?;
    // One URI, as RFC 3986 spells it: a space (as in a list of two) or a character a URI
    // cannot hold means a store would read something other than what was checked.
    if value
        .bytes()
        .any(|b| b <= b' ' || b == 0x7f || br#""<>\^`{|}"#.contains(&b))
    {
        return Err(
            "the Destination header must be one URI: no spaces, control characters or any of \
             \" < > \\ ^ ` { | }"
                .into(),
        );
    }
    let (host, path) = if value.starts_with('/') {
        (None, value)
    } else {
        let lower = value.get(..8).unwrap_or(value).to_ascii_lowercase();
        let after_scheme = if lower.starts_with("http://") {
            &value[7..]
        } else if lower.starts_with("https://") {
            &value[8..]
        } else {
            return Err(
                "the Destination header must be an absolute URI or an absolute path".into(),
            );
        };
        match after_scheme.find('/') {
            Some(at) => (Some(&after_scheme[..at]), &after_scheme[at..]),
            None => (Some(after_scheme), "/"),
        }
    };
    if path.contains(['?', '#']) {
        return Err("the Destination header may not carry a query or a fragment".into());
    }
    check_path(path).map_err(|why| format!("Destination: {why}"))?;
    Ok((host, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_paths_are_read_and_checked_like_request_paths() {
        for (value, path) in [
            ("http://127.0.0.1:8001/dav/b", "/dav/b"),
            ("HTTPS://store.example/dav/b", "/dav/b"),
            ("/dav/b", "/dav/b"),
            ("http://h", "/"),
        ] {
            assert_eq!(
                destination(value.as_bytes()).map(|(_, p)| p),
                Ok(path),
                "{value}"
            );
        }
        for value in [
            "http://h/dav/a/../b",
            "http://h/dav/%2e%2e/b",
            "http://h/dav//b",
            "http://h/dav/b?x=1",
            "ftp://h/dav/b",
            "dav/b",
            "http://h/dav/b\\c",
            "/dav/p1/..;/p2/f",
            "/dir/d1/f, /dir/d2/f",
            "http://h/dav/b c",
            "/dav/b\t",
            "/dav/{b}",
            "/dav/b|c",
        ] {
            assert!(destination(value.as_bytes()).is_err(), "{value}");
        }
        assert!(destination("http://h/d\u{e9}".as_bytes()).is_err());
    }

    fn route(path: &str, resource: &str) -> RouteConfig {
        RouteConfig::new(path, resource, "127.0.0.1:9000")
    }

    #[test]
    fn a_route_with_hosts_serves_only_those_hosts() {
        let with_hosts = |path: &str, resource: &str, hosts: &[&str]| {
            let mut r = route(path, resource);
            r.hosts = hosts.iter().map(|h| h.to_string()).collect();
            r
        };
        let routes = Routes::new(vec![
            with_hosts("/**", "bucket:photos", &["photos.s3.example"]),
            with_hosts(
                "/{bucket}/**",
                "bucket:{bucket}",
                &["s3.example:9000", "[::1]"],
            ),
        ])
        .unwrap();
        let find = |host: Option<&str>, path: &str| routes.find_ok(host, path).map(|m| m.resource);
        // Virtual-hosted: the bucket comes from the host, on any port, in any case.
        for host in [
            "photos.s3.example",
            "PHOTOS.s3.example:443",
            "photos.s3.example.",
        ] {
            assert_eq!(
                find(Some(host), "/a/b").as_deref(),
                Some("bucket:photos"),
                "{host}"
            );
        }
        // Path-style: only on the listed port.
        assert_eq!(
            find(Some("s3.example:9000"), "/docs/x").as_deref(),
            Some("bucket:docs")
        );
        assert_eq!(find(Some("s3.example:9001"), "/docs/x"), None);
        assert_eq!(find(Some("s3.example"), "/docs/x"), None);
        assert_eq!(
            find(Some("[::1]:8001"), "/docs/x").as_deref(),
            Some("bucket:docs")
        );
        // Another host, or none, matches no route: no token of these resources covers it.
        assert_eq!(find(Some("other.s3.example"), "/a/b"), None);
        assert_eq!(find(None, "/a/b"), None);
        // A route without hosts serves every host.
        let open = Routes::new(vec![route("/kv/{key}", "kv:{key}")]).unwrap();
        assert!(open.find_ok(Some("anything:1"), "/kv/a").is_some());
        assert!(open.find_ok(None, "/kv/a").is_some());
    }

    #[test]
    fn hosts_that_are_not_host_names_are_refused() {
        for bad in [
            "",
            "a b",
            "h/x",
            "http://h",
            "a.example:99999",
            "a.example:",
            "::1",
            "[::1",
            "u@a.example",
        ] {
            let mut r = route("/kv/{key}", "kv:{key}");
            r.hosts = vec![bad.to_string()];
            assert!(
                matches!(Route::compile(r), Err(RouteError::BadHost { .. })),
                "{bad:?}"
            );
        }
        let mut r = route("/kv/{key}", "kv:{key}");
        r.upstream_host = Some("store name".into());
        assert!(Route::compile(r).is_err());
    }

    #[test]
    fn upstream_tls_settings_are_checked_when_the_route_compiles() {
        let tls = |f: &dyn Fn(&mut RouteConfig)| {
            let mut r = route("/kv/{key}", "kv:{key}");
            r.upstream = "store.example:443".into();
            r.upstream_tls = true;
            f(&mut r);
            Route::compile(r)
        };
        let sni = |r: Result<Route, RouteError>| r.expect("compiles").tls.expect("tls").sni;
        assert_eq!(sni(tls(&|_| {})), "store.example");
        assert_eq!(
            sni(tls(
                &|r| r.upstream_host = Some("bucket.store.example".into())
            )),
            "bucket.store.example"
        );
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here").expect("write");
        for (bad, says) in [
            (
                tls(&|r| r.upstream_ca_file = Some(missing.clone())),
                "missing.pem",
            ),
            (
                tls(&|r| r.upstream_ca_file = Some(empty.clone())),
                "no PEM certificate",
            ),
            (
                tls(&|r| r.idempotency = IdempotencyMode::Required),
                "idempotency",
            ),
            (
                tls(&|r| {
                    r.upstream_tls = false;
                    r.upstream_sni = Some("x".into());
                }),
                "need upstream_tls",
            ),
        ] {
            let err = bad.expect_err("refused").to_string();
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn captures_and_rest() {
        let routes = Routes::new(vec![
            route("/kv/{key}", "kv:{key}"),
            route("/accounts/{id}/**", "account:{id}"),
        ])
        .unwrap();
        assert_eq!(routes.find_ok(None, "/kv/a").unwrap().resource, "kv:a");
        assert_eq!(routes.find_ok(None, "/kv/a/b"), None);
        assert_eq!(routes.find_ok(None, "/kv/"), None);
        let m = routes.find_ok(None, "/accounts/7/orders/9").unwrap();
        assert_eq!((m.route, m.resource.as_str()), (1, "account:7"));
        assert_eq!(
            routes.find_ok(None, "/accounts/7").unwrap().resource,
            "account:7"
        );
        assert_eq!(routes.find_ok(None, "/other"), None);
    }

    #[test]
    fn templates_with_several_captures_and_text_around_them() {
        let routes = Routes::new(vec![
            route("/t/{a}/x/{b}", "t:{b}-{a}.end"),
            route("/u/{a}/**", "{a}"),
        ])
        .unwrap();
        assert_eq!(
            routes.find_ok(None, "/t/1/x/2").unwrap().resource,
            "t:2-1.end"
        );
        assert_eq!(routes.find_ok(None, "/t/1/y/2"), None);
        assert_eq!(routes.find_ok(None, "/t/1/x"), None);
        // A captured value is copied as it is, never read as a template itself.
        assert_eq!(
            routes.find_ok(None, "/t/{b}/x/2").unwrap().resource,
            "t:2-{b}.end"
        );
        assert_eq!(routes.find_ok(None, "/u/7/a/b").unwrap().resource, "7");
    }

    #[test]
    fn paths_that_could_alias_another_resource_are_refused() {
        for ok in [
            "/",
            "/kv/a",
            "/accounts/7/orders/9",
            "/kv/a.b",
            "/kv/a..b",
            "/kv/%41",
            "/kv/a;v=1",
            "/kv/..a;b",
        ] {
            assert_eq!(check_path(ok), Ok(()), "{ok}");
        }
        for bad in [
            "/accounts/7/../8/x",
            "/accounts/7/./x",
            "/kv/a/..",
            "/kv//a",
            "/kv/a/",
            "/kv/a%2F..%2Fb",
            "/t/p1/..;/p2/data",
            "/t/p1/..;x=1/p2/data",
            "/t/p1/.;/data",
            "/t/p1/;/data",
            "/t/p1/;jsessionid=1",
            "/t/..;",
            "/t/p1/..%3B/p2/data",
            "/t/p1/..%3b/p2/data",
            "/kv/a%2f..%2fb",
            "/kv/%2E%2E/b",
            "/kv/a%5Cb",
            "/kv/a\\..\\b",
            "/kv/a%252Fb",
            "kv/a",
        ] {
            assert!(check_path(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn bad_patterns_are_rejected() {
        assert!(matches!(
            Route::compile(route("kv/{key}", "kv:{key}")),
            Err(RouteError::NotAbsolute(_))
        ));
        assert!(matches!(
            Route::compile(route("/a/**/b", "x")),
            Err(RouteError::RestNotLast(_))
        ));
        assert!(matches!(
            Route::compile(route("/kv/{key}", "kv:{id}")),
            Err(RouteError::UnknownCapture { .. })
        ));
        // Paths the proxy refuses before routing: a pattern made of them would never match.
        for never in [
            "/kv/../{key}",
            "/kv/./x",
            "/kv//{key}",
            "/kv/",
            "/a%2Fb/{k}",
            "/a\\b",
        ] {
            let refused = Route::compile(route(never, "x"));
            assert!(
                matches!(refused, Err(RouteError::NeverMatches { .. })),
                "{never}: {refused:?}"
            );
        }
        assert!(Route::compile(route("/", "root")).is_ok());
    }

    #[test]
    fn protected_methods_default_to_writes() {
        let r = Route::compile(route("/kv/{key}", "kv:{key}")).unwrap();
        assert!(r.is_protected("PUT") && r.is_protected("delete"));
        assert!(!r.is_protected("GET") && !r.is_protected("HEAD"));
        assert!(!r.is_protected("OPTIONS") && !r.is_protected("TRACE"));
    }

    #[test]
    fn a_method_outside_http_is_fenced_unless_named_a_read() {
        let r = Route::compile(route("/kv/{key}", "kv:{key}")).unwrap();
        for write in [
            "MOVE",
            "COPY",
            "MKCOL",
            "PROPPATCH",
            "LOCK",
            "propfind",
            "FOO",
        ] {
            assert!(r.is_protected(write), "{write}");
        }
        let mut config = route("/dav/{key}", "dav:{key}");
        config.read_methods = vec!["propfind".into(), "REPORT".into()];
        config.protected_methods = vec![];
        let r = Route::compile(config).unwrap();
        assert!(!r.is_protected("PROPFIND") && !r.is_protected("report"));
        assert!(r.is_named_read("propfind") && !r.is_named_read("MOVE"));
        assert!(r.is_protected("MOVE"), "still fenced: not named a read");
        assert!(
            !r.is_protected("PUT"),
            "HTTP's own: as protected_methods says"
        );
    }

    #[test]
    fn a_read_method_must_be_neither_fenced_nor_one_of_https_own() {
        let mut both = route("/dav/{key}", "dav:{key}");
        both.protected_methods = vec!["PROPFIND".into()];
        both.read_methods = vec!["propfind".into()];
        let err = Route::compile(both).unwrap_err().to_string();
        assert!(err.contains("PROPFIND is in both"), "{err}");
        let mut standard = route("/dav/{key}", "dav:{key}");
        standard.read_methods = vec!["POST".into()];
        let err = Route::compile(standard).unwrap_err().to_string();
        assert!(err.contains("read_methods lists POST"), "{err}");
    }
}

/// Paths from the network never panic the matcher, and an accepted path has no segment a store
/// could resolve elsewhere.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::config::ProxyConfig;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(lock_core::testkit::fuzz_cases(3_000)))]

        #[test]
        fn any_path_is_matched_or_refused_without_panic(path in "[/a-zA-Z0-9.%:;_\\\\-]{0,40}") {
            let routes = Routes::new(ProxyConfig::dev(String::new(), "127.0.0.1:9".into()).routes)
                .expect("dev routes");
            let accepted = check_path(&path).is_ok();
            let matched = routes.find(None, &path);
            if accepted {
                for seg in path.split('/').skip(1) {
                    // As a servlet container reads it: path parameters cut off.
                    let seg = seg.split(';').next().unwrap_or(seg);
                    prop_assert!(seg != "." && seg != ".." && (!seg.is_empty() || path == "/"));
                }
                if let Ok(Some(m)) = matched {
                    prop_assert!(!m.resource.contains(".."), "{}", m.resource);
                }
            }
        }

        /// Any route table from a config file compiles or is refused with an error, and a
        /// compiled one matches any path (including raw bytes) or not — never a panic — and
        /// derives the same resource every time.
        #[test]
        fn any_route_config_compiles_or_is_refused(
            template in "[/a-z{}*.%:]{0,24}",
            resource in "[a-z{}:/.*]{0,16}",
            path in proptest::collection::vec(any::<u8>(), 0..48),
        ) {
            let config = RouteConfig::new(&template, &resource, "127.0.0.1:9");
            if let Ok(routes) = Routes::new(vec![config]) {
                let path = String::from_utf8_lossy(&path);
                let first = routes.find(None, &path);
                prop_assert_eq!(first, routes.find(None, &path));
            }
        }

        /// A path the proxy fences is fenced on the route a store reads it as: one that
        /// decodes percent-encoded bytes, and one that also cuts `;` path parameters off (a
        /// servlet container). Matched byte for byte, `%61dmin` missed the route for `admin`.
        #[test]
        fn a_fenced_path_takes_the_route_every_store_reads_it_as(
            segments in proptest::collection::vec(proptest::sample::select(vec![
                "a", "%61", "%41", "p1", "%70%31", "admin", "%61dmin", "adm%69n", "%61%64%6d%69%6e",
                "ADMIN", "admin;x", "%61dmin;x", "x;admin", "admin%3b", "b", "",
            ]), 1..5),
        ) {
            let routes = Routes::new(vec![
                RouteConfig::new("/a/{id}/admin/**", "admin:{id}", "127.0.0.1:9"),
                RouteConfig::new("/a/{id}/**", "a:{id}", "127.0.0.1:9"),
                RouteConfig::new("/**", "misc", "127.0.0.1:9"),
            ])
            .expect("routes");
            let path = format!("/{}", segments.join("/"));
            let Ok(Some(fenced)) = check_path(&path).and_then(|()| routes.find(None, &path)) else {
                return Ok(());
            };
            let decoded = |s: &str| String::from_utf8_lossy(&percent_decoded(s)).into_owned();
            let plain: Vec<String> = segments.iter().map(|s| decoded(s)).collect();
            let servlet: Vec<String> = segments
                .iter()
                .map(|s| decoded(s.split(';').next().unwrap_or(s)))
                .collect();
            for (store, read) in [("plain", plain), ("servlet", servlet)] {
                // The store's own routing: literal segments compared with what it decoded.
                let route = match read.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                    ["a", id, "admin", ..] if !id.is_empty() => 0,
                    ["a", id, ..] if !id.is_empty() => 1,
                    _ => 2,
                };
                prop_assert_eq!(fenced.route, route, "{} read by a {} store", path, store);
            }
        }
    }
}
