//! Runs the fencing proxy inside the node's tokio runtime, on a listener the caller bound
//! (so tests can use port 0), until the caller's shutdown future completes.

use std::future::Future;
use std::os::fd::IntoRawFd;
use std::sync::Arc;

use lock_core::node::Node;
use pingora::server::configuration::ServerConf;
use pingora::server::{Fds, ListenFds};
use pingora::services::listening::Service as ListeningService;
use pingora::services::Service as _;
use tokio::sync::watch;

use crate::config::ProxyConfig;
use crate::conn_limits::{Connections, Limited};
use crate::gate::FenceGate;
use crate::idempotency::IdempotencyLayer;
use crate::metrics::ProxyMetrics;
use crate::quota::QuotaLimiter;
use crate::route::Routes;
use crate::send_deadline::SendWatchdog;
use crate::service::FenceProxy;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    #[error("invalid proxy config: {0}")]
    Config(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Starts the proxy for `node` on `listener`; returns the task serving it, which ends once
/// `shutdown` has completed and pingora has stopped the service.
pub fn start(
    node: Arc<Node>,
    config: &ProxyConfig,
    listener: std::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, ProxyError> {
    config.validate().map_err(ProxyError::Config)?;
    for warning in config
        .check_tenants(node.auth_on())
        .map_err(ProxyError::Config)?
    {
        tracing::warn!("{warning}");
    }
    let routes =
        Routes::new(config.routes.clone()).map_err(|e| ProxyError::Config(e.to_string()))?;
    let metrics = ProxyMetrics::new(&node.metrics.registry);
    let connections = Connections::new(config.limits.clone(), &node.metrics.registry);
    let idempotency = Arc::new(
        IdempotencyLayer::new(
            node.clone(),
            &node.metrics.registry,
            metrics.upstream_errors.clone(),
        )
        .with_unsafe_no_records(config.unsafe_no_idempotency),
    );
    let quotas = (!config.quotas.is_empty()).then(|| {
        Arc::new(
            QuotaLimiter::new(node.clone(), &config.quotas, &node.metrics.registry)
                .with_unsafe_refill_on_renew(config.unsafe_refill_on_renew),
        )
    });
    if config.unsafe_refill_on_renew {
        tracing::warn!(
            "fencing proxy started with unsafe_refill_on_renew = true: rate-limit buckets are \
             refilled on every quota lease renewal, so tenants can exceed their limits \
             (demonstrations only)"
        );
    }
    let keys = node.clone();
    let auth_on = node.auth_on();
    let gate = Arc::new(FenceGate::new(node, config.grant_ms));
    let revocations = tokio::spawn(gate.clone().serve_revocations());
    let watchdog = Arc::new(SendWatchdog::default());
    let watching = tokio::spawn(watchdog.clone().run());
    let proxy = FenceProxy::new(routes, gate, metrics, watchdog)
        .with_tenants_from_keys(keys, auth_on)
        .with_unsafe_no_fencing(config.unsafe_no_fencing)
        .with_idempotency(idempotency)
        .with_quotas(quotas.clone());
    if config.unsafe_no_fencing {
        tracing::warn!(
            "fencing proxy started with unsafe_no_fencing = true: protected writes are forwarded \
             WITHOUT fence checks (demonstrations only)"
        );
    }
    if config.unsafe_no_idempotency {
        tracing::warn!(
            "fencing proxy started with unsafe_no_idempotency = true: retried Idempotency-Key \
             requests run again (demonstrations only)"
        );
    }

    let server_conf = Arc::new(ServerConf::default());
    // pingora's own service, with the connection cap and head deadline in front of its app.
    let app = Limited::new(pingora::proxy::http_proxy(&server_conf, proxy), connections);
    let mut service = ListeningService::new("fencing proxy".to_string(), app);
    let addr = listener.local_addr()?.to_string();
    listener.set_nonblocking(true)?;
    match &config.tls {
        None => service.add_tcp(&addr),
        Some(tls) => {
            let path = |p: &std::path::Path| p.to_str().map(str::to_string);
            let (Some(cert), Some(key)) = (path(&tls.cert_file), path(&tls.key_file)) else {
                return Err(ProxyError::Config(
                    "proxy.tls paths must be valid UTF-8".to_string(),
                ));
            };
            // pingora reads the files only once its listener runs, and panics there on a
            // missing or unusable one, leaving the node up without its proxy: check them now,
            // as the node's own listener does, so a bad pair stops the start.
            lock_core::api::listen::tls_acceptor(tls)
                .map_err(|e| ProxyError::Config(format!("proxy.tls: {e}")))?;
            service.add_tls(&addr, &cert, &key).map_err(|e| {
                ProxyError::Config(format!(
                    "proxy.tls: cannot use certificate {cert} with key {key}: {e}"
                ))
            })?;
        }
    }
    // Hand pingora the socket we bound instead of letting it bind the address itself.
    let mut fds = Fds::new();
    fds.add(addr, listener.into_raw_fd());
    let fds: ListenFds = Arc::new(parking_lot::Mutex::new(fds));
    Ok(tokio::spawn(async move {
        // pingora stops a service through a watch channel. Bridging the caller's future to it
        // here, in the service's own task, leaves nothing behind when the task is aborted.
        // The revocation listener lives exactly as long as this task, even if it is aborted.
        let _revocations = AbortOnDrop(revocations);
        let _watching = AbortOnDrop(watching);
        let _quotas = quotas.map(StopOnDrop);
        let (stop_tx, stop_rx) = watch::channel(false);
        let serve = service.start_service(Some(fds), stop_rx, 1);
        tokio::pin!(serve);
        tokio::select! {
            () = &mut serve => {}
            () = shutdown => {
                let _ = stop_tx.send(true);
                serve.await;
            }
        }
    }))
}

/// Stops the quota lessors when the proxy's task ends, even if it is aborted.
struct StopOnDrop(Arc<QuotaLimiter>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
