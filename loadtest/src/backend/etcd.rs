//! The etcd driver, for comparison: etcd's own lease and lock API through etcd-client.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::{connection, Call, Failure, Grant, Lease, Sent};

/// etcd: lease grant + lock (with the lease) to acquire, one keep-alive round trip to renew,
/// unlock + lease revoke to release. One gRPC connection per member.
pub struct EtcdClient {
    members: Vec<(etcd_client::Client, Semaphore)>,
    next: AtomicUsize,
    timeout: Duration,
}

impl EtcdClient {
    pub async fn connect(
        endpoints: &[String],
        connections: usize,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let mut members = Vec::new();
        for e in endpoints {
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(timeout);
            let c = etcd_client::Client::connect([e.as_str()], Some(opts)).await?;
            members.push((c, Semaphore::new(connections)));
        }
        Ok(EtcdClient {
            members,
            next: AtomicUsize::new(0),
            timeout,
        })
    }

    fn member(&self) -> &(etcd_client::Client, Semaphore) {
        &self.members[self.next.fetch_add(1, Ordering::Relaxed) % self.members.len()]
    }

    pub async fn acquire(&self, resource: u32, ttl_ms: u64, wait_ms: u64) -> Call<Grant> {
        let (client, permits) = self.member();
        let (_p, sent) = connection(permits).await;
        let mut c = client.clone();
        let ttl_s = ttl_ms.div_ceil(1000) as i64;
        let r: Result<Grant, Failure> = async {
            let lease = etcd_timeout(self.timeout, c.lease_grant(ttl_s, None)).await?;
            let id = lease.id();
            let opts = etcd_client::LockOptions::new().with_lease(id);
            let name = format!("/lt/lock/{resource}");
            // etcd's lock waits for the key; a try-once acquire gets a short deadline.
            let wait = if wait_ms > 0 {
                Duration::from_millis(wait_ms)
            } else {
                self.timeout
            };
            let lock = match etcd_timeout(wait, c.lock(name, Some(opts))).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = etcd_timeout(self.timeout, c.lease_revoke(id)).await;
                    return Err(e);
                }
            };
            let token = lock.header().map_or(0, |h| h.revision()) as u64;
            Ok(Grant {
                lease: Lease::Etcd {
                    id,
                    key: lock.key().to_vec(),
                },
                token,
            })
        }
        .await;
        Call::single(r, sent)
    }

    /// One renewal on a stream of its own, opened for it (the open loop's renewals are
    /// seconds apart, so a client would not keep a stream per lease open between them).
    pub async fn renew(&self, grant: &Grant) -> Call<bool> {
        let (client, permits) = self.member();
        let (_p, sent) = connection(permits).await;
        match open_keeper(client, grant, self.timeout).await {
            Ok(mut k) => {
                let mut call = k.renew().await;
                call.first_send = sent.at;
                call.connection_wait = sent.connection_wait;
                call
            }
            Err(f) => Call::single(Err(f), sent),
        }
    }

    /// A keep-alive stream for the grant's lease, on the next member, kept open by the
    /// caller for many renewals.
    pub async fn keeper(&self, grant: &Grant) -> Result<EtcdKeeper, Failure> {
        open_keeper(&self.member().0, grant, self.timeout).await
    }

    pub async fn release(&self, grant: &Grant) -> Call<bool> {
        let (client, permits) = self.member();
        let (_p, sent) = connection(permits).await;
        let mut c = client.clone();
        let (id, key) = etcd_lease(grant);
        let r = async {
            etcd_timeout(self.timeout, c.unlock(key.to_vec())).await?;
            match etcd_timeout(self.timeout, c.lease_revoke(id)).await {
                Ok(_) => Ok(true),
                // Revoking a lease that already expired: the lock key went with it.
                Err(f) if f.code == "lease_not_found" || f.code.contains("NotFound") => Ok(false),
                Err(f) => Err(f),
            }
        }
        .await;
        Call::single(r, sent)
    }
}

async fn open_keeper(
    client: &etcd_client::Client,
    grant: &Grant,
    timeout: Duration,
) -> Result<EtcdKeeper, Failure> {
    let mut c = client.clone();
    let (id, _) = etcd_lease(grant);
    let (keeper, stream) = etcd_timeout(timeout, c.lease_keep_alive(id)).await?;
    Ok(EtcdKeeper {
        keeper,
        stream,
        timeout,
    })
}

/// A lease's `LeaseKeepAlive` stream, as etcd's own clients keep one: each renewal is one
/// request and its response on the stream.
pub struct EtcdKeeper {
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
    timeout: Duration,
}

impl EtcdKeeper {
    /// Ok(true) renewed, Ok(false) etcd answered TTL 0: the lease is gone.
    pub async fn renew(&mut self) -> Call<bool> {
        let sent = Sent::now();
        let r = async {
            etcd_timeout(self.timeout, self.keeper.keep_alive()).await?;
            match etcd_timeout(self.timeout, self.stream.message()).await? {
                Some(resp) => Ok(resp.ttl() > 0),
                None => Err(Failure {
                    code: "stream_closed".into(),
                    definite: false,
                }),
            }
        }
        .await;
        Call::single(r, sent)
    }
}

async fn etcd_timeout<T>(
    d: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(d, f).await {
        Err(_) => Err(Failure {
            code: "client_timeout".into(),
            definite: false,
        }),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(etcd_client::Error::GRpcStatus(s))) => {
            let code = if s.message().contains("lease not found") {
                "lease_not_found".to_string()
            } else {
                format!("grpc_{:?}", s.code())
            };
            Err(Failure {
                code,
                definite: false,
            })
        }
        Ok(Err(e)) => Err(Failure {
            code: format!("etcd_{}", error_kind(&e)),
            definite: false,
        }),
    }
}

fn error_kind(e: &etcd_client::Error) -> &'static str {
    match e {
        etcd_client::Error::TransportError(_) => "transport",
        etcd_client::Error::IoError(_) => "io",
        etcd_client::Error::LeaseKeepAliveError(_) => "keepalive",
        _ => "other",
    }
}

/// The etcd lease of a grant (a fencegate grant has none: lease 0 is never granted).
fn etcd_lease(grant: &Grant) -> (i64, &[u8]) {
    match &grant.lease {
        Lease::Etcd { id, key } => (*id, key),
        Lease::Fencegate(_) => (0, &[]),
    }
}
