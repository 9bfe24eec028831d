//! The proxy listener's own limits, beside pingora's fixed ones: a cap on the connections it
//! serves at once and a deadline for each request head.
//!
//! pingora accepts connections and reads request heads before any hook of ours runs, with a
//! timeout per read only, so a client trickling a head one byte at a time holds a connection
//! for as long as it likes. Both limits therefore wrap what pingora hands the application: each
//! new connection's stream is wrapped in a [`LimitedStream`] that holds one of the
//! `max_connections` slots until the connection is dropped, and whose reads fail once the head
//! deadline has passed. The service marks the head as read in its first hook
//! ([`head_read`]) and marks the connection idle when a request ends ([`request_done`]); the
//! first byte of the next head on a kept-alive connection starts the deadline again. The idle
//! wait itself stays pingora's keep-alive timeout (60 s), so clients that pool connections see
//! the same idle lifetime as before. Body reads are not bounded by the deadline (pingora's
//! per-read timeout and the fence's send-by are).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora::proxy::Session;
use pingora::server::ShutdownWatch;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `[proxy.limits]`: the proxy listener's connection cap and head deadline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyLimits {
    /// Connections served at once; a connection beyond it is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Time a client has to send a whole request head, counted from the connection's start or,
    /// on a kept-alive connection, from the first byte of the next head.
    pub header_timeout_ms: u64,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            max_connections: 4_096,
            header_timeout_ms: 10_000,
        }
    }
}

impl ProxyLimits {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 || self.header_timeout_ms == 0 {
            return Err(format!(
                "proxy.limits: max_connections ({}) and header_timeout_ms ({}) must be > 0",
                self.max_connections, self.header_timeout_ms
            ));
        }
        Ok(())
    }
}

/// The connections of one proxy listener.
pub struct Connections {
    limits: ProxyLimits,
    open: AtomicUsize,
    /// Connections closed by a limit, by `reason` (`max_connections`, `header_timeout`).
    closed: IntCounterVec,
    /// `open`, as a metric.
    open_gauge: IntGauge,
}

impl Connections {
    pub fn new(limits: ProxyLimits, registry: &Registry) -> Arc<Self> {
        let closed = IntCounterVec::new(
            Opts::new(
                "proxy_connections_limited_total",
                "Proxy connections closed by a listener limit, by reason (max_connections, \
                 header_timeout)",
            ),
            &["reason"],
        )
        .unwrap_or_else(|e| panic!("metric: {e}"));
        // Both series exist from the start, so `increase()` sees the first close.
        for reason in ["max_connections", "header_timeout"] {
            closed.with_label_values(&[reason]);
        }
        let open_gauge = IntGauge::new(
            "proxy_connections_open",
            "Client connections open on the proxy's listener",
        )
        .unwrap_or_else(|e| panic!("metric: {e}"));
        // Registering twice (a second proxy in one process) is harmless: keep the first.
        let _ = registry.register(Box::new(closed.clone()));
        let _ = registry.register(Box::new(open_gauge.clone()));
        Arc::new(Connections {
            limits,
            open: AtomicUsize::new(0),
            closed,
            open_gauge,
        })
    }

    /// A slot for a new connection, if one is free.
    fn slot(self: &Arc<Self>) -> Option<Slot> {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limits.max_connections).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            self.closed.with_label_values(&["max_connections"]).inc();
            return None;
        }
        self.open_gauge.inc();
        Some(Slot(self.clone()))
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.limits.header_timeout_ms)
    }
}

/// One of the listener's connection slots, freed when the connection's stream is dropped.
struct Slot(Arc<Connections>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.open_gauge.dec();
    }
}

/// Where a connection is between heads, shared between the stream and the service's hooks.
const HEAD_DUE: u8 = 0;
const HEAD_READ: u8 = 1;
const IDLE: u8 = 2;

/// When the current request head must be in, shared between the stream and the service's hooks.
struct HeadClock {
    /// `HEAD_DUE` (reads are bounded by the deadline), `HEAD_READ` (a body or an answer is on
    /// its way: not bounded) or `IDLE` (between requests: the next byte starts a head).
    state: AtomicU8,
    /// The deadline while `HEAD_DUE`, in ms after `base`.
    deadline_ms: AtomicU64,
    base: Instant,
}

impl HeadClock {
    /// A head is due within `timeout` from now.
    fn arm(&self, timeout: Duration) {
        let at = self.base.elapsed() + timeout;
        self.deadline_ms
            .store(at.as_millis() as u64, Ordering::Release);
        self.state.store(HEAD_DUE, Ordering::Release);
    }
}

/// A client connection's stream under the listener's limits.
pub struct LimitedStream {
    inner: Stream,
    head: Arc<HeadClock>,
    /// Wakes a read that waits past the head deadline.
    timer: Pin<Box<Sleep>>,
    /// The deadline `timer` is set to, in ms after `head.base`.
    timer_ms: u64,
    connections: Arc<Connections>,
    _slot: Slot,
}

impl std::fmt::Debug for LimitedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitedStream")
            .field("inner", &self.inner)
            .finish()
    }
}

impl LimitedStream {
    fn new(inner: Stream, slot: Slot, connections: Arc<Connections>) -> Self {
        let base = Instant::now();
        let head = Arc::new(HeadClock {
            state: AtomicU8::new(HEAD_DUE),
            deadline_ms: AtomicU64::new(0),
            base,
        });
        head.arm(connections.timeout());
        let timer_ms = head.deadline_ms.load(Ordering::Acquire);
        LimitedStream {
            inner,
            timer: Box::pin(tokio::time::sleep_until(
                base + Duration::from_millis(timer_ms),
            )),
            timer_ms,
            head,
            connections,
            _slot: slot,
        }
    }

    /// Whether the head deadline has passed while a head is awaited (and arms the timer that
    /// wakes the reader at that deadline).
    fn head_overdue(&mut self, cx: &mut Context<'_>) -> bool {
        if self.head.state.load(Ordering::Acquire) != HEAD_DUE {
            return false;
        }
        let deadline = self.head.deadline_ms.load(Ordering::Acquire);
        if deadline != self.timer_ms {
            self.timer_ms = deadline;
            let at = self.head.base + Duration::from_millis(deadline);
            self.timer.as_mut().reset(at);
        }
        self.timer.as_mut().poll(cx).is_ready()
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.head_overdue(cx) {
            self.connections
                .closed
                .with_label_values(&["header_timeout"])
                .inc();
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the request head did not arrive within the proxy's header timeout",
            )));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        // The first byte after an idle wait starts the next head, and its deadline.
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let timeout = self.connections.timeout();
            let head = &self.head;
            if head.state.load(Ordering::Acquire) == IDLE {
                head.arm(timeout);
            }
        }
        read
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for LimitedStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for LimitedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for LimitedStream {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for LimitedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for LimitedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for LimitedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, socket_digest: SocketDigest) {
        self.inner.set_socket_digest(socket_digest)
    }
}

#[async_trait]
impl Peek for LimitedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

/// The head clock of the connection `session` arrived on, if it is under the limits.
fn clock(session: &Session) -> Option<&Arc<HeadClock>> {
    session
        .as_downstream()
        .stream()?
        .as_any()
        .downcast_ref::<LimitedStream>()
        .map(|s| &s.head)
}

/// The request's head has been read: its body is not bounded by the head deadline.
pub fn head_read(session: &Session) {
    if let Some(head) = clock(session) {
        head.state.store(HEAD_READ, Ordering::Release);
    }
}

/// The request is over: the connection waits for its next head, whose first byte starts the
/// deadline again.
pub fn request_done(session: &Session) {
    if let Some(head) = clock(session) {
        head.state.store(IDLE, Ordering::Release);
    }
}

/// A pingora application with the listener's limits in front: a new connection gets a slot
/// (or is closed) and its stream is wrapped; a kept-alive one comes back already wrapped.
pub struct Limited<A> {
    inner: Arc<A>,
    connections: Arc<Connections>,
}

impl<A> Limited<A> {
    pub fn new(inner: A, connections: Arc<Connections>) -> Self {
        Limited {
            inner: Arc::new(inner),
            connections,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Limited<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let stream: Stream = if stream.as_any().is::<LimitedStream>() {
            stream
        } else {
            // Dropping the stream closes a connection beyond the cap at once.
            let slot = self.connections.slot()?;
            Box::new(LimitedStream::new(stream, slot, self.connections.clone()))
        };
        self.inner.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_must_be_positive() {
        assert!(ProxyLimits::default().validate().is_ok());
        for bad in [
            ProxyLimits {
                max_connections: 0,
                ..ProxyLimits::default()
            },
            ProxyLimits {
                header_timeout_ms: 0,
                ..ProxyLimits::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn slots_are_counted_and_freed() {
        let conns = Connections::new(
            ProxyLimits {
                max_connections: 2,
                ..ProxyLimits::default()
            },
            &Registry::new(),
        );
        let a = conns.slot().expect("first");
        let _b = conns.slot().expect("second");
        assert!(conns.slot().is_none(), "a third connection beyond the cap");
        assert_eq!(conns.open_gauge.get(), 2, "the refused one is not counted");
        drop(a);
        assert_eq!(conns.open_gauge.get(), 1);
        assert!(conns.slot().is_some(), "a freed slot is free again");
        assert_eq!(conns.open_gauge.get(), 1, "the new slot, dropped at once");
    }
}
