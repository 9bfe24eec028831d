//! The client handle: node addresses, options, and the lock calls.

use std::sync::Arc;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::acquire::{acquire, validate_resource};
use super::guard::LeaseGuard;
use super::transport::Transport;
use super::{AcquireOptions, ClientOptions, Error, Lease};
use crate::wire::{
    CancelRequest, CancelResponse, LeaseId, LeaseRequest, ReleaseResponse, RenewResponse,
};

/// A client for a fencegate cluster. Cheap to clone; clones share one connection pool.
///
/// It talks to one node at a time and moves to the next after a connection error, a timeout
/// or a `503`; any node serves any call (followers forward to the leader).
#[derive(Clone)]
pub struct Client {
    transport: Arc<Transport>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("nodes", &self.transport.nodes())
            .field("options", &self.transport.opts)
            .finish()
    }
}

impl Client {
    /// A client with default options. `nodes` are base URLs such as `http://127.0.0.1:7001`.
    ///
    /// Every URL is parsed here, and refused with [`Error::Invalid`] naming it and why: only
    /// `http://host[:port]` with an optional trailing `/` is a node URL (no path, query,
    /// fragment or credentials; a valid host and a port from 1 to 65535). `https://` is
    /// refused too: the client speaks plain HTTP only (it is built without TLS).
    pub fn new<I, S>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_options(nodes, ClientOptions::default())
    }

    /// A client with options. Besides the node URLs (see [`new`](Self::new)), options that
    /// make no sense are refused with [`Error::Invalid`]: a zero `request_timeout`,
    /// `call_timeout`, `backoff_base` or `backoff_max`, a `backoff_max` below `backoff_base`,
    /// a `safety_margin_ratio` that is not a number from 0 up to 0.5.
    pub fn with_options<I, S>(nodes: I, options: ClientOptions) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let nodes = nodes.into_iter().map(Into::into).collect();
        Ok(Client {
            transport: Arc::new(Transport::new(nodes, options)?),
        })
    }

    pub fn options(&self) -> &ClientOptions {
        &self.transport.opts
    }

    pub fn nodes(&self) -> &[String] {
        self.transport.nodes()
    }

    /// Acquires `resource` and returns a guard that keeps renewing it.
    ///
    /// One request id covers the whole call: timeouts, connection errors and `503`s are
    /// retried with it (exponential backoff with jitter, moving between nodes) until
    /// `opts.deadline`, so a retry can never create a second lease. `lock_held` is returned
    /// at once unless `opts.wait_timeout` is set, in which case the call queues (FIFO) for
    /// up to that long.
    ///
    /// Dropping the returned future before it completes (or a failure after an attempt whose
    /// outcome is unknown) cleans up on the server in a spawned task, best effort within
    /// `call_timeout`: `cancel` removes a queued wait; if the server answers that the request
    /// id is not waiting, the acquire is sent once more, try-once, with the same request id,
    /// which returns the original grant if one was made (its answer lost, or the lock handed
    /// over as the future was dropped), and that lease is released. If the abandoned acquire
    /// never reached the server, this replay is a fresh try-once acquire: it may take the lock
    /// and releases it at once (spending a fencing token). A definite refusal sends only the
    /// cancel. Nothing is sent without a Tokio runtime; the wait timeout and the TTL bound what
    /// is left.
    ///
    /// `opts.deadline` of zero is refused with [`Error::Invalid`]; huge durations (in `opts`
    /// or the client's options) mean "no bound" and never overflow.
    pub async fn acquire(&self, resource: &str, opts: AcquireOptions) -> Result<LeaseGuard, Error> {
        acquire(&self.transport, resource, opts).await
    }

    /// Renews a lease by id, once (retrying uncertain outcomes up to `call_timeout`). For
    /// tools like the CLI; applications hold a [`LeaseGuard`], which renews by itself.
    pub async fn renew(&self, resource: &str, lease_id: LeaseId) -> Result<Lease, Error> {
        let body = LeaseRequest {
            lease_id: Some(lease_id),
        };
        let (_, r): (_, RenewResponse) = self.call(resource, "renew", &body).await?;
        Ok(Lease {
            resource: resource.to_string(),
            lease_id: r.lease_id,
            fencing_token: r.fencing_token,
            ttl_ms: r.ttl_ms,
            expires_at_ms: r.expires_at_ms,
        })
    }

    /// Releases a lease by id. `Ok(false)` if it was not held (already expired, released or
    /// replaced): release is idempotent and never touches a newer holder.
    pub async fn release(&self, resource: &str, lease_id: LeaseId) -> Result<bool, Error> {
        let body = LeaseRequest {
            lease_id: Some(lease_id),
        };
        let (_, r): (_, ReleaseResponse) = self.call(resource, "release", &body).await?;
        Ok(r.released)
    }

    /// Cancels a pending (or granted but unseen) acquire by its request id.
    pub async fn cancel(&self, resource: &str, request_id: &str) -> Result<bool, Error> {
        let body = CancelRequest {
            request_id: request_id.to_string(),
        };
        let (_, r): (_, CancelResponse) = self.call(resource, "cancel", &body).await?;
        Ok(r.cancelled)
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        resource: &str,
        action: &str,
        body: &B,
    ) -> Result<(Instant, T), Error> {
        validate_resource(resource)?;
        let until = self.transport.until(self.transport.opts.call_timeout);
        self.transport
            .call_until(resource, action, body, until)
            .await
            .map_err(|f| f.into_error(resource))
    }
}
