//! Client for node-to-node calls, with the fault layer applied. Calls go over framed
//! connections (see [`frames`](super::frames)), kept open and reused, or over HTTP to a peer
//! that speaks only that. Bodies are in the peer wire format (see [`codec`](super::codec)),
//! never JSON.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{de::DeserializeOwned, Serialize};

use super::auth::{PeerSecret, AUTH_HEADER};
use super::codec::{self, CodecError};
use super::faults::FaultLayer;
use super::frames::{FrameError, FramedConn};

/// Header naming the sending node, so the receiver can apply its incoming fault rules.
pub const FROM_HEADER: &str = "x-fencegate-from";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    #[error("request to node {0} dropped by an injected fault")]
    Dropped(u64),
    #[error("node {node} unreachable: {source}")]
    Unreachable {
        node: u64,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("message to or from node {node}: {source}")]
    Codec {
        node: u64,
        #[source]
        source: CodecError,
    },
    #[error("node {node} answered {status}: {body}")]
    Status {
        node: u64,
        status: u16,
        body: String,
    },
}

#[derive(Clone, Debug)]
pub struct PeerClient {
    http: reqwest::Client,
    self_id: u64,
    faults: FaultLayer,
    secret: PeerSecret,
    framed: Arc<Framed>,
    /// How long each peer has lately taken to answer appends.
    appends: Arc<AppendTimes>,
}

/// How long appends to each peer take to be answered (failures count as what they took),
/// smoothed over the last few: which follower keeps up best, when a leader hands over.
#[derive(Debug, Default)]
struct AppendTimes(std::sync::Mutex<std::collections::HashMap<u64, (Instant, Duration)>>);

impl AppendTimes {
    fn record(&self, target: u64, took: Duration) {
        let mut times = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let smoothed = match times.get(&target) {
            Some((_, before)) => (*before * 7 + took) / 8,
            None => took,
        };
        times.insert(target, (Instant::now(), smoothed));
    }

    fn recent(&self, target: u64, within: Duration) -> Option<Duration> {
        let times = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (at, smoothed) = times.get(&target)?;
        (at.elapsed() <= within).then_some(*smoothed)
    }
}

/// How long opening a connection to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a connection may wait in the pool unused: below the peer listener's idle close,
/// so a pooled connection is never reused just as the other side closes it.
const POOL_IDLE: Duration = Duration::from_secs(20);

/// Idle connections kept per peer. A peer gets one call at a time per replication stream and
/// a few forwarded batches at once; more than this are closed after their call.
const POOL_PER_PEER: usize = 8;

/// How long a peer that answered the framed handshake as an HTTP server (a node of an earlier
/// version) gets HTTP calls before the framed protocol is tried again.
const HTTP_ONLY_FOR: Duration = Duration::from_secs(60);

/// The largest reply accepted on a framed connection.
const MAX_REPLY: usize = 64 << 20;

/// Idle framed connections by peer address, and the peers that speak HTTP only.
#[derive(Default)]
struct Framed {
    idle: Mutex<HashMap<String, Vec<(FramedConn, Instant)>>>,
    http_only: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for Framed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Framed(..)")
    }
}

impl Framed {
    fn take(&self, addr: &str) -> Option<FramedConn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.get_mut(addr)?;
        while let Some((conn, since)) = conns.pop() {
            if since.elapsed() < POOL_IDLE {
                return Some(conn);
            }
        }
        None
    }

    fn put(&self, addr: &str, conn: FramedConn) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.entry(addr.to_string()).or_default();
        if conns.len() < POOL_PER_PEER {
            conns.push((conn, Instant::now()));
        }
    }

    fn speaks_http_only(&self, addr: &str) -> bool {
        let mut http_only = self.http_only.lock().unwrap_or_else(|e| e.into_inner());
        match http_only.get(addr) {
            Some(since) if since.elapsed() < HTTP_ONLY_FOR => true,
            Some(_) => {
                http_only.remove(addr);
                false
            }
            None => false,
        }
    }

    fn mark_http_only(&self, addr: &str) {
        let mut http_only = self.http_only.lock().unwrap_or_else(|e| e.into_inner());
        http_only.insert(addr.to_string(), Instant::now());
    }
}

impl PeerClient {
    pub fn new(self_id: u64, faults: FaultLayer, secret: PeerSecret) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // Below the peer listener's idle close (its header timeout, 30 s by default), so a
            // pooled connection is never reused just as the other side closes it.
            .pool_idle_timeout(Duration::from_secs(20))
            .tcp_nodelay(true)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self {
            http,
            self_id,
            faults,
            secret,
            framed: Arc::default(),
            appends: Arc::default(),
        }
    }

    /// Notes that an append to `target` was answered (or failed) after `took`.
    pub fn append_took(&self, target: u64, took: Duration) {
        self.appends.record(target, took);
    }

    /// How long appends to `target` have lately taken to be answered, smoothed, if one was
    /// answered or failed within `within`.
    pub fn append_round_trip(&self, target: u64, within: Duration) -> Option<Duration> {
        self.appends.recent(target, within)
    }

    pub fn faults(&self) -> &FaultLayer {
        &self.faults
    }

    /// Sends `method path` with a JSON `body` (empty: none) to another node's public API over
    /// plain HTTP (`http://{addr}{path}`) and returns the status and body of its answer: how a
    /// member of an earlier version, without the peer port's API relay, is reached.
    pub async fn http_json(
        &self,
        method: &str,
        addr: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
        authorization: Option<&str>,
    ) -> Result<(u16, String), reqwest::Error> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
        let mut request = self
            .http
            .request(method, format!("http://{addr}{path}"))
            .timeout(timeout);
        if !body.is_empty() {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        if let Some(auth) = authorization {
            request = request.header(reqwest::header::AUTHORIZATION, auth);
        }
        let resp = request.send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    }

    /// POSTs `body` in the peer format to `http://{addr}{path}` on node `target` and decodes
    /// a 200 reply.
    pub async fn post<Req, Resp>(
        &self,
        target: u64,
        addr: &str,
        path: &str,
        body: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        let codec_error = |source| PeerError::Codec {
            node: target,
            source,
        };
        let body = codec::encode(body).map_err(codec_error)?;
        let reply = self.post_frame(target, addr, path, body, timeout).await?;
        codec::decode(&reply).map_err(codec_error)
    }

    /// Sends an already encoded peer body to `path` on node `target` and returns the bytes of
    /// a 2xx reply: over a framed connection, or over HTTP to a peer that speaks only that.
    pub async fn post_frame(
        &self,
        target: u64,
        addr: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<bytes::Bytes, PeerError> {
        self.faults
            .outgoing(target)
            .await
            .map_err(|_| PeerError::Dropped(target))?;
        if !self.framed.speaks_http_only(addr) {
            let framed = tokio::time::timeout(timeout, self.call_framed(addr, path, &body)).await;
            let failed =
                |source: Box<dyn std::error::Error + Send + Sync>| PeerError::Unreachable {
                    node: target,
                    source,
                };
            match framed {
                Err(elapsed) => return Err(failed(Box::new(elapsed))),
                Ok(Ok((status, reply))) => {
                    return if (200..300).contains(&status) {
                        Ok(reply)
                    } else {
                        Err(PeerError::Status {
                            node: target,
                            status,
                            body: String::from_utf8_lossy(&reply).into_owned(),
                        })
                    };
                }
                Ok(Err(FrameError::HttpOnly)) => self.framed.mark_http_only(addr),
                Ok(Err(FrameError::Refused(message))) => {
                    return Err(PeerError::Status {
                        node: target,
                        status: 401,
                        body: message,
                    })
                }
                Ok(Err(e)) => return Err(failed(Box::new(e))),
            }
        }
        self.post_http(target, addr, path, body, timeout).await
    }

    /// One call on a pooled framed connection (a new one if none is idle). A connection that
    /// failed is dropped, never pooled again. A pooled connection the peer closed meanwhile (it
    /// restarted, or closed it as idle) fails on its first read or write; the call is then
    /// made once more on a new connection. Peer calls are safe to repeat: raft tolerates
    /// duplicate messages and forwarded commands are idempotent.
    async fn call_framed(
        &self,
        addr: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, bytes::Bytes), FrameError> {
        if let Some(mut conn) = self.framed.take(addr) {
            match conn.call(path, body).await {
                Ok(reply) => {
                    self.framed.put(addr, conn);
                    return Ok(reply);
                }
                Err(FrameError::Io(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let open = FramedConn::open(addr, self.self_id, &self.secret, MAX_REPLY);
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, open)
            .await
            .map_err(|e| FrameError::Io(e.into()))??;
        let reply = conn.call(path, body).await?;
        self.framed.put(addr, conn);
        Ok(reply)
    }

    /// POSTs an already encoded peer body over HTTP, signed, and returns the bytes of a 2xx
    /// reply.
    async fn post_http(
        &self,
        target: u64,
        addr: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<bytes::Bytes, PeerError> {
        let unreachable = |source: reqwest::Error| PeerError::Unreachable {
            node: target,
            source: Box::new(source),
        };
        let from = self.self_id.to_string();
        let tag = self.secret.sign(&from, path, &body);
        let resp = self
            .http
            .post(format!("http://{addr}{path}"))
            .header(FROM_HEADER, from)
            .header(AUTH_HEADER, tag)
            .header(reqwest::header::CONTENT_TYPE, codec::CONTENT_TYPE)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(unreachable)?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(PeerError::Status {
                node: target,
                status: status.as_u16(),
                body,
            });
        }
        resp.bytes().await.map_err(unreachable)
    }
}
