//! The node's HTTP APIs. The public one: lock calls, cluster and health endpoints, the operator
//! endpoints (`/v1/admin/`), metrics and the operator page (`/ui`, from the `admin-ui` crate).
//! The peer one, on its own listener: raft RPCs and the calls a follower makes to the leader,
//! for authenticated peers only.
//!
//! Handlers only translate HTTP: they parse a [`wire`](crate::wire) body, hand the request to
//! the [`Node`], and turn its answer back into a wire body or an [`ApiError`].

mod admin;
mod auth;
mod cluster;
mod error;
pub mod listen;
mod locks;
mod peer_auth;
mod raft_rpc;
mod send_stall;

use std::future::Future;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use tokio::net::TcpListener;

pub use error::ApiError;

use crate::net::PeerSecret;
use crate::node::{
    Node, ProposeError, ReadFailure, CAMPAIGN_NOW_PATH, FORWARD_PATH, MEMBER_API_PATH,
    PRE_VOTE_PATH, PROPOSE_BATCH_PATH, READ_INDEX_PATH,
};
use crate::wire::{ErrorCode, LEADER_ID_HEADER, NODE_ID_HEADER};

/// Serves the public API of `node` on `listener` (over TLS with `tls`, see
/// [`listen::tls_acceptor`]) under the node's listener limits until `shutdown` completes; then
/// stops accepting and lets in-flight calls finish.
pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = node.config.limits.clone();
    let open = node.metrics.connections_open.with_label_values(&["api"]);
    listen::serve(listener, router(node), &limits, tls, Some(open), shutdown).await
}

/// Serves the node-to-node calls of `node` on `listener`, to peers that prove they hold
/// `secret`, until `shutdown` completes.
pub async fn serve_peers(
    node: Arc<Node>,
    secret: PeerSecret,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = node.config.peer_limits.clone();
    let open = node.metrics.connections_open.with_label_values(&["peer"]);
    let framed = listen::FramedPeers {
        secret: secret.clone(),
        router: peer_routes().with_state(node.clone()),
    };
    listen::serve_peer_port(
        listener,
        peer_router(node, secret),
        framed,
        &limits,
        Some(open),
        shutdown,
    )
    .await
}

/// The public routes of a node: the lock API, cluster status and health, metrics and the
/// operator page, each request passed through [`front`] first. Every node serves every call;
/// writes and linearizable reads are routed to the leader internally, over the peer port.
pub fn router(node: Arc<Node>) -> Router {
    let front_state = Front {
        bodies: listen::BodyLimits::from(&node.config.limits),
        node: node.clone(),
    };
    Router::new()
        .route("/v1/locks", get(locks::list))
        .route("/v1/locks/", get(locks::no_name).post(locks::no_name))
        .route("/v1/locks/{*path}", get(locks::get).post(locks::post))
        .route("/v1/cluster", get(cluster::status))
        .route("/v1/cluster/members/add", post(cluster::add_member))
        .route("/v1/cluster/members/remove", post(cluster::remove_member))
        .route(
            "/v1/admin/faults",
            get(cluster::get_faults).put(cluster::put_faults),
        )
        .route("/v1/admin/overview", get(admin::overview))
        .route("/v1/admin/locks", get(admin::locks))
        .route("/v1/admin/resources/{*resource}", get(admin::resource))
        .route("/v1/admin/hot", get(admin::hot))
        .route("/v1/admin/series", get(admin::series))
        .route("/v1/admin/audit", get(admin::audit))
        .route("/v1/admin/quotas", get(admin::quotas))
        .route("/v1/admin/quotas/{name}", put(admin::set_quota))
        .route(
            "/v1/admin/force-release/{*resource}",
            post(admin::force_release),
        )
        .route("/v1/admin/drain", post(admin::drain))
        .route("/v1/admin/snapshot", post(admin::snapshot))
        .route("/v1/admin/backup", post(admin::backup))
        .route(
            "/v1/admin/idempotency/unknown",
            get(admin::idempotency_unknown),
        )
        .route(
            "/v1/admin/idempotency/resolve",
            post(admin::idempotency_resolve),
        )
        .route("/v1/admin/members/add", post(admin::add_member))
        .route("/v1/admin/members/remove", post(admin::remove_member))
        .route(
            "/v1/admin/keys",
            get(admin::list_keys).post(admin::create_key),
        )
        .route("/v1/admin/keys/{id}/revoke", post(admin::revoke_key))
        .route("/healthz", get(cluster::healthz))
        .route("/readyz", get(cluster::readyz))
        .route("/metrics", get(cluster::metrics))
        .merge(admin_ui::router())
        // After every route: it applies to the routes added so far.
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "This endpoint does not take that HTTP method; see docs/api.md.",
            )
        })
        .fallback(|| async { ApiError::not_found("No such endpoint; see docs/api.md.") })
        // One layer for what every request needs: each axum layer costs an allocation or two
        // per request, which showed in the profile at the seed workload.
        .layer(middleware::from_fn_with_state(front_state, front))
        .with_state(node)
}

#[derive(Clone)]
struct Front {
    node: Arc<Node>,
    bodies: listen::BodyLimits,
}

/// What every public request passes through, in this order: its body is read whole under the
/// listener's limits (so no handler waits on a slow client), its API key is checked when the
/// node requires keys (so no handler runs unchecked), and the handler's answer names this node
/// and the leader it knows (see [`LEADER_ID_HEADER`]), so a client can send its next calls to
/// the leader itself. Refusals at the door carry no names.
async fn front(State(front): State<Front>, req: Request, next: Next) -> Response {
    if let Some(refusal) = cross_site(&req) {
        return refusal.into_response();
    }
    let req = match listen::with_whole_body(req, front.bodies).await {
        Ok(req) => req,
        Err(refused) => return refused,
    };
    let req = match auth::admit(&front.node, req) {
        Ok(req) => req,
        Err(refused) => return refused.into_response(),
    };
    let page = req.uri().path().starts_with("/ui");
    let admin = req.uri().path().starts_with("/v1/admin/");
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    if page {
        // The operator page runs only its own script, fetches only from this node, and is
        // never framed (clickjacking of its actions); revalidated so an upgrade shows at once.
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(UI_CSP),
        );
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    if page || admin {
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    if admin {
        // Lease ids (a backup), keys and stored answers: kept by no cache.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    headers.insert(NODE_ID_HEADER, HeaderValue::from(front.node.id));
    if let Some(leader) = front.node.current_leader() {
        headers.insert(LEADER_ID_HEADER, HeaderValue::from(leader));
    }
    response
}

/// What the operator page may load and do (see `front`).
const UI_CSP: &str = "default-src 'self'; object-src 'none'; base-uri 'none'; \
                      form-action 'self'; frame-ancestors 'none'";

/// Refuses a call that changes something when a browser says a page of another origin sent
/// it. A page may send a "simple" cross-origin POST (a form, or `fetch` with `no-cors`) without
/// asking first; with the lock API open (no keys) it could take and hold locks, and refused
/// operator actions would fill the audit log. Browsers name the sender in `Sec-Fetch-Site`, and
/// in `Origin`, which programs (curl, the client library, the CLI) do not send; the node's own
/// page is same-origin. Reads are left alone: without CORS headers a page cannot read them.
fn cross_site(req: &Request) -> Option<ApiError> {
    if matches!(req.method().as_str(), "GET" | "HEAD" | "OPTIONS") {
        return None;
    }
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let refused = || {
        ApiError::new(
            ErrorCode::Forbidden,
            "Cross-site requests are refused: a page of another origin may not change anything \
             here. Call the API from a program (curl, the client library, the CLI) or from \
             this node's own /ui.",
        )
    };
    if let Some(site) = header("sec-fetch-site") {
        return (!matches!(site, "same-origin" | "none")).then(refused);
    }
    let origin = header("origin")?;
    // `scheme://host[:port]`, compared with the host the request was sent to (`Host`, or the
    // authority of an HTTP/2 request).
    let authority = origin.split_once("://").map(|(_, rest)| rest);
    let host = header("host").or_else(|| req.uri().authority().map(|a| a.as_str()));
    let same = authority.is_some_and(|a| host.is_some_and(|h| h.eq_ignore_ascii_case(a)));
    (!same).then(refused)
}

/// The node-to-node calls: raft RPCs, forwarded commands and read-index calls. Every request
/// must carry a tag made with the cluster secret; bodies (snapshot chunks, appends) may be
/// larger than the public API's limit.
pub fn peer_router(node: Arc<Node>, secret: PeerSecret) -> Router {
    peer_routes()
        .layer(middleware::from_fn_with_state(
            Arc::new(peer_auth::PeerGate::new(secret, &node.config.peer_limits)),
            peer_auth::authenticate,
        ))
        .with_state(node)
}

/// The peer endpoints, with bodies already read under the peer listener's limits: by the
/// HTTP gate (see [`peer_router`]), or as one frame of an authenticated framed connection.
fn peer_routes() -> Router<Arc<Node>> {
    Router::new()
        .route("/raft/append", post(raft_rpc::append))
        .route("/raft/vote", post(raft_rpc::vote))
        .route(PRE_VOTE_PATH, post(raft_rpc::pre_vote))
        .route(CAMPAIGN_NOW_PATH, post(raft_rpc::campaign_now))
        .route("/raft/snapshot", post(raft_rpc::snapshot))
        .route("/internal/propose", post(raft_rpc::propose))
        .route(FORWARD_PATH, post(raft_rpc::forward))
        .route(PROPOSE_BATCH_PATH, post(raft_rpc::propose_batch))
        .route(READ_INDEX_PATH, post(raft_rpc::read_index))
        .route(MEMBER_API_PATH, post(raft_rpc::member_api))
        .fallback(|| async { ApiError::not_found("No such peer endpoint.") })
        .layer(DefaultBodyLimit::disable())
}

/// Parses a JSON body, turning every failure into a 400 with the serde message.
/// Waits until this node's state holds every write committed before the call (see
/// [`Node::read_barrier`]). A read changes nothing, so its 503 says only that the answer could
/// not be confirmed current.
pub(crate) async fn read_barrier(node: &Node) -> Result<(), ApiError> {
    node.read_barrier_or_why().await.map_err(|e| match e {
        ReadFailure::Index(ProposeError::NoQuorum | ProposeError::NotLeader(_)) => ApiError::new(
            ErrorCode::NoQuorum,
            "No quorum confirmed the leader in time, so this node cannot tell whether its \
             state is current; retry the read, on this node or another.",
        ),
        ReadFailure::Index(other) => other.into(),
        ReadFailure::NotApplied { applied, needed } => ApiError::new(
            ErrorCode::NoQuorum,
            format!(
                "The leader confirmed the read, but this node did not apply the log up to it in \
                 time (it has applied index {applied} of {needed}: a slow disk, an overloaded \
                 node, or appends from the leader that do not arrive); retry the read on another \
                 node."
            ),
        ),
    })
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    if body.starts_with(b"\xEF\xBB\xBF") {
        return Err(ApiError::invalid(
            "The body starts with a byte order mark; send JSON without one (RFC 8259).",
        ));
    }
    if std::str::from_utf8(body).is_err() {
        return Err(ApiError::invalid(
            "The body is not UTF-8; JSON bodies are UTF-8.",
        ));
    }
    // serde also accepts a struct as a JSON array of its fields; bodies here are objects.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid("The body must be a JSON object."));
    }
    serde_json::from_slice(body).map_err(|e| {
        // A number past u64 reads as a float to serde ("invalid type: floating point `1e+20`"):
        // say what was wrong with it.
        let hint = if e.to_string().contains("floating point") {
            " Numbers here are whole, from 0 to 18446744073709551615."
        } else {
            ""
        };
        ApiError::invalid(format!("Bad JSON body: {e}.{hint}"))
    })
}

#[cfg(test)]
mod tests {
    use super::parse_json;
    use crate::wire::LeaseRequest;

    #[test]
    fn a_body_that_is_no_utf8_json_says_why() {
        let message = |body: &[u8]| {
            let e = parse_json::<LeaseRequest>(body).expect_err("refused");
            e.body.message
        };
        assert!(message(b"\xEF\xBB\xBF{}").contains("byte order mark"));
        assert!(message(b"{\"lease_id\": \"\xff\"}").contains("not UTF-8"));
        assert!(message(b"[1]").contains("JSON object"));
        let other = message(br#"{"lease_id": 1}"#);
        assert!(!other.contains("whole"), "{other}");
        let huge =
            parse_json::<crate::wire::AcquireRequest>(br#"{"ttl_ms": 99999999999999999999}"#)
                .expect_err("refused")
                .body
                .message;
        assert!(huge.contains("whole, from 0 to"), "{huge}");
    }
}

/// Request bodies from clients never panic the parser: any bytes give a value or a 400.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::parse_json;
    use crate::wire::{AcquireRequest, CancelRequest, LeaseRequest};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testkit::fuzz_cases(2_000)))]

        #[test]
        fn any_body_parses_or_is_a_400(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            for status in [
                parse_json::<AcquireRequest>(&bytes).err().map(|e| e.status),
                parse_json::<LeaseRequest>(&bytes).err().map(|e| e.status),
                parse_json::<CancelRequest>(&bytes).err().map(|e| e.status),
            ]
            .into_iter()
            .flatten()
            {
                prop_assert_eq!(status.as_u16(), 400);
            }
        }

        #[test]
        fn json_shaped_bodies_parse_or_are_a_400(
            request_id in ".{0,200}",
            ttl in proptest::option::of(any::<i64>()),
            extra in proptest::option::of("[a-z_]{1,12}"),
        ) {
            let mut body = serde_json::json!({ "request_id": request_id });
            if let Some(t) = ttl {
                body["ttl_ms"] = serde_json::json!(t);
            }
            if let Some(k) = extra {
                body[k] = serde_json::json!(1);
            }
            let bytes = serde_json::to_vec(&body).expect("json");
            if let Err(e) = parse_json::<AcquireRequest>(&bytes) {
                prop_assert_eq!(e.status.as_u16(), 400);
            }
        }
    }
}
