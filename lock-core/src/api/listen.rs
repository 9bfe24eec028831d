//! Serving a router on a listener with the limits every listener needs — body and header size,
//! slow clients, connection count — and, optionally, TLS.
//!
//! Why not `axum::serve`: it exposes none of hyper's connection settings, so a client could
//! hold a connection forever by sending a header one byte at a time, or open connections
//! without bound. Here hyper's HTTP/1 connection enforces the header limits (431 for a head
//! over `max_header_bytes`; a head not complete within `header_timeout_ms` closes the
//! connection, which also ends idle keep-alive connections), a middleware reads each body under
//! `max_body_bytes` and `body_timeout_ms` (413 `payload_too_large`, 408 `request_timeout`) before
//! any handler runs, and a semaphore bounds the connections served at once.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus::IntGauge;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

use super::send_stall::SendStall;
use super::ApiError;
use crate::net::{codec, frames, PeerSecret, FROM_HEADER};
use crate::node::{HttpLimits, TlsFiles};
use crate::wire::ErrorCode;

/// The listen backlog of every listener a `fencegate` process binds: connections the kernel
/// completes before the server accepts them. The kernel caps it at `net.core.somaxconn`.
///
/// Rust's and tokio's own `bind` ask for 128. When more clients than that connect at once — a
/// reconnect after a failover, a pool that grows during a slow second, a node at its
/// `max_connections` — the kernel drops the SYNs beyond it, and each of those clients waits for
/// its SYN's retransmission: one second, then three. The load harness's seed runs overflowed
/// 128 a few hundred times a minute (`ListenOverflows` in `nstat`).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds a TCP listener on `addr` (`host:port`, each address it resolves to tried in turn, as
/// `TcpListener::bind` does) with a backlog of [`LISTEN_BACKLOG`].
pub async fn bind(addr: &str) -> io::Result<TcpListener> {
    let mut last = None;
    for resolved in tokio::net::lookup_host(addr).await? {
        match bind_resolved(resolved) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr} resolves to no address"),
        )
    }))
}

/// [`bind`], as a standard library listener, for servers that take one (the fencing proxy).
pub async fn bind_std(addr: &str) -> io::Result<std::net::TcpListener> {
    bind(addr).await?.into_std()
}

fn bind_resolved(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As the standard library does on Unix: a restarted node can bind its port again at once,
    // while connections of its previous run are still in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Loads a certificate chain and key into a TLS acceptor (HTTP/1.1 only). The error names the
/// file that could not be used.
pub fn tls_acceptor(files: &TlsFiles) -> io::Result<TlsAcceptor> {
    let bad = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("TLS {what} {}: {e}", path.display()),
        )
    };
    let certs = CertificateDer::pem_file_iter(&files.cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad("certificate file", &files.cert_file, &e))?;
    if certs.is_empty() {
        return Err(bad(
            "certificate file",
            &files.cert_file,
            &"holds no certificate",
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key_file)
        .map_err(|e| bad("key file", &files.key_file, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| bad("certificate/key pair", &files.key_file, &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `router` on `listener` under the connection and header limits of `limits` (over TLS
/// with `tls`) until `shutdown` completes; then stops accepting and lets the connections in
/// flight finish their calls. Body limits are the router's (see [`limit_bodies`] and
/// [`with_whole_body`]), so that a gate in front of them (the peer port's authentication) can
/// refuse a request before its body is read. `open`, when given, counts the connections open.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &HttpLimits,
    tls: Option<TlsAcceptor>,
    open: Option<IntGauge>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_inner(listener, router, limits, tls, None, open, shutdown).await
}

/// The peer port: [`serve`] for HTTP callers, and framed connections (told apart by their
/// first byte) handed to `framed`'s router after their handshake.
pub async fn serve_peer_port(
    listener: TcpListener,
    router: Router,
    framed: FramedPeers,
    limits: &HttpLimits,
    open: Option<IntGauge>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_inner(
        listener,
        router,
        limits,
        None,
        Some(Arc::new(framed)),
        open,
        shutdown,
    )
    .await
}

/// What the peer port serves framed connections with: the cluster secret their handshake is
/// checked against, and the peer routes (without the HTTP gate: the connection is
/// authenticated as a whole).
pub struct FramedPeers {
    pub secret: PeerSecret,
    pub router: Router,
}

async fn serve_inner(
    listener: TcpListener,
    router: Router,
    limits: &HttpLimits,
    tls: Option<TlsAcceptor>,
    framed: Option<Arc<FramedPeers>>,
    open: Option<IntGauge>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let header_timeout = Duration::from_millis(limits.header_timeout_ms);
    let send_timeout = Duration::from_millis(limits.send_timeout_ms);
    let frame_limits = frames::ServeLimits {
        max_body: limits.max_body_bytes,
        read_timeout: Duration::from_millis(limits.body_timeout_ms),
        idle_timeout: header_timeout,
    };
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(limits.max_header_bytes.max(crate::node::MIN_HEADER_BYTES));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    // Framed connections stop between calls once this turns true.
    let (stopped_tx, stopped_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        // Wait for a free slot before accepting: beyond the bound, clients queue in the
        // kernel's backlog instead of costing this process memory.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slot else { break };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let http = http.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let framed = framed.clone();
        let mut stopped = stopped_rx.clone();
        let counted = Counted::new(open.clone());
        tokio::spawn(async move {
            let _slot = (slot, counted);
            if let Some(framed) = framed {
                let mut first = [0u8; 1];
                match tokio::time::timeout(header_timeout, stream.peek(&mut first)).await {
                    Ok(Ok(1)) if first[0] == frames::PREFACE[0] => {
                        let stop = async move {
                            let _ = stopped.wait_for(|s| *s).await;
                        };
                        serve_framed(stream, &framed, frame_limits, stop).await;
                        return;
                    }
                    Ok(Ok(1)) => {}
                    // Closed, failed or silent before its first byte.
                    _ => return,
                }
            }
            match tls {
                None => {
                    let stream = SendStall::new(stream, send_timeout);
                    let conn = http.serve_connection(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn).await;
                }
                Some(tls) => {
                    let mut first = [0u8; 1];
                    let peeked =
                        tokio::time::timeout(header_timeout, stream.peek(&mut first)).await;
                    if matches!(peeked, Ok(Ok(1))) && first[0].is_ascii_uppercase() {
                        // A request line, not a TLS handshake: say so in HTTP, as nginx does,
                        // rather than with a TLS alert a client shows as gibberish.
                        answer_plain_http_on_tls(stream).await;
                        return;
                    }
                    // The handshake is part of the request head: the same deadline bounds it.
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(header_timeout, tls.accept(stream)).await
                    else {
                        return;
                    };
                    let stream = SendStall::new(stream, send_timeout);
                    let conn = http.serve_connection(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn).await;
                }
            }
        });
    }
    drop(listener);
    let _ = stopped_tx.send(true);
    graceful.shutdown().await;
    Ok(())
}

/// Answers a plain HTTP request sent to a TLS port with a 400 that says so, and closes.
async fn answer_plain_http_on_tls(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = "{\"error\":\"plain_http_to_https_port\",\"message\":\"This port speaks HTTPS: \
                send the request with https://.\"}";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// One open connection in a gauge, from its accept until it is dropped.
struct Counted(Option<IntGauge>);

impl Counted {
    fn new(gauge: Option<IntGauge>) -> Self {
        if let Some(g) = &gauge {
            g.inc();
        }
        Counted(gauge)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(g) = &self.0 {
            g.dec();
        }
    }
}

/// One framed peer connection: each call goes to the peer routes as a POST from the node the
/// handshake authenticated.
async fn serve_framed(
    stream: tokio::net::TcpStream,
    framed: &FramedPeers,
    limits: frames::ServeLimits,
    stop: impl Future<Output = ()>,
) {
    let service = TowerToHyperService::new(framed.router.clone());
    let call = |from: u64, path: String, body: Bytes| {
        let request = Request::post(path)
            .header(FROM_HEADER, from)
            .header(CONTENT_TYPE, codec::CONTENT_TYPE)
            .body(Body::from(body));
        let service = service.clone();
        async move {
            let Ok(request) = request else {
                return (400, Bytes::from_static(b"bad peer path"));
            };
            let Ok(response) = hyper::service::Service::call(&service, request).await;
            let status = response.status().as_u16();
            match response.into_body().collect().await {
                Ok(body) => (status, body.to_bytes()),
                Err(e) => (500, Bytes::from(format!("cannot read the answer: {e}"))),
            }
        }
    };
    frames::serve_connection(stream, &framed.secret, limits, stop, call).await;
}

/// `router` with every request body read under the body limits of `limits` before a handler
/// runs.
pub fn limit_bodies(router: Router, limits: &HttpLimits) -> Router {
    router.layer(middleware::from_fn_with_state(
        BodyLimits::from(limits),
        read_body,
    ))
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyLimits {
    max_bytes: usize,
    timeout: Duration,
}

impl From<&HttpLimits> for BodyLimits {
    fn from(l: &HttpLimits) -> Self {
        BodyLimits {
            max_bytes: l.max_body_bytes,
            timeout: Duration::from_millis(l.body_timeout_ms),
        }
    }
}

/// Reads the whole body under the size and time limits before the handler runs, so no handler
/// ever waits on a slow client or holds more than `max_bytes` of one.
async fn read_body(State(limits): State<BodyLimits>, req: Request, next: Next) -> Response {
    match with_whole_body(req, limits).await {
        Ok(req) => next.run(req).await,
        Err(refused) => refused,
    }
}

/// `req` with its body read whole under `limits` (see [`read_limited`]), or the error answer.
pub(crate) async fn with_whole_body(req: Request, limits: BodyLimits) -> Result<Request, Response> {
    let (parts, body) = req.into_parts();
    let bytes = read_limited(&parts, body, limits).await?;
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// After refusing a body as too large, read and drop up to this much more of it before
/// answering...
const LINGER_BYTES: usize = 64 << 20;
/// ...for at most this long. Like nginx's lingering close: a client still writing its body
/// then reads the 413 instead of a connection reset under its write. Nothing is kept.
const LINGER: Duration = Duration::from_secs(2);

async fn linger(body: &mut Body) {
    let drain = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > LINGER_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// The whole body of a request with head `parts`, or the error answer: 413 when it is (or is
/// announced to be) larger than the limit, 408 when it does not arrive in time.
pub(crate) async fn read_limited(
    parts: &axum::http::request::Parts,
    body: Body,
    limits: BodyLimits,
) -> Result<Bytes, Response> {
    let too_large = || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "The request body is larger than this listener's limit of {} bytes.",
                limits.max_bytes
            ),
        )
        .into_response()
    };
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = body;
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        linger(&mut body).await;
        return Err(too_large());
    }
    let read = async {
        let mut bytes = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue; // trailers carry nothing a handler reads
            };
            if bytes.len() + data.len() > limits.max_bytes {
                return Ok(None);
            }
            bytes.extend_from_slice(&data);
        }
        Ok::<_, axum::Error>(Some(bytes.freeze()))
    };
    match tokio::time::timeout(limits.timeout, read).await {
        Ok(Ok(Some(bytes))) => Ok(bytes),
        Ok(Ok(None)) => {
            linger(&mut body).await;
            Err(too_large())
        }
        Ok(Err(_)) => Err(ApiError::invalid("The request body could not be read.").into_response()),
        Err(_) => Err(ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "The request body did not arrive within {} ms; send it at once.",
                limits.timeout.as_millis()
            ),
        )
        .into_response()),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// The backlog the kernel gave a listening socket: `TCP_INFO` of a listener reports it in
    /// `tcpi_sacked`.
    fn backlog_of(socket: &impl AsRawFd) -> u32 {
        // SAFETY: `tcp_info` is plain integers, valid zeroed; the kernel writes at most `len`
        // bytes into it, and the descriptor belongs to a socket the caller still holds.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "TCP_INFO: {}", io::Error::last_os_error());
        info.tcpi_sacked
    }

    /// What the kernel grants at most.
    fn somaxconn() -> u32 {
        std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .expect("somaxconn")
            .trim()
            .parse()
            .expect("a number")
    }

    #[tokio::test]
    async fn listeners_get_the_large_backlog_and_serve() {
        let granted = LISTEN_BACKLOG.min(somaxconn());
        let listener = bind("127.0.0.1:0").await.expect("bind");
        assert_eq!(backlog_of(&listener), granted);
        let by_name = bind_std("localhost:0").await.expect("bind a name");
        assert_eq!(backlog_of(&by_name), granted);
        if granted > 128 {
            // What tokio's own bind gives, which is why the node binds through `bind`.
            let plain = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            assert_eq!(backlog_of(&plain), 128);
        }

        let addr = listener.local_addr().expect("addr");
        let (client, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        client.expect("connect");
        accepted.expect("accept");
    }

    #[tokio::test]
    async fn a_port_in_use_or_a_bad_address_is_an_error() {
        let first = bind("127.0.0.1:0").await.expect("bind");
        let addr = first.local_addr().expect("addr").to_string();
        let taken = bind(&addr).await.expect_err("the port is taken");
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse);
        assert!(bind("no port here").await.is_err());
    }

    /// Polls `gauge` until it reads `want` (at most 5 s).
    async fn gauge_reaches(gauge: &IntGauge, want: i64) {
        for _ in 0..500 {
            if gauge.get() == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(gauge.get(), want, "open connections");
    }

    #[tokio::test]
    async fn open_connections_are_counted_until_they_close() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let open = IntGauge::new("open", "connections").expect("gauge");
        let addr = spawn_server_with(false, HttpLimits::default(), Some(open.clone())).await;
        let mut clients = Vec::new();
        for _ in 0..3 {
            let mut c = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            c.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
                .await
                .expect("send");
            let mut answer = [0u8; 12];
            c.read_exact(&mut answer).await.expect("answer");
            assert_eq!(&answer, b"HTTP/1.1 200");
            clients.push(c);
        }
        // Kept alive after their calls: still open.
        gauge_reaches(&open, 3).await;
        clients.truncate(1);
        gauge_reaches(&open, 1).await;
        drop(clients);
        gauge_reaches(&open, 0).await;
    }

    /// A router answering POST `/echo` with its body and caller, for the transport tests.
    fn echo_router() -> Router {
        use axum::http::HeaderMap;
        axum::Router::new().route(
            "/echo",
            axum::routing::post(|headers: HeaderMap, body: Bytes| async move {
                let from = headers
                    .get(FROM_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_string();
                format!("{from}:{}", String::from_utf8_lossy(&body))
            }),
        )
    }

    async fn spawn_server(framed: bool) -> String {
        spawn_server_with(framed, HttpLimits::default(), None).await
    }

    async fn spawn_server_with(framed: bool, limits: HttpLimits, open: Option<IntGauge>) -> String {
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let shutdown = std::future::pending();
            if framed {
                let peers = FramedPeers {
                    secret: secret(),
                    router: echo_router(),
                };
                serve_peer_port(listener, echo_router(), peers, &limits, open, shutdown).await
            } else {
                serve(listener, echo_router(), &limits, None, open, shutdown).await
            }
        });
        addr
    }

    fn secret() -> PeerSecret {
        PeerSecret::new("listen-test-secret-0123").expect("secret")
    }

    /// The peer port serves framed connections and plain HTTP on the same listener, and a
    /// peer client reaches a node that speaks only HTTP (an earlier version) by falling back.
    #[tokio::test]
    async fn the_peer_port_speaks_both_and_the_client_falls_back_to_http() {
        use crate::net::{FaultLayer, PeerClient};
        let client = PeerClient::new(7, FaultLayer::new(), secret());
        let timeout = Duration::from_secs(5);

        let addr = spawn_server(true).await;
        let mut conn = frames::FramedConn::open(&addr, 7, &secret(), 1 << 20)
            .await
            .expect("framed");
        let (status, body) = conn.call("/echo", b"framed").await.expect("call");
        assert_eq!((status, &body[..]), (200, b"7:framed".as_slice()));
        let plain = reqwest::Client::new()
            .post(format!("http://{addr}/echo"))
            .body("plain")
            .send()
            .await
            .expect("http");
        assert_eq!(plain.text().await.expect("body"), "-:plain");
        let via_client = client
            .post_frame(9, &addr, "/echo", b"pooled".to_vec(), timeout)
            .await
            .expect("peer client");
        assert_eq!(&via_client[..], b"7:pooled");

        let http_only = spawn_server(false).await;
        for _ in 0..2 {
            let reply = client
                .post_frame(9, &http_only, "/echo", b"old".to_vec(), timeout)
                .await
                .expect("falls back to HTTP");
            assert_eq!(&reply[..], b"7:old");
        }
    }

    /// A pooled connection the peer closed as idle is replaced on the next call, which
    /// succeeds.
    #[tokio::test]
    async fn a_pooled_connection_closed_by_the_peer_is_replaced() {
        use crate::net::{FaultLayer, PeerClient};
        let limits = HttpLimits {
            header_timeout_ms: 100,
            ..HttpLimits::default()
        };
        let addr = spawn_server_with(true, limits, None).await;
        let client = PeerClient::new(7, FaultLayer::new(), secret());
        let timeout = Duration::from_secs(5);
        for round in 0..3 {
            let reply = client
                .post_frame(9, &addr, "/echo", b"again".to_vec(), timeout)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(&reply[..], b"7:again");
            // Longer than the peer's idle close: the pooled connection is closed by now.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}
