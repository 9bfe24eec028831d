//! The pingora side: a `ProxyHttp` that runs the fence check in `request_filter`, then
//! forwards unchanged (headers and streamed body) to the route's upstream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};
use serde_json::{json, Value};

use crate::conn_limits;
use crate::gate::{Admission, FenceGate, InFlightGuard};
use crate::idempotency::{Handled, IdempotencyLayer, Permit, Refusal};
use crate::metrics::ProxyMetrics;
use crate::quota::QuotaLimiter;
use crate::route::{check_path, Route, Routes};
use crate::send_deadline::{self, SendGuard, SendWatchdog};
use crate::tenant::{self, TenantSource};
use crate::verdict::{check_resource_header, parse_token, Rejection};
use lock_core::node::{Denied, Node};
use lock_core::wire::{
    scoped_name, ErrorBody, ErrorCode, FENCE_RESOURCE_HEADER, FENCE_TOKEN_HEADER,
};
use pingora::http::RequestHeader;
use pingora::OrErr;

pub struct FenceProxy {
    routes: Routes,
    gate: Arc<FenceGate>,
    metrics: ProxyMetrics,
    /// `ProxyConfig::unsafe_no_fencing`: forward protected writes unchecked (demos only).
    unsafe_no_fencing: bool,
    /// `Idempotency-Key` handling for routes that ask for it.
    idempotency: Option<Arc<IdempotencyLayer>>,
    /// Global rate limits for routes with a quota.
    quotas: Option<Arc<QuotaLimiter>>,
    /// Cuts a fenced write's upstream connection that is still sending at its send-by.
    watchdog: Arc<SendWatchdog>,
    /// The node whose key table authenticates requests on routes that take the tenant from
    /// an API key, and whether it checks keys (which routes then do by default).
    keys: Option<(Arc<Node>, bool)>,
}

/// Per-request state.
pub struct Ctx {
    route: Option<usize>,
    started: Instant,
    outcome: &'static str,
    /// For an admitted protected write: when the request must have reached the upstream in
    /// full (see `gate::Admitted::send_by`).
    send_by: Option<Instant>,
    /// Counts this write in flight for its resource until the request is over (a revocation
    /// of its token waits for it).
    in_flight: Option<InFlightGuard>,
    /// A fenced write's upstream connection under the send-by watchdog, until answered.
    send_guard: Option<SendGuard>,
    /// On a route that takes the tenant from the API key: the key's tenant, which the
    /// forwarded request carries in the route's tenant header instead of the key.
    key_tenant: Option<String>,
}

impl FenceProxy {
    pub fn new(
        routes: Routes,
        gate: Arc<FenceGate>,
        metrics: ProxyMetrics,
        watchdog: Arc<SendWatchdog>,
    ) -> Self {
        FenceProxy {
            routes,
            gate,
            metrics,
            unsafe_no_fencing: false,
            idempotency: None,
            quotas: None,
            watchdog,
            keys: None,
        }
    }

    /// Lets routes take the tenant from an API key checked against `node`'s key table; with
    /// `auth_on`, routes that do not say otherwise do.
    pub fn with_tenants_from_keys(mut self, node: Arc<Node>, auth_on: bool) -> Self {
        self.keys = Some((node, auth_on));
        self
    }

    /// Where `route` takes its tenant from.
    fn tenant_source(&self, route: &Route) -> TenantSource {
        route
            .config
            .tenant_source(self.keys.as_ref().is_some_and(|(_, on)| *on))
    }

    /// On a route that takes the tenant from the API key: the key's tenant, or the refusal the
    /// client gets. `Ok(None)` on a route that takes it from a header.
    fn key_tenant(
        &self,
        route: &Route,
        req: &RequestHeader,
    ) -> std::result::Result<Option<String>, (u16, ErrorBody)> {
        if self.tenant_source(route) != TenantSource::ApiKey {
            return Ok(None);
        }
        let Some((node, _)) = &self.keys else {
            // The config check refuses api_key routes without keys; refuse rather than guess.
            let body = ErrorBody::new(
                ErrorCode::Unauthenticated,
                "This proxy route takes the tenant from an API key, but this proxy has no key \
                 table; nothing was forwarded.",
            );
            return Err((ErrorCode::Unauthenticated.status(), body));
        };
        match tenant::authenticate(node, &route.config, req) {
            Ok(caller) => Ok(Some(caller.tenant)),
            Err(denied) => {
                let code = match denied {
                    Denied::Missing | Denied::Invalid => ErrorCode::Unauthenticated,
                    Denied::Role | Denied::Tenant => ErrorCode::Forbidden,
                };
                let status = code.status();
                let body = ErrorBody::new(code, tenant::refusal_message(denied, &route.config));
                Err((status, body))
            }
        }
    }

    /// Enforces the routes' quotas (a route with a quota and no limiter is not limited; the
    /// config check refuses such a config).
    pub fn with_quotas(mut self, limiter: Option<Arc<QuotaLimiter>>) -> Self {
        self.quotas = limiter;
        self
    }

    /// The route's quota check, from the local bucket only. `Some(answer)` refuses.
    async fn limit(
        &self,
        route: &Route,
        req: &RequestHeader,
        key_tenant: Option<&str>,
    ) -> Option<(u16, ErrorBody)> {
        let (Some(quota), Some(limiter)) = (&route.config.quota, &self.quotas) else {
            return None;
        };
        let tenant = match key_tenant {
            Some(t) => t,
            None => match tenant_of(req, &route.config.tenant_header) {
                Ok(t) => t,
                Err(body) => return Some((400, body)),
            },
        };
        let limited = limiter
            .admit(quota, tenant, route.config.cost)
            .await
            .err()?;
        let mut body = ErrorBody::new(
            ErrorCode::RateLimited,
            format!(
                "Tenant '{tenant}' is over its rate limit '{quota}' at this proxy; retry after \
                 Retry-After seconds, or later if the answer has none."
            ),
        );
        body.retry_after_ms = limited.retry_after.map(|d| d.as_millis() as u64);
        Some((ErrorCode::RateLimited.status(), body))
    }

    /// Handles `Idempotency-Key` on the routes configured for it.
    pub fn with_idempotency(mut self, layer: Arc<IdempotencyLayer>) -> Self {
        self.idempotency = Some(layer);
        self
    }

    /// Counts and audits a fence decision, with the same fields as the lock calls' audit
    /// lines (a proxied write has no lease id).
    fn note_admission(
        &self,
        resource: &str,
        token: Option<u64>,
        admitted: std::result::Result<Admission, &Rejection>,
    ) {
        let outcome = match admitted {
            Ok(how) => {
                let reason = match how {
                    Admission::FastPath => "fast_path",
                    Admission::Consensus => "consensus",
                };
                self.decide("forwarded", reason);
                "forwarded"
            }
            Err(rejection) => {
                self.decide("rejected", rejection.code());
                rejection.code()
            }
        };
        tracing::info!(
            target: "fencegate::audit",
            op = "proxy_write",
            resource = %resource,
            lease = None::<&str>,
            token,
            outcome,
        );
    }

    /// The hook an unfenced request passes once it may go upstream: a write on an idempotent
    /// route is run by the idempotency layer, which answers the client itself; anything else
    /// is forwarded by pingora. Returns `request_filter`'s "responded".
    async fn forward(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let route = ctx.route.and_then(|i| self.routes.get(i));
        let (Some(layer), Some(route)) = (&self.idempotency, route) else {
            return Ok(false);
        };
        match layer
            .handle(session, route, ctx.key_tenant.as_deref(), None)
            .await?
        {
            Handled::Responded => {
                ctx.outcome = "idempotent";
                Ok(true)
            }
            Handled::NotApplicable => Ok(false),
        }
    }

    /// Turns every fence check off (`ProxyConfig::unsafe_no_fencing`; demonstrations only).
    pub fn with_unsafe_no_fencing(mut self, on: bool) -> Self {
        self.unsafe_no_fencing = on;
        self
    }

    /// Whether a `Destination` header names a path of route `route` whose resource is
    /// `resource`, the one the request is fenced on; or why not.
    fn check_destination(
        &self,
        value: &[u8],
        host: Option<&str>,
        route: usize,
        resource: &str,
    ) -> std::result::Result<(), String> {
        let (dest_host, path) = crate::route::destination(value)?;
        match self.routes.find(dest_host.or(host), path)? {
            Some(d) if d.route == route && d.resource == resource => Ok(()),
            Some(d) => Err(format!(
                "The Destination is fenced as resource '{}', this request as '{resource}': a \
                 token admits writes to its own resource only. Move or copy within one \
                 resource, or take both locks and write each with its own token.",
                d.resource
            )),
            None => Err(
                "The Destination matches no route of this proxy, so no fencing token covers it."
                    .into(),
            ),
        }
    }

    fn decide(&self, outcome: &'static str, reason: &str) {
        self.metrics
            .decisions
            .with_label_values(&[outcome, reason])
            .inc();
    }
}

/// The tenant a request is counted for: the route's tenant header, `demo` without one.
fn tenant_of<'a>(req: &'a RequestHeader, header: &str) -> std::result::Result<&'a str, ErrorBody> {
    let Some(value) = req.headers.get(header) else {
        return Ok(DEFAULT_TENANT);
    };
    // Both copies go upstream: a store reading the other one would act for another tenant
    // than the one this request was counted for.
    if copies(req, header) > 1 {
        return Err(ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("{header} appears more than once; send one."),
        ));
    }
    match value.to_str() {
        Ok(t)
            if (1..=64).contains(&t.len())
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) =>
        {
            Ok(t)
        }
        _ => Err(ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("{header} must be 1-64 letters, digits, '.', '_' or '-'."),
        )),
    }
}

/// The tenant of requests without a tenant header.
pub const DEFAULT_TENANT: &str = "demo";

/// Answers with an error body; a 429 gets `Retry-After` (whole seconds, rounded up) when the
/// body says when to retry.
async fn respond_error(session: &mut Session, status: u16, body: &ErrorBody) -> Result<()> {
    let bytes = Bytes::from(
        serde_json::to_vec(body).or_err(ErrorType::InternalError, "serialize an error body")?,
    );
    let mut resp = ResponseHeader::build(status, Some(4))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", bytes.len().to_string())?;
    if let (429, Some(ms)) = (status, body.retry_after_ms) {
        resp.insert_header("retry-after", ms.div_ceil(1_000).max(1).to_string())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(bytes), true).await?;
    Ok(())
}

/// Requests the proxy does not pass on, whatever the route: an upgrade (WebSocket, h2c), whose
/// tunnel would carry writes no fence could check; a `Content-Length` that is not one number;
/// and a transfer coding other than chunked, which it could not forward unchanged (nginx
/// answers that 501 as well).
fn unsupported_framing(session: &Session) -> Option<(u16, &'static str, &'static str)> {
    let req = session.req_header();
    // curl and others offer h2c on plain requests; like nginx, the proxy answers in HTTP/1.1
    // (the offer is not forwarded).
    let only_h2c = req.headers.get_all("upgrade").iter().all(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').all(|p| p.trim().eq_ignore_ascii_case("h2c")))
    });
    if !only_h2c {
        return Some((
            501,
            "upgrade_not_supported",
            "The fencing proxy does not switch protocols (WebSocket and the like): writes inside \
             an upgraded connection could not be fenced. Send plain HTTP requests.",
        ));
    }
    // `Content-Length: 4, 4` (or two such headers) is a list a store may read another way than
    // the proxy, or choke on: the length must be one decimal number.
    let mut lengths = req.headers.get_all("content-length").iter();
    let one_number = match (lengths.next(), lengths.next()) {
        (None, _) => true,
        (Some(v), None) => !v.is_empty() && v.as_bytes().iter().all(u8::is_ascii_digit),
        (Some(_), Some(_)) => false,
    };
    if !one_number {
        return Some((
            400,
            "bad_request",
            "Send one Content-Length header holding one decimal length.",
        ));
    }
    let other_coding = req.headers.get_all("transfer-encoding").iter().any(|v| {
        !v.to_str()
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("chunked"))
    });
    if other_coding {
        return Some((
            501,
            "unsupported_transfer_encoding",
            "The fencing proxy forwards request bodies as they are or chunked; other transfer \
             codings (gzip, deflate, compress) are not supported. Use Content-Encoding instead.",
        ));
    }
    None
}

/// The host a request is for: the authority of an absolute request URI, else its `Host`
/// header (`None` without either). Two `Host` headers are refused: the proxy would route by
/// one and the store might serve the other.
fn request_host(req: &RequestHeader) -> std::result::Result<Option<&str>, String> {
    if let Some(authority) = req.uri.authority() {
        return Ok(Some(authority.as_str()));
    }
    if copies(req, "host") > 1 {
        return Err("Host appears more than once; send one.".into());
    }
    match req.headers.get("host").map(|v| v.to_str()) {
        None => Ok(None),
        Some(Ok(host)) => Ok(Some(host)),
        Some(Err(_)) => Err("The Host header must be ASCII.".into()),
    }
}

/// How many headers carry `name`, counting spellings with `_` for `-`: CGI-style servers
/// (WSGI, Rack, PHP) read `Fence_Token` and `Fence-Token` as one variable, so a second
/// spelling is a second copy the store might read instead.
pub(crate) fn copies(req: &RequestHeader, name: &str) -> usize {
    req.headers
        .iter()
        .filter(|(n, _)| tenant::spelled_as(n.as_str(), name))
        .count()
}

/// The options a request's `Connection` headers list (lower case): the headers they name
/// describe this hop and are not passed on.
pub(crate) fn connection_options(req: &RequestHeader) -> impl Iterator<Item = String> + '_ {
    req.headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
}

/// Removes an h2c upgrade offer (the only kind let through) from a request going upstream.
fn drop_upgrade_offer(req: &mut RequestHeader) -> Result<()> {
    if !req.headers.contains_key("upgrade") {
        return Ok(());
    }
    req.remove_header("upgrade");
    req.remove_header("http2-settings");
    let kept: Vec<String> = connection_options(req)
        .filter(|t| t != "upgrade" && t != "http2-settings")
        .collect();
    req.remove_header("connection");
    if !kept.is_empty() {
        req.insert_header("connection", kept.join(", "))?;
    }
    Ok(())
}

async fn respond_json(session: &mut Session, status: u16, body: &Value) -> Result<()> {
    let body = Bytes::from(body.to_string());
    let mut resp = ResponseHeader::build(status, Some(3))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len().to_string())?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(())
}

#[async_trait]
impl ProxyHttp for FenceProxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            route: None,
            started: Instant::now(),
            outcome: "forwarded",
            send_by: None,
            in_flight: None,
            send_guard: None,
            key_tenant: None,
        }
    }

    /// The first hook after the head was read: the head deadline is met.
    async fn early_request_filter(&self, session: &mut Session, _ctx: &mut Ctx) -> Result<()> {
        conn_limits::head_read(session);
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        if let Some((status, code, message)) = unsupported_framing(session) {
            ctx.outcome = code;
            let body = json!({ "error": code, "message": message });
            respond_json(session, status, &body).await?;
            return Ok(true);
        }
        let req = session.req_header();
        if let Err(why) = check_path(req.uri.path()) {
            ctx.outcome = "invalid_path";
            let body = json!({
                "error": "invalid_path",
                "message": format!("{why}; send the path in its plain form."),
            });
            respond_json(session, 400, &body).await?;
            return Ok(true);
        }
        let host = match request_host(req) {
            Ok(host) => host,
            Err(why) => {
                ctx.outcome = "invalid_host";
                let body = json!({ "error": "invalid_host", "message": why });
                respond_json(session, 400, &body).await?;
                return Ok(true);
            }
        };
        let found = self.routes.find(host, req.uri.path()).map_err(|why| {
            json!({
                "error": "invalid_path",
                "message": format!("{why}; send the path in its plain form."),
            })
        });
        let found = match found {
            Ok(found) => found,
            Err(body) => {
                ctx.outcome = "invalid_path";
                respond_json(session, 400, &body).await?;
                return Ok(true);
            }
        };
        let Some(m) = found else {
            ctx.outcome = "no_route";
            let body = json!({
                "error": "no_route",
                "message": "No proxy route matches this host and path; see the proxy's route \
                            config.",
            });
            respond_json(session, 404, &body).await?;
            return Ok(true);
        };
        ctx.route = Some(m.route);
        let route = self
            .routes
            .get(m.route)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "route index out of range"))?;
        // Whose request it is, before anything is spent on it.
        match self.key_tenant(route, req) {
            Ok(tenant) => ctx.key_tenant = tenant,
            Err((status, body)) => {
                ctx.outcome = "unauthenticated";
                respond_error(session, status, &body).await?;
                return Ok(true);
            }
        }
        // Rate limits first: a refused request costs the cluster nothing.
        if let Some((status, body)) = self.limit(route, req, ctx.key_tenant.as_deref()).await {
            ctx.outcome = "rate_limited";
            respond_error(session, status, &body).await?;
            return Ok(true);
        }
        if !route.is_protected(req.method.as_str()) {
            ctx.outcome = "passthrough";
            self.decide("passthrough", "unprotected_method");
            return self.forward(session, ctx).await;
        }
        if self.unsafe_no_fencing {
            // Lease-only mode for demonstrations: nothing is checked, so a zombie's late write
            // lands after the new holder's (what fencing exists to prevent).
            ctx.outcome = "unfenced";
            self.decide("forwarded", "unsafe_no_fencing");
            return self.forward(session, ctx).await;
        }
        // A write that names a second target (WebDAV's MOVE and COPY write to `Destination`)
        // writes there too: the destination must be a path of this route for the same resource,
        // or the token of one resource would write another's data.
        if let Some(dest) = req.headers.get("destination") {
            // A store may join two copies into one value (Apache does): only one is checked.
            let checked = if copies(req, "destination") > 1 {
                Err("Destination appears more than once; send one.".to_string())
            } else {
                self.check_destination(dest.as_bytes(), host, m.route, &m.resource)
            };
            if let Err(why) = checked {
                ctx.outcome = "invalid_destination";
                self.decide("rejected", "invalid_destination");
                let body = json!({ "error": "invalid_destination", "message": why });
                respond_json(session, 400, &body).await?;
                return Ok(true);
            }
        }
        let upstream_timeout = Duration::from_millis(route.config.upstream_timeout_ms);
        // A tenant's locks live in its namespace: a key's writes are fenced on its tenant's
        // lock of the derived name, so another tenant's token of the same name admits nothing.
        let fenced = match &ctx.key_tenant {
            Some(tenant) => scoped_name(tenant, &m.resource),
            None => m.resource.clone(),
        };
        let presented = parse_token(req.headers.get(FENCE_TOKEN_HEADER).map(|v| v.as_bytes())).ok();
        let local = (|| {
            lock_core::wire::validate_resource(&m.resource).map_err(Rejection::BadResource)?;
            for name in [FENCE_TOKEN_HEADER, FENCE_RESOURCE_HEADER] {
                if copies(req, name) > 1 {
                    return Err(Rejection::DuplicateHeader(name));
                }
            }
            check_resource_header(
                req.headers.get(FENCE_RESOURCE_HEADER).map(|v| v.as_bytes()),
                &m.resource,
            )?;
            parse_token(req.headers.get(FENCE_TOKEN_HEADER).map(|v| v.as_bytes()))
        })();
        let token = match local {
            Ok(token) => token,
            Err(rejection) => {
                self.note_admission(&fenced, presented, Err(&rejection));
                ctx.outcome = "rejected";
                respond_json(session, rejection.status(), &rejection.body()).await?;
                return Ok(true);
            }
        };
        let idempotent = self
            .idempotency
            .as_ref()
            .filter(|l| l.applies(route, req.method.as_str()));
        if let Some(layer) = idempotent {
            // An idempotent write is admitted only once its key is claimed for it: a replay of
            // a stored answer reaches no upstream and needs no fresh admission.
            let resource = fenced.clone();
            let admit = Box::pin(async move {
                let admitted = self.gate.admit(&resource, token, upstream_timeout).await;
                let how = admitted.as_ref().map(|a| a.how);
                self.note_admission(&resource, Some(token), how);
                match admitted {
                    Ok(a) => Ok(Permit {
                        send_by: a.send_by,
                        hold: Box::new(a.in_flight),
                    }),
                    Err(r) => Err(Refusal {
                        status: r.status(),
                        body: r.body().to_string().into_bytes(),
                    }),
                }
            });
            if let Handled::Responded = layer
                .handle(session, route, ctx.key_tenant.as_deref(), Some(admit))
                .await?
            {
                ctx.outcome = "idempotent";
                return Ok(true);
            }
        }
        let admitted = self.gate.admit(&fenced, token, upstream_timeout).await;
        self.note_admission(&fenced, Some(token), admitted.as_ref().map(|a| a.how));
        match admitted {
            Ok(admitted) => {
                ctx.send_by = Some(admitted.send_by);
                ctx.in_flight = Some(admitted.in_flight);
                Ok(false)
            }
            Err(rejection) => {
                ctx.outcome = "rejected";
                respond_json(session, rejection.status(), &rejection.body()).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let route = ctx
            .route
            .and_then(|i| self.routes.get(i))
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route chosen"))?;
        let timeout = Duration::from_millis(route.config.upstream_timeout_ms);
        // A fenced write must reach the upstream before its `send_by`: connecting and writing
        // get no more than what is left of it.
        let send_timeout = match ctx.send_by {
            Some(send_by) => {
                let left = send_by.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Error::e_explain(
                        ErrorType::WriteTimedout,
                        "the fencing grant ran out before the request could be sent",
                    );
                }
                timeout.min(left)
            }
            None => timeout,
        };
        let mut peer = match &route.tls {
            Some(tls) => {
                let mut peer = HttpPeer::new(route.config.upstream.as_str(), true, tls.sni.clone());
                peer.options.ca = tls.ca.clone();
                // pingora pools connections by address and name, not by the authorities that
                // verified them: a route must not reuse a connection another route's
                // authorities accepted.
                peer.group_key = tls.pool_key;
                peer
            }
            None => HttpPeer::new(route.config.upstream.as_str(), false, String::new()),
        };
        // The epoch barrier's guarantee is stated in terms of these bounds (docs/fencing.md).
        peer.options.connection_timeout = Some(send_timeout);
        peer.options.total_connection_timeout = Some(send_timeout);
        peer.options.read_timeout = Some(timeout);
        peer.options.write_timeout = Some(send_timeout);
        Ok(Box::new(peer))
    }

    /// On a route that takes the tenant from the API key, the upstream gets the key's tenant in
    /// the route's tenant header (it keeps tenants' data apart by it) and never the key: the
    /// key is a credential for this cluster, not for the store.
    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        drop_upgrade_offer(upstream_request)?;
        let route = ctx.route.and_then(|i| self.routes.get(i));
        // The request goes upstream as HTTP/1.1, which requires a Host: an HTTP/1.0 client may
        // have sent none, and the store would refuse the request. Name the upstream, as nginx
        // does.
        if let Some(route) = route {
            if let Some(host) = &route.config.upstream_host {
                upstream_request.insert_header("host", host.as_str())?;
            } else if !upstream_request.headers.contains_key("host") {
                upstream_request.insert_header("host", route.config.upstream.as_str())?;
            }
        }
        // An API key is for this cluster, never for the store, whatever the route.
        let key_in_authorization = tenant::key_in_authorization(upstream_request);
        let key_route = ctx.key_tenant.is_some();
        let withheld: Vec<String> = upstream_request
            .headers
            .iter()
            .filter(|(n, v)| {
                tenant::withheld_from_store(
                    n.as_str(),
                    v.as_bytes(),
                    key_route,
                    key_in_authorization,
                )
            })
            .map(|(n, _)| n.as_str().to_string())
            .collect();
        for name in withheld {
            upstream_request.remove_header(&name);
        }
        // On a route with hosts, the store must not pick its target from a forwarding header
        // either.
        if route.is_some_and(|r| !r.config.hosts.is_empty()) {
            let forwarding: Vec<String> = upstream_request
                .headers
                .keys()
                .filter(|n| crate::route::is_forwarding_header(n.as_str()))
                .map(|n| n.as_str().to_string())
                .collect();
            for name in forwarding {
                upstream_request.remove_header(&name);
            }
        }
        let (Some(tenant), Some(route)) = (&ctx.key_tenant, route) else {
            return Ok(());
        };
        for name in route.config.tenant_headers() {
            upstream_request.insert_header(name.to_string(), tenant.as_str())?;
        }
        Ok(())
    }

    /// The epoch barrier against slow clients: per-read and per-write timeouts do not bound a
    /// body that trickles in, so each chunk is checked against the write's `send_by` before it
    /// goes upstream. Past it the request is abandoned unfinished (504), and an HTTP store never
    /// applies a request whose body it did not receive in full.
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if ctx.send_by.is_some_and(|send_by| Instant::now() > send_by) {
            return Error::e_explain(
                ErrorType::WriteTimedout,
                "the request body did not arrive before the fencing grant ran out",
            );
        }
        Ok(())
    }

    /// A fenced write's whole upstream send is bounded by its send-by: per-write timeouts
    /// would each start afresh, and the end of a chunked body has none.
    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        _reused: bool,
        _peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        _digest: Option<&pingora::protocols::Digest>,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(send_by) = ctx.send_by {
            // The watchdog looks once per tick: a send with less than that left could be cut
            // late, so it is not started (nothing has been sent yet).
            if send_by.saturating_duration_since(Instant::now()) <= send_deadline::TICK {
                return Error::e_explain(
                    ErrorType::WriteTimedout,
                    "the fencing grant ran out before the request could be sent",
                );
            }
            let guard = self
                .watchdog
                .watch(fd, tokio::time::Instant::from_std(send_by))
                .or_err(
                    ErrorType::InternalError,
                    "watch the upstream connection's send deadline",
                )?;
            ctx.send_guard = Some(guard);
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // No upgrade is forwarded, so a 101 is the upstream's error; a tunnel through the
        // proxy would carry writes no fence checks.
        if upstream_response.status.as_u16() == 101 {
            return Err(Error::explain(
                ErrorType::InvalidHTTPHeader,
                "the upstream switched protocols (101) although no upgrade was asked for",
            )
            .into_up());
        }
        // A final answer means the upstream has the whole request (1xx, e.g. 100 Continue,
        // asks for the body that is still to be sent).
        if !upstream_response.status.is_informational() {
            if let Some(guard) = &ctx.send_guard {
                guard.answered();
            }
        }
        Ok(())
    }

    /// An HTTP/1.0 client cannot read a chunked body: a response the upstream sent without a
    /// length goes to it as HTTP/1.0 does it, delimited by closing the connection (pingora
    /// converts such responses to chunked for HTTP/1.1 clients).
    async fn response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        _ctx: &mut Ctx,
    ) -> Result<()> {
        if session.req_header().version == pingora::http::Version::HTTP_10
            && response.headers.contains_key("transfer-encoding")
        {
            response.remove_header("transfer-encoding");
            response.set_version(pingora::http::Version::HTTP_10);
            response.insert_header("connection", "close")?;
        }
        Ok(())
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        // An interim answer (100 Continue) is no answer yet: a final one can still follow it.
        let began = session
            .response_written()
            .filter(|r| !r.status.is_informational());
        if let Some(sent) = began {
            // The upstream's answer has begun to reach the client. An error written now would
            // become part of its body, and with the body's end after it the client would take
            // a cut-off answer for a complete one: the connection is closed instead, without
            // the body's end, so the client sees the answer is incomplete.
            let status = sent.status.as_u16();
            ctx.outcome = "cut_off";
            self.metrics
                .upstream_errors
                .with_label_values(&["after_response_began"])
                .inc();
            return FailToProxy {
                error_code: status,
                can_reuse_downstream: false,
            };
        }
        if ctx.send_guard.as_ref().is_some_and(SendGuard::was_cut) {
            ctx.outcome = "send_deadline";
            self.metrics
                .upstream_errors
                .with_label_values(&["send_deadline"])
                .inc();
            // Whether the client's whole request had been read (and so passed on) when the
            // reset came: then the upstream may hold all of it, only its answer was late.
            let message = if session.is_body_done() {
                "The upstream did not answer before the fencing grant's send-by time, so the \
                 proxy reset the upstream connection. The whole request had been passed on: \
                 the upstream may have received and applied it. Check before retrying (or \
                 retry on a route with Idempotency-Key handling); for slow upstreams raise \
                 grant_ms."
            } else {
                "The request could not be sent to the upstream before its fencing grant's \
                 send-by time, so the proxy reset the upstream connection: the upstream holds \
                 at most an incomplete request, which it discards. Retry; for large bodies or \
                 slow upstreams raise grant_ms."
            };
            let body = json!({ "error": "upstream_timeout", "message": message });
            let code = match respond_json(session, 504, &body).await {
                Ok(()) => 504,
                Err(_) => 0,
            };
            return FailToProxy {
                error_code: code,
                can_reuse_downstream: false,
            };
        }
        let (status, code, kind) = match e.etype() {
            ErrorType::ConnectTimedout | ErrorType::ConnectRefused | ErrorType::ConnectError => {
                (502, "upstream_unavailable", "connect")
            }
            // A TLS handshake with the upstream that failed (its certificate not trusted or
            // not for the route's name) is a connection never made: nothing was sent.
            ErrorType::TLSHandshakeFailure
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::InvalidCert
            | ErrorType::HandshakeError
                if e.esource() == &ErrorSource::Upstream =>
            {
                (502, "upstream_unavailable", "connect")
            }
            ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
                (504, "upstream_timeout", "timeout")
            }
            _ if e.esource() == &ErrorSource::Upstream => (502, "upstream_error", "other"),
            _ if e.esource() == &ErrorSource::Downstream => (400, "bad_request", "downstream"),
            _ => (500, "proxy_error", "internal"),
        };
        ctx.outcome = "error";
        if kind != "downstream" {
            self.metrics
                .upstream_errors
                .with_label_values(&[kind])
                .inc();
        }
        let message = failure_message(kind, e.etype());
        let body = json!({ "error": code, "message": message });
        let code = match respond_json(session, status, &body).await {
            Ok(()) => status,
            Err(_) => 0,
        };
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut Ctx) {
        conn_limits::request_done(session);
        self.metrics
            .seconds
            .with_label_values(&[ctx.outcome])
            .observe(ctx.started.elapsed().as_secs_f64());
    }
}

/// What a client is told of a failure to proxy its request: what happened and what it means
/// for the request, in the proxy's words. The error itself (with the upstream's address and
/// the proxy's internals) is for the node's log, not for clients.
fn failure_message(kind: &str, etype: &ErrorType) -> String {
    let what = match etype {
        ErrorType::ConnectTimedout => "connecting to the upstream timed out",
        ErrorType::ConnectRefused => "the upstream refused the connection",
        ErrorType::TLSHandshakeFailure
        | ErrorType::TLSHandshakeTimedout
        | ErrorType::InvalidCert
        | ErrorType::HandshakeError => "the TLS handshake with the upstream failed",
        ErrorType::ConnectError => "the connection to the upstream failed",
        ErrorType::ReadTimedout => {
            "the upstream did not answer within the route's upstream_timeout_ms"
        }
        ErrorType::WriteTimedout => "sending to the upstream timed out",
        ErrorType::ConnectionClosed => "the upstream closed the connection",
        ErrorType::ReadError | ErrorType::WriteError => "the connection to the upstream broke",
        ErrorType::InvalidHTTPHeader | ErrorType::H1Error | ErrorType::H2Error => {
            "the upstream's answer was not valid HTTP"
        }
        _ => etype.as_str(),
    };
    match kind {
        "connect" => format!("The upstream could not be reached ({what}). Nothing was sent to it."),
        "downstream" => format!(
            "The request could not be read ({}); the connection is closed.",
            etype.as_str()
        ),
        "internal" => format!(
            "The proxy failed to pass the request on ({}). It may or may not have reached the \
             upstream.",
            etype.as_str()
        ),
        _ => format!(
            "The request could not be proxied ({what}). It may or may not have reached the \
             upstream."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients are told what failed and what it means for their request, never where the
    /// upstream is or the proxy's internals.
    #[test]
    fn failure_messages_say_what_failed_in_the_proxys_words() {
        let refused = failure_message("connect", &ErrorType::ConnectRefused);
        assert!(refused.contains("refused the connection") && refused.contains("Nothing was sent"));
        let late = failure_message("timeout", &ErrorType::ReadTimedout);
        assert!(late.contains("upstream_timeout_ms") && late.contains("may or may not"));
        let reset = failure_message("other", &ErrorType::ConnectionClosed);
        assert!(reset.contains("closed the connection"), "{reset}");
        let bad = failure_message("downstream", &ErrorType::InvalidHTTPHeader);
        assert!(bad.contains("could not be read"), "{bad}");
    }

    fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/limited/a", None).expect("request");
        for (name, value) in headers {
            req.append_header(name.to_string(), *value).expect("header");
        }
        req
    }

    #[test]
    fn a_request_names_one_tenant() {
        assert_eq!(tenant_of(&request(&[]), "X-Tenant"), Ok(DEFAULT_TENANT));
        assert_eq!(
            tenant_of(&request(&[("X-Tenant", "acme")]), "X-Tenant"),
            Ok("acme")
        );
        for twice in [
            &[("X-Tenant", "acme"), ("X-Tenant", "other")][..],
            &[("X-Tenant", "acme"), ("X_Tenant", "other")][..],
        ] {
            let refused = tenant_of(&request(twice), "X-Tenant").expect_err("two tenants");
            assert_eq!(refused.error, ErrorCode::InvalidRequest);
        }
        assert!(tenant_of(&request(&[("X-Tenant", "a b")]), "X-Tenant").is_err());
    }
}
