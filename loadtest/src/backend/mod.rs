//! The systems under test behind one interface: fencegate's HTTP lock API ([`fencegate`]:
//! lean HTTP/1.1 connections ([`http1`]) speaking `lock_core::wire`, one connection pool and
//! one concurrency limit per node) and etcd's lease + lock API ([`etcd`], etcd-client).
//!
//! Each call returns the final outcome after retries plus the code of every failed attempt.
//! Retries reuse the same `request_id` / `lease_id`, which the API makes safe: a retried
//! acquire returns the original lease.

mod etcd;
mod fencegate;
pub mod http1;

use std::time::{Duration, Instant};

use lock_core::wire::LeaseId;
use tokio::sync::{Semaphore, SemaphorePermit};

pub use etcd::{EtcdClient, EtcdKeeper};
pub use fencegate::FencegateClient;

/// A granted lease, as the client holds it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub lease: Lease,
    /// fencegate: the fencing token; etcd: the revision that created the lock key.
    pub token: u64,
}

/// What the holder sends back to renew and release.
#[derive(Clone, Debug)]
pub enum Lease {
    Fencegate(LeaseId),
    /// etcd: the lease, and the lock key to unlock.
    Etcd {
        id: i64,
        key: Vec<u8>,
    },
}

impl Grant {
    /// The lease id as a number, for duplicate checks.
    pub fn lease_num(&self) -> u128 {
        match &self.lease {
            Lease::Fencegate(id) => id.0,
            Lease::Etcd { id, .. } => *id as u64 as u128,
        }
    }
}

/// Why a call did not succeed.
#[derive(Clone, Debug)]
pub struct Failure {
    /// A `lock_core::wire::ErrorCode`, or the client's own (`client_timeout`, `grpc_…`).
    pub code: String,
    /// The server gave a final answer (4xx) rather than an uncertain one.
    pub definite: bool,
}

/// The result of one logical call.
pub struct Call<T> {
    pub result: Result<T, Failure>,
    /// Codes of the failed attempts (including the final one).
    pub errors: Vec<String>,
    /// When the first attempt went out (after waiting for a connection): a lease granted by
    /// this call cannot have been stamped earlier, so its validity is counted from here.
    pub first_send: Instant,
    /// How long the first attempt waited for a free connection before it went out.
    pub connection_wait: Duration,
    /// When the successful (or last) attempt went out.
    pub last_send: Instant,
    /// When the final answer arrived: a server answer "lease gone" was decided before this.
    pub answered: Instant,
}

impl<T> Call<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Call<U> {
        Call {
            result: self.result.map(f),
            errors: self.errors,
            first_send: self.first_send,
            connection_wait: self.connection_wait,
            last_send: self.last_send,
            answered: self.answered,
        }
    }

    /// A call of one attempt that went out at `sent`, answered now.
    fn single(result: Result<T, Failure>, sent: Sent) -> Self {
        let errors = match &result {
            Err(f) => vec![f.code.clone()],
            Ok(_) => Vec::new(),
        };
        Call {
            result,
            errors,
            first_send: sent.at,
            connection_wait: sent.connection_wait,
            last_send: sent.at,
            answered: Instant::now(),
        }
    }
}

/// When a request went out, and how long it waited for a free connection first.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub at: Instant,
    pub connection_wait: Duration,
}

impl Sent {
    /// A request that goes out now, on a stream that was already open.
    fn now() -> Self {
        Sent {
            at: Instant::now(),
            connection_wait: Duration::ZERO,
        }
    }
}

/// Waits for one of `permits` (a free connection): the permit, and when the request that
/// holds it goes out.
async fn connection(permits: &Semaphore) -> (Option<SemaphorePermit<'_>>, Sent) {
    let asked = Instant::now();
    // The semaphores are never closed; without a permit the call simply goes unbounded.
    let permit = permits.acquire().await.ok();
    let at = Instant::now();
    (
        permit,
        Sent {
            at,
            connection_wait: at - asked,
        },
    )
}

pub enum Backend {
    Fencegate(FencegateClient),
    Etcd(EtcdClient),
}

impl Backend {
    pub async fn acquire(
        &self,
        resource: u32,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Call<Grant> {
        match self {
            Backend::Fencegate(c) => c.acquire(resource, request_id, ttl_ms, wait_ms).await,
            Backend::Etcd(c) => c.acquire(resource, ttl_ms, wait_ms).await,
        }
    }

    /// Ok(true) renewed, Ok(false) the server says the lease is gone.
    pub async fn renew(&self, resource: u32, grant: &Grant) -> Call<bool> {
        match self {
            Backend::Fencegate(c) => c.renew(resource, grant).await,
            Backend::Etcd(c) => c.renew(grant).await,
        }
    }

    /// What renews `grant` again and again (etcd: opens its keep-alive stream).
    pub async fn renewer(&self, resource: u32, grant: Grant) -> Result<Renewer<'_>, Failure> {
        Ok(match self {
            Backend::Fencegate(client) => Renewer::Fencegate {
                client,
                resource,
                grant,
            },
            Backend::Etcd(c) => Renewer::Etcd(Box::new(c.keeper(&grant).await?)),
        })
    }

    /// Ok(true) released, Ok(false) the lease was no longer current.
    pub async fn release(&self, resource: u32, grant: &Grant) -> Call<bool> {
        match self {
            Backend::Fencegate(c) => c.release(resource, grant).await,
            Backend::Etcd(c) => c.release(grant).await,
        }
    }

    /// A fenced write through the proxy (fencegate only).
    pub async fn write(&self, resource: u32, grant: &Grant) -> Option<Call<()>> {
        match self {
            Backend::Fencegate(c) if c.has_proxies() => Some(c.write(resource, grant).await),
            _ => None,
        }
    }

    pub fn supports_writes(&self) -> bool {
        matches!(self, Backend::Fencegate(c) if c.has_proxies())
    }
}

/// One held lease renewed in a loop: fencegate a `/renew` call each time, etcd one round
/// trip on the lease's own keep-alive stream (how etcd's clients keep a lease).
pub enum Renewer<'a> {
    Fencegate {
        client: &'a FencegateClient,
        resource: u32,
        grant: Grant,
    },
    Etcd(Box<EtcdKeeper>),
}

impl Renewer<'_> {
    /// Ok(true) renewed, Ok(false) the server says the lease is gone.
    pub async fn renew(&mut self) -> Call<bool> {
        match self {
            Renewer::Fencegate {
                client,
                resource,
                grant,
            } => client.renew(*resource, grant).await,
            Renewer::Etcd(k) => k.renew().await,
        }
    }
}

pub fn resource_name(idx: u32) -> String {
    format!("kv:lt{idx}")
}
