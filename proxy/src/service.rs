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

use crate::gate::{Admission, FenceGate};
use crate::metrics::ProxyMetrics;
use crate::route::Routes;
use crate::verdict::{check_resource_header, parse_token, Rejection};

pub struct FenceProxy {
    routes: Routes,
    gate: Arc<FenceGate>,
    metrics: ProxyMetrics,
}

/// Per-request state.
pub struct Ctx {
    route: Option<usize>,
    started: Instant,
    outcome: &'static str,
}

impl FenceProxy {
    pub fn new(routes: Routes, gate: Arc<FenceGate>, metrics: ProxyMetrics) -> Self {
        FenceProxy {
            routes,
            gate,
            metrics,
        }
    }

    fn decide(&self, outcome: &'static str, reason: &str) {
        self.metrics
            .decisions
            .with_label_values(&[outcome, reason])
            .inc();
    }
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
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let req = session.req_header();
        let Some(m) = self.routes.find(req.uri.path()) else {
            ctx.outcome = "no_route";
            let body = json!({
                "error": "no_route",
                "message": "No proxy route matches this path; see the proxy's route config.",
            });
            respond_json(session, 404, &body).await?;
            return Ok(true);
        };
        ctx.route = Some(m.route);
        let route = self
            .routes
            .get(m.route)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "route index out of range"))?;
        if !route.is_protected(req.method.as_str()) {
            ctx.outcome = "passthrough";
            self.decide("passthrough", "unprotected_method");
            return Ok(false);
        }
        let upstream_timeout = Duration::from_millis(route.config.upstream_timeout_ms);
        let checked = async {
            lock_core::api::validate_resource(&m.resource)
                .map_err(|e| Rejection::BadResource(e.message))?;
            check_resource_header(
                req.headers.get("fence-resource").map(|v| v.as_bytes()),
                &m.resource,
            )?;
            let token = parse_token(req.headers.get("fence-token").map(|v| v.as_bytes()))?;
            self.gate.admit(&m.resource, token, upstream_timeout).await
        }
        .await;
        match checked {
            Ok(admission) => {
                let reason = match admission {
                    Admission::FastPath => "fast_path",
                    Admission::Consensus => "consensus",
                };
                self.decide("forwarded", reason);
                Ok(false)
            }
            Err(rejection) => {
                ctx.outcome = "rejected";
                self.decide("rejected", rejection.code());
                tracing::info!(
                    target: "fencegate::audit",
                    op = "proxy_write",
                    resource = %m.resource,
                    outcome = rejection.code(),
                );
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
        let mut peer = HttpPeer::new(route.config.upstream.as_str(), false, String::new());
        // The epoch barrier's guarantee is stated in terms of these bounds (docs/fencing.md).
        peer.options.connection_timeout = Some(timeout);
        peer.options.total_connection_timeout = Some(timeout);
        peer.options.read_timeout = Some(timeout);
        peer.options.write_timeout = Some(timeout);
        Ok(Box::new(peer))
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let (status, code, kind) = match e.etype() {
            ErrorType::ConnectTimedout | ErrorType::ConnectRefused | ErrorType::ConnectError => {
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
        let body = json!({
            "error": code,
            "message": format!("The request could not be proxied: {e}. It may or may not have reached the upstream."),
        });
        let code = match respond_json(session, status, &body).await {
            Ok(()) => status,
            Err(_) => 0,
        };
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, _session: &mut Session, _e: Option<&Error>, ctx: &mut Ctx) {
        self.metrics
            .seconds
            .with_label_values(&[ctx.outcome])
            .observe(ctx.started.elapsed().as_secs_f64());
    }
}
