//! The `Idempotency-Key` flow of one request, against the replicated records.
//!
//! A request on an idempotent route is handled here end to end instead of by pingora's
//! streaming forwarder: its body is read whole (it is part of the fingerprint), the key is
//! claimed through raft, the request is forwarded with a buffered HTTP client, and the answer is
//! committed *before* the client sees it. pingora's response-body hooks are synchronous, so they
//! could not wait for that commit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lock_core::machine::{
    Command, Completion, Finding, IdemCommand, IdemOutcome, IdemScope, Response, StoredAnswer,
    StoredBody,
};
use lock_core::node::{Node, ProposeError};
use lock_core::wire::{ErrorBody, ErrorCode, FENCE_TOKEN_HEADER};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;
use prometheus::{IntCounterVec, Opts, Registry};

use super::contract::{
    self, classify, fingerprint, parse_key, parse_tenant, Answer, IdempotencyMode,
    IdempotencyOptions, MAX_REQUEST_BODY,
};
use crate::route::Route;

/// How long a claim outlives the upstream timeout: room to commit the answer after the
/// upstream's last possible byte. Past the claim, the record counts as `unknown`.
const CLAIM_MARGIN_MS: u64 = 2_000;

/// The proxy's idempotency layer: one per proxy, shared by its requests.
pub struct IdempotencyLayer {
    node: Arc<Node>,
    http: reqwest::Client,
    /// Requests by outcome: claimed, replayed, mismatch, in_use, unknown, reconciled,
    /// reconciled_new_attempt, expired, key_required, invalid_key, no_quorum.
    outcomes: IntCounterVec,
    /// The proxy's `proxy_upstream_errors_total{kind}`: failures reaching the upstream count
    /// there on these routes too.
    upstream_errors: IntCounterVec,
    /// `ProxyConfig::unsafe_no_idempotency`: forward without any record (demonstrations only).
    unsafe_no_records: bool,
}

/// A fence refusal as the client gets it.
pub struct Refusal {
    pub status: u16,
    /// The JSON error body.
    pub body: Vec<u8>,
}

/// A fenced write's admission.
pub struct Permit {
    /// The whole upstream exchange must end by then.
    pub send_by: Instant,
    /// Held until the write has finished (the fence's in-flight count, which a revocation of
    /// the token waits for).
    pub hold: Box<dyn Send>,
}

/// The fence admission of a fenced write, run only if the key is claimed for it.
pub type AdmitFuture<'a> = Pin<Box<dyn Future<Output = Result<Permit, Refusal>> + Send + 'a>>;

/// What `handle` did with the request.
pub enum Handled {
    /// The layer answered the client itself.
    Responded,
    /// Not an idempotent request (route off, safe method, or optional without a key): forward
    /// it the usual way.
    NotApplicable,
}

/// Everything the flow needs about the request, gathered before the first await on raft.
struct Request {
    scope: IdemScope,
    fingerprint: String,
    method: reqwest::Method,
    path_and_query: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Bytes,
}

impl IdempotencyLayer {
    pub fn new(node: Arc<Node>, registry: &Registry, upstream_errors: IntCounterVec) -> Self {
        let outcomes = IntCounterVec::new(
            Opts::new(
                "proxy_idempotency_requests_total",
                "Requests on idempotent routes by outcome (replayed, mismatch, in_use, \
                 unknown, reconciled, expired, ...)",
            ),
            &["outcome"],
        )
        .unwrap_or_else(|e| panic!("metric: {e}"));
        // Starting at 0: the first replay or conflict shows as an increase.
        for outcome in [
            "claimed",
            "replayed",
            "reconciled",
            "mismatch",
            "in_use",
            "expired",
            "unknown",
            "key_required",
            "invalid_key",
            "reconciled_new_attempt",
            "no_quorum",
        ] {
            outcomes.with_label_values(&[outcome]);
        }
        // Registering twice (a second proxy in one process) is harmless: keep the first.
        let _ = registry.register(Box::new(outcomes.clone()));
        IdempotencyLayer {
            node,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap_or_else(|_| reqwest::Client::new()),
            outcomes,
            upstream_errors,
            unsafe_no_records: false,
        }
    }

    /// Turns deduplication off: every request is forwarded as if its route had no
    /// `Idempotency-Key` handling (`ProxyConfig::unsafe_no_idempotency`; demonstrations only).
    pub fn with_unsafe_no_records(mut self, on: bool) -> Self {
        self.unsafe_no_records = on;
        self
    }

    fn count(&self, outcome: &str) {
        self.outcomes.with_label_values(&[outcome]).inc();
    }

    /// Whether `method` requests on `route` are deduplicated: writes, not the route's reads.
    pub fn applies(&self, route: &Route, method: &str) -> bool {
        route.config.idempotency != IdempotencyMode::Off
            && contract::applies_to(method)
            && !route.is_named_read(method)
    }

    /// Runs the idempotency flow. On a fenced route the request has passed the fence's local
    /// checks and `admit` is its admission, awaited only when the key is claimed for this
    /// request (a replay needs none). `key_tenant` is the tenant of the request's API key on a
    /// route that takes the tenant from the key (else the route's tenant header names it).
    pub async fn handle(
        &self,
        session: &mut Session,
        route: &Route,
        key_tenant: Option<&str>,
        admit: Option<AdmitFuture<'_>>,
    ) -> Result<Handled> {
        let opts = &route.config.idempotency_options;
        let req = session.req_header();
        if self.unsafe_no_records || !self.applies(route, req.method.as_str()) {
            return Ok(Handled::NotApplicable);
        }
        let key = match req.headers.get("idempotency-key") {
            None if route.config.idempotency == IdempotencyMode::Optional => {
                return Ok(Handled::NotApplicable)
            }
            None => {
                self.count("key_required");
                let msg = "This route requires an Idempotency-Key header: send a unique key per \
                           logical request and the same key when you retry it.";
                respond_error(session, ErrorCode::IdempotencyKeyRequired, msg, None).await?;
                return Ok(Handled::Responded);
            }
            // Two keys make the request's identity ambiguous; an intermediary that merged or
            // split them would dedupe on another one than the client meant. `Idempotency_Key`
            // counts too: some servers read it as the same header.
            Some(_) if crate::service::copies(req, "idempotency-key") > 1 => {
                self.count("invalid_key");
                let msg = "The request carries more than one Idempotency-Key header; send exactly \
                           one.";
                respond_error(session, ErrorCode::InvalidIdempotencyKey, msg, None).await?;
                return Ok(Handled::Responded);
            }
            Some(v) => match parse_key(v.as_bytes()) {
                Ok(k) => k,
                Err(e) => {
                    self.count("invalid_key");
                    respond_error(
                        session,
                        ErrorCode::InvalidIdempotencyKey,
                        &e.to_string(),
                        None,
                    )
                    .await?;
                    return Ok(Handled::Responded);
                }
            },
        };
        let mut copies = req
            .headers
            .iter()
            .filter(|(n, _)| crate::tenant::spelled_as(n.as_str(), &opts.tenant_header))
            .map(|(_, v)| v.as_bytes());
        let tenant_raw = copies.next();
        let twice = copies.next().is_some();
        let tenant = match key_tenant {
            Some(t) => t.to_string(),
            None if twice => {
                let e = contract::KeyError::TenantTwice;
                respond_error(session, ErrorCode::InvalidRequest, &e.to_string(), None).await?;
                return Ok(Handled::Responded);
            }
            None => match parse_tenant(tenant_raw, &opts.default_tenant) {
                Ok(t) => t,
                Err(e) => {
                    respond_error(session, ErrorCode::InvalidRequest, &e.to_string(), None).await?;
                    return Ok(Handled::Responded);
                }
            },
        };
        let tenant_for_upstream = tenant.clone();
        let body = match tokio::time::timeout(BODY_TIME, read_body(session)).await {
            Ok(read) => read?,
            Err(_) => {
                session.set_keepalive(None);
                let msg = format!(
                    "The request body did not arrive within {} s; nothing was forwarded.",
                    BODY_TIME.as_secs()
                );
                respond_error(session, ErrorCode::RequestTimeout, &msg, None).await?;
                return Ok(Handled::Responded);
            }
        };
        let Some(body) = body else {
            let msg = format!(
                "Requests on idempotent routes may carry at most {MAX_REQUEST_BODY} bytes of body."
            );
            respond_error(session, ErrorCode::PayloadTooLarge, &msg, None).await?;
            return Ok(Handled::Responded);
        };
        let req = session.req_header();
        let path_and_query = req
            .uri
            .path_and_query()
            .map_or_else(|| req.uri.path().to_string(), |p| p.as_str().to_string());
        let content_type = req
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok());
        // On a fenced write the token is part of the request: a holder with another lease
        // sending the same key and body is not retrying this write, and must not be told it
        // succeeded (422 instead of a replay).
        let fenced = route
            .is_protected(req.method.as_str())
            .then_some(FENCE_TOKEN_HEADER)
            .filter(|h| {
                !opts
                    .fingerprint_headers
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(h))
            });
        let listed = opts
            .fingerprint_headers
            .iter()
            .map(String::as_str)
            .chain(fenced)
            .map(|n| (n, req.headers.get(n).map(|v| v.as_bytes())));
        let request = Request {
            fingerprint: fingerprint(
                req.method.as_str(),
                &path_and_query,
                content_type,
                &body,
                listed,
            ),
            scope: IdemScope {
                tenant,
                route: route.config.path.clone(),
                key,
            },
            method: reqwest::Method::from_bytes(req.method.as_str().as_bytes())
                .unwrap_or(reqwest::Method::POST),
            path_and_query,
            headers: forwarded_headers(req, route, key_tenant, &tenant_for_upstream),
            body,
        };
        self.run(session, route, &request, admit).await?;
        Ok(Handled::Responded)
    }

    async fn run(
        &self,
        session: &mut Session,
        route: &Route,
        req: &Request,
        admit: Option<AdmitFuture<'_>>,
    ) -> Result<()> {
        let opts = &route.config.idempotency_options;
        let lease_ms = route.config.upstream_timeout_ms + CLAIM_MARGIN_MS;
        let claim = IdemCommand::Claim {
            scope: req.scope.clone(),
            fingerprint: req.fingerprint.clone(),
            owner: self.node.id,
            attempt: rand::random(),
            lease_ms,
            retain_ms: opts.retain_ms,
            tombstone_ms: opts.tombstone_ms,
        };
        // The claim's lease starts when the leader stamps it, after this instant, and log time
        // never runs faster than this clock: ending the exchange by `proposed + upstream timeout
        // + half the margin` keeps it inside the lease with a second to spare, so nobody
        // reconciles the key while the request may still reach the upstream.
        let mut proposed = Instant::now();
        let mut outcome = match self.propose(claim).await {
            Ok(o) => o,
            Err(e) => return self.no_quorum(session, &e).await,
        };
        let mut reconciled = false;
        loop {
            match outcome {
                IdemOutcome::Claimed { attempt }
                    if !reconciled && let Some(lookup) = self.lookup_if_maybe_lost(opts) =>
                {
                    // Ours to run, but the lost cluster may have run it after the backup this
                    // node was restored from: the upstream is asked first.
                    reconciled = true;
                    match self.lookup(route, lookup, &req.scope).await {
                        Ok(Finding::NeverRan) => {}
                        Ok(Finding::Ran(answer)) => {
                            let cmd = IdemCommand::Complete {
                                scope: req.scope.clone(),
                                attempt,
                                outcome: Completion::Final(answer.clone()),
                            };
                            if let Err(e) = self.propose(cmd).await {
                                return self.no_quorum(session, &e).await;
                            }
                            self.count("reconciled");
                            return respond_replay(session, &answer).await;
                        }
                        Err(why) => {
                            self.release(req, attempt).await;
                            self.count("unknown");
                            let msg = format!(
                                "This node was restored from a backup, and the route's lookup \
                                 could not tell whether this key's request ran before ({why}); \
                                 nothing was forwarded. Retry with the same key."
                            );
                            return respond_error(session, ErrorCode::UpstreamError, &msg, None)
                                .await;
                        }
                    }
                }
                IdemOutcome::Claimed { attempt } => {
                    self.count(if reconciled {
                        "reconciled_new_attempt"
                    } else {
                        "claimed"
                    });
                    let permit = match admit {
                        None => None,
                        Some(admit) => match admit.await {
                            Ok(permit) => Some(permit),
                            Err(refusal) => {
                                return self.refused(session, req, attempt, refusal).await
                            }
                        },
                    };
                    let in_lease = proposed
                        + Duration::from_millis(
                            route.config.upstream_timeout_ms + CLAIM_MARGIN_MS / 2,
                        );
                    let deadline = permit
                        .as_ref()
                        .map_or(in_lease, |p| p.send_by.min(in_lease));
                    let forwarded = self.forward(session, route, req, attempt, deadline).await;
                    // Only now is the write over for the fence.
                    drop(permit);
                    return forwarded;
                }
                IdemOutcome::Replay(answer) => {
                    self.count(if reconciled { "reconciled" } else { "replayed" });
                    return respond_replay(session, &answer).await;
                }
                IdemOutcome::InFlight { retry_after_ms } => {
                    self.count("in_use");
                    let msg = "A request with this Idempotency-Key is still in flight; retry \
                               after Retry-After to get its answer.";
                    return respond_error(
                        session,
                        ErrorCode::IdempotencyKeyInUse,
                        msg,
                        Some(retry_after_ms.max(1)),
                    )
                    .await;
                }
                IdemOutcome::Mismatch => {
                    self.count("mismatch");
                    let msg = "This Idempotency-Key was used with a different request (method, \
                               path, body or fingerprinted headers); use a new key for a new \
                               request.";
                    return respond_error(session, ErrorCode::IdempotencyKeyMismatch, msg, None)
                        .await;
                }
                IdemOutcome::Expired { .. } => {
                    self.count("expired");
                    let msg = "This Idempotency-Key's record has expired, so the proxy can no \
                               longer tell whether it ran; use a new key for a new request.";
                    return respond_error(session, ErrorCode::IdempotencyKeyExpired, msg, None)
                        .await;
                }
                IdemOutcome::Unknown { attempt } if !reconciled => {
                    let Some(lookup) = &opts.reconcile else {
                        self.count("unknown");
                        return respond_unknown(session, "the route has no reconciliation lookup")
                            .await;
                    };
                    let finding = match self.lookup(route, lookup, &req.scope).await {
                        Ok(f) => f,
                        Err(why) => {
                            self.count("unknown");
                            return respond_unknown(session, &why).await;
                        }
                    };
                    reconciled = true;
                    let cmd = IdemCommand::Reconcile {
                        scope: req.scope.clone(),
                        fingerprint: req.fingerprint.clone(),
                        lost_attempt: attempt,
                        finding,
                        owner: self.node.id,
                        attempt: rand::random(),
                        lease_ms,
                    };
                    proposed = Instant::now();
                    outcome = match self.propose(cmd).await {
                        Ok(o) => o,
                        Err(e) => return self.no_quorum(session, &e).await,
                    };
                }
                IdemOutcome::Unknown { .. } => {
                    self.count("unknown");
                    return respond_unknown(session, "reconciliation did not settle it").await;
                }
                IdemOutcome::Completed | IdemOutcome::NotOwner => {
                    // Only answers to `Complete` (or to a log entry replayed after a restart);
                    // a claim never gets them.
                    return respond_error(
                        session,
                        ErrorCode::ProxyError,
                        "The idempotency record answered out of turn; retry with the same key.",
                        None,
                    )
                    .await;
                }
            }
        }
    }

    /// Forwards attempt `attempt`, records how it ended, then answers the client.
    async fn forward(
        &self,
        session: &mut Session,
        route: &Route,
        req: &Request,
        attempt: u64,
        deadline: Instant,
    ) -> Result<()> {
        let opts = &route.config.idempotency_options;
        // The whole exchange ends by `deadline`: inside the claim's lease (a proxy held up
        // between claim and send, e.g. a paused process, must not send after another proxy may
        // have reconciled the key) and, on a fenced route, inside the fence's grant (a stricter
        // form of the fence's send-by rule).
        let timeout = Duration::from_millis(route.config.upstream_timeout_ms)
            .min(deadline.saturating_duration_since(Instant::now()));
        if timeout.is_zero() {
            let refusal = Refusal {
                status: ErrorCode::UpstreamTimeout.status(),
                body: error_body(
                    ErrorCode::UpstreamTimeout,
                    "The proxy was held up and its claim on the key (or its fencing grant) ran \
                     out before the request could be sent; nothing was sent, so retrying with the \
                     same key is safe.",
                    None,
                ),
            };
            return self.refused(session, req, attempt, refusal).await;
        }
        let url = format!("http://{}{}", route.config.upstream, req.path_and_query);
        let mut builder = self
            .http
            .request(req.method.clone(), url)
            .timeout(timeout)
            .body(req.body.clone());
        for (name, value) in &req.headers {
            builder = builder.header(name.as_str(), value.as_slice());
        }
        // Held whole up to this many bytes; a larger answer is relayed as it arrives.
        let spool = opts.body_cap_bytes.max(SPOOL_BYTES);
        let result = match builder.send().await {
            Ok(resp) => match receive(resp, spool).await {
                Ok(Received::Large(large)) => {
                    return self.relay(session, req, attempt, large).await
                }
                Ok(Received::Whole(answer)) => Ok(answer),
                Err(e) => Err((false, e)),
            },
            Err(e) => Err((e.is_connect(), e)),
        };
        if let Err((connect, e)) = &result {
            let kind = match (connect, e.is_timeout()) {
                (true, _) => "connect",
                (false, true) => "timeout",
                (false, false) => "other",
            };
            self.upstream_errors.with_label_values(&[kind]).inc();
        }
        let (completion, reply) = match &result {
            Ok(answer) => (classify(answer, opts.body_cap_bytes), None),
            // No connection was made: nothing reached the upstream, the key is free again.
            Err((true, e)) => (
                Completion::NotRun,
                Some((ErrorCode::UpstreamError, format!("The upstream is unreachable ({e}); nothing was sent, so retrying with the same key is safe."))),
            ),
            Err((false, e)) => (
                Completion::Unknown,
                Some((if e.is_timeout() { ErrorCode::UpstreamTimeout } else { ErrorCode::UpstreamError },
                      format!("The upstream's answer was lost ({e}); it may or may not have acted, and a retry with the same key will say so."))),
            ),
        };
        // With no answer the upstream may still act on what it received, so the record stays
        // `processing` until the owner's lease ends and turns it `unknown`: until then a retry
        // is told the key is in use, and no reconciliation lookup can run before the upstream
        // has had the lease's time to apply the request.
        if let (Err(_), Some((code, msg))) = (&result, &reply) {
            if completion == Completion::Unknown {
                return respond_error(session, code.clone(), msg, None).await;
            }
        }
        let cmd = IdemCommand::Complete {
            scope: req.scope.clone(),
            attempt,
            outcome: completion,
        };
        // The answer is committed before the client sees it: a client that got an answer can
        // always get the same one again.
        if let Err(e) = self.propose(cmd).await {
            tracing::warn!(key = %req.scope.key, error = %e, "idempotent answer not recorded");
            let msg = "The upstream answered but the answer could not be recorded (no quorum); \
                       retry with the same key: the proxy will not run the request again.";
            return respond_error(session, ErrorCode::NoQuorum, msg, None).await;
        }
        match (result, reply) {
            (Ok(answer), _) => respond_answer(session, &answer).await,
            (Err(_), Some((code, msg))) => respond_error(session, code, &msg, None).await,
            (Err(_), None) => Ok(()),
        }
    }

    /// Relays an answer too large to hold, recording it (status, headers, body length and
    /// digest) before its last piece goes out: a client that got the whole answer can always
    /// get it again (as a replay without the body), and one that could not be recorded reaches
    /// the client cut short, never whole. If the client goes away, the answer is still read to
    /// its end and recorded. An answer cut off by the upstream or the timeout is not recorded:
    /// the key turns `unknown` once its claim runs out, as for an answer lost before it began.
    async fn relay(
        &self,
        session: &mut Session,
        req: &Request,
        attempt: u64,
        mut large: LargeAnswer,
    ) -> Result<()> {
        let mut head = ResponseHeader::build(large.status, Some(large.headers.len()))?;
        for (name, value) in &large.headers {
            if !matches!(name.as_str(), "transfer-encoding" | "connection") {
                head.append_header(name.clone(), contract::header_bytes(value))?;
            }
        }
        let mut client_gone = session
            .write_response_header(Box::new(head), false)
            .await
            .is_err();
        let mut digest = contract::BodyDigest::default();
        digest.update(&large.first);
        let mut held = Bytes::from(std::mem::take(&mut large.first));
        loop {
            match large.resp.chunk().await {
                Ok(Some(piece)) => {
                    digest.update(&piece);
                    let out = std::mem::replace(&mut held, piece);
                    if !client_gone {
                        client_gone = session.write_response_body(Some(out), false).await.is_err();
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(key = %req.scope.key, error = %e, "a large idempotent answer was cut off; not recorded");
                    return Err(cut_short("the upstream's answer was cut off"));
                }
            }
        }
        let (len, blake2b) = digest.finish();
        let cmd = IdemCommand::Complete {
            scope: req.scope.clone(),
            attempt,
            outcome: contract::classify_relayed(large.status, &large.headers, len, blake2b),
        };
        if let Err(e) = self.propose(cmd).await {
            tracing::warn!(key = %req.scope.key, error = %e, "idempotent answer not recorded");
            return Err(cut_short("the answer could not be recorded"));
        }
        if client_gone {
            return Ok(());
        }
        session.write_response_body(Some(held), true).await?;
        Ok(())
    }

    /// The write the key was claimed for is not sent (the fence refused it, or its grant ran
    /// out first): the key is released, and the client gets `refusal`.
    async fn refused(
        &self,
        session: &mut Session,
        req: &Request,
        attempt: u64,
        refusal: Refusal,
    ) -> Result<()> {
        self.release(req, attempt).await;
        let headers = [("content-type".to_string(), "application/json".to_string())];
        write(session, refusal.status, &headers, refusal.body).await
    }

    /// Asks the route's reconciliation lookup about `key`.
    /// The lookup carries the tenant in the route's tenant header: keys of different tenants
    /// may be equal, and only the tenant's own effect proves anything about its key.
    async fn lookup(
        &self,
        route: &Route,
        lookup: &str,
        scope: &IdemScope,
    ) -> Result<Finding, String> {
        let path = lookup.replace("{key}", &percent_encode(&scope.key));
        let url = format!("http://{}{}", route.config.upstream, path);
        let resp = self
            .http
            .get(url)
            .header(
                route.config.idempotency_options.tenant_header.as_str(),
                scope.tenant.as_str(),
            )
            .timeout(Duration::from_millis(route.config.upstream_timeout_ms))
            .send()
            .await
            .map_err(|e| format!("the reconciliation lookup failed: {e}"))?;
        let failed = |e: reqwest::Error| format!("the reconciliation lookup failed: {e}");
        let cap = route.config.idempotency_options.body_cap_bytes;
        let stored = match receive(resp, cap.max(SPOOL_BYTES)).await.map_err(failed)? {
            Received::Whole(answer) => contract::store_answer(&answer, cap, true),
            // Nothing to relay it to: kept as status, headers, length and digest.
            Received::Large(mut large) => {
                let mut digest = contract::BodyDigest::default();
                digest.update(&large.first);
                while let Some(piece) = large.resp.chunk().await.map_err(failed)? {
                    digest.update(&piece);
                }
                let (len, blake2b) = digest.finish();
                contract::stored_relayed(large.status, &large.headers, len, blake2b, true)
            }
        };
        match stored.status {
            200 => Ok(Finding::Ran(stored)),
            404 => Ok(Finding::NeverRan),
            s => Err(format!(
                "the reconciliation lookup answered {s}, which proves neither outcome"
            )),
        }
    }

    /// Frees the key of `attempt`, which sent nothing upstream.
    async fn release(&self, req: &Request, attempt: u64) {
        let release = IdemCommand::Complete {
            scope: req.scope.clone(),
            attempt,
            outcome: Completion::NotRun,
        };
        if let Err(e) = self.propose(release).await {
            // The claim then ends as `unknown` after its lease: safe, if unhelpful.
            tracing::warn!(key = %req.scope.key, error = %e, "claim that sent nothing not released");
        }
    }

    /// The route's lookup, when a key this cluster has no record of may have been used on a
    /// lost cluster: this node was restored from a backup less than the route's retention ago.
    /// The restored cluster only has the backup's records; a key first used after the backup
    /// could still be retried now.
    fn lookup_if_maybe_lost<'o>(&self, opts: &'o IdempotencyOptions) -> Option<&'o str> {
        let restored_lately = self
            .node
            .restored_at_ms
            .is_some_and(|at| self.node.wall_ms() < at.saturating_add(opts.retain_ms));
        opts.reconcile.as_deref().filter(|_| restored_lately)
    }

    async fn propose(&self, cmd: IdemCommand) -> Result<IdemOutcome, ProposeError> {
        match self.node.propose(Command::Idem(cmd)).await? {
            Response::Idem(outcome) => Ok(outcome),
            other => Err(ProposeError::Stopped(format!(
                "unexpected state machine response {other:?}"
            ))),
        }
    }

    async fn no_quorum(&self, session: &mut Session, e: &ProposeError) -> Result<()> {
        self.count("no_quorum");
        let msg = format!(
            "The idempotency record could not be read or written ({e}); nothing was forwarded. \
             Retry with the same key."
        );
        respond_error(session, ErrorCode::NoQuorum, &msg, None).await
    }
}

/// How long a client may take to send a whole body on an idempotent route (they are read
/// whole before anything else, at most [`MAX_REQUEST_BODY`]): without a bound, clients
/// trickling a byte now and then held every connection of the proxy.
const BODY_TIME: Duration = Duration::from_secs(10);

/// Reads the request body whole; `None` if it is larger than [`MAX_REQUEST_BODY`].
async fn read_body(session: &mut Session) -> Result<Option<Bytes>> {
    let declared = session
        .req_header()
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_REQUEST_BODY) {
        return Ok(None);
    }
    let expects_continue = session
        .req_header()
        .headers
        .get("expect")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        // The client waits for this before it sends the body.
        session.write_continue_response().await?;
    }
    let mut body = Vec::new();
    while let Some(chunk) = session.read_request_body().await? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_REQUEST_BODY {
            drain_body(session).await;
            return Ok(None);
        }
    }
    Ok(Some(Bytes::from(body)))
}

/// Reads and drops the rest of a refused request body, up to [`DRAIN_BYTES`] or for
/// [`DRAIN_TIME`]: a client still sending (a chunked body after `100 Continue`) would otherwise
/// meet a closed connection instead of the refusal. The connection is not reused after it.
async fn drain_body(session: &mut Session) {
    let mut drained = 0;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Ok(Some(chunk)) = session.read_request_body().await {
            drained += chunk.len();
            if drained > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
    session.set_keepalive(None);
}

const DRAIN_BYTES: usize = 8 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Bytes of an upstream answer held whole at least (more where the route stores more inline);
/// a larger answer is relayed as it arrives, so a proxy's memory does not grow with answers.
const SPOOL_BYTES: usize = 1 << 20;

/// An upstream answer, read whole or, past the spool size, only begun.
enum Received {
    Whole(Answer),
    Large(LargeAnswer),
}

struct LargeAnswer {
    status: u16,
    headers: Vec<(String, String)>,
    /// What was read before the answer passed the spool size.
    first: Vec<u8>,
    resp: reqwest::Response,
}

/// Reads `resp` whole if it holds at most `spool` bytes of body.
async fn receive(mut resp: reqwest::Response, spool: usize) -> Result<Received, reqwest::Error> {
    let status = resp.status().as_u16();
    let headers: Vec<(String, String)> = resp
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_string(), contract::header_text(v.as_bytes())))
        .collect();
    let mut body = Vec::new();
    while let Some(piece) = resp.chunk().await? {
        body.extend_from_slice(&piece);
        if body.len() > spool {
            return Ok(Received::Large(LargeAnswer {
                status,
                headers,
                first: body,
                resp,
            }));
        }
    }
    Ok(Received::Whole(Answer {
        status,
        headers,
        body,
    }))
}

/// The connection error of an answer that began to reach the client and cannot be finished:
/// the client sees it cut short.
fn cut_short(why: &str) -> Box<pingora::Error> {
    pingora::Error::explain(pingora::ErrorType::WriteError, why.to_string())
}

/// The request headers the upstream gets: the client's, with `Host`, less those that describe
/// this hop (the fixed ones and those the client's `Connection` names), as the streaming path
/// forwards them. The upstream always learns the request's `tenant`, the one its record and
/// the reconciliation lookup are scoped to: a header-tenant request without the header gets
/// the route's default in it. On a route that takes the tenant from the API key, the key is not
/// passed on (it is a credential for this cluster, not for the store) and the route's tenant
/// headers carry the key's tenant.
fn forwarded_headers(
    req: &pingora::http::RequestHeader,
    route: &Route,
    key_tenant: Option<&str>,
    tenant: &str,
) -> Vec<(String, Vec<u8>)> {
    let tenant_header = |n: &str| {
        route
            .config
            .tenant_headers()
            .any(|h| h.eq_ignore_ascii_case(n))
    };
    let hop_named: Vec<String> = crate::service::connection_options(req).collect();
    // The API key goes no further than the proxy: `Fencegate-Key` never, `Authorization` when
    // it carried the key.
    let key_in_authorization = crate::tenant::key_in_authorization(req);
    let mut headers: Vec<(String, Vec<u8>)> = req
        .headers
        .iter()
        .filter(|(n, _)| forwarded_header(n.as_str()) && !hop_named.iter().any(|h| h == n.as_str()))
        .filter(|(n, v)| {
            !crate::tenant::withheld_from_store(
                n.as_str(),
                v.as_bytes(),
                key_tenant.is_some(),
                key_in_authorization,
            )
        })
        .filter(|(n, _)| key_tenant.is_none() || !tenant_header(n.as_str()))
        .filter(|(n, _)| {
            route.config.hosts.is_empty() || !crate::route::is_forwarding_header(n.as_str())
        })
        .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
        .collect();
    if key_tenant.is_some() {
        headers.extend(
            route
                .config
                .tenant_headers()
                .map(|h| (h.to_string(), tenant.as_bytes().to_vec())),
        );
    } else {
        let header = &route.config.idempotency_options.tenant_header;
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(header)) {
            headers.push((header.to_string(), tenant.as_bytes().to_vec()));
        }
    }
    if let Some(host) = &route.config.upstream_host {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case("host"));
        headers.push(("host".to_string(), host.as_bytes().to_vec()));
    }
    headers
}

fn forwarded_header(name: &str) -> bool {
    !matches!(
        name,
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "content-length"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authorization"
            | "proxy-connection"
    )
}

/// Percent-encodes everything but unreserved characters, for a key placed in a path.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn write(
    session: &mut Session,
    status: u16,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(headers.len() + 2))?;
    for (name, value) in headers {
        resp.append_header(name.clone(), contract::header_bytes(value))?;
    }
    // A 204 carries no length, and a 304's would describe the representation, not this answer.
    if !matches!(status, 100..=199 | 204 | 304) {
        resp.insert_header("content-length", body.len().to_string())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await?;
    Ok(())
}

async fn respond_answer(session: &mut Session, answer: &Answer) -> Result<()> {
    let headers: Vec<(String, String)> = answer
        .headers
        .iter()
        .filter(|(n, _)| {
            !matches!(
                n.as_str(),
                "content-length" | "transfer-encoding" | "connection"
            )
        })
        .cloned()
        .collect();
    write(session, answer.status, &headers, answer.body.clone()).await
}

async fn respond_replay(session: &mut Session, answer: &StoredAnswer) -> Result<()> {
    let mut headers = answer.headers.clone();
    headers.push(("idempotent-replayed".into(), "true".into()));
    if answer.reconciled {
        headers.push(("idempotent-reconciled".into(), "true".into()));
    }
    if let StoredBody::Digest { len, blake2b } = &answer.body {
        // The original body was above the stored size: the replay says what it was instead.
        headers.push((
            "idempotent-body-omitted".into(),
            format!("len={len}; blake2b={blake2b}"),
        ));
    }
    write(
        session,
        answer.status,
        &headers,
        contract::replay_body(answer),
    )
    .await
}

async fn respond_unknown(session: &mut Session, why: &str) -> Result<()> {
    let msg = format!(
        "The answer to the first request with this Idempotency-Key was lost and the upstream may \
         or may not have acted ({why}); the proxy will not run it again. Check the upstream, or \
         ask an operator to resolve the key."
    );
    respond_error(session, ErrorCode::IdempotencyOutcomeUnknown, &msg, None).await
}

fn error_body(code: ErrorCode, message: &str, retry_after_ms: Option<u64>) -> Vec<u8> {
    let mut body = ErrorBody::new(code, message);
    body.retry_after_ms = retry_after_ms;
    serde_json::to_vec(&body).unwrap_or_default()
}

async fn respond_error(
    session: &mut Session,
    code: ErrorCode,
    message: &str,
    retry_after_ms: Option<u64>,
) -> Result<()> {
    let status = code.status();
    let bytes = error_body(code, message, retry_after_ms);
    let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
    if let Some(ms) = retry_after_ms {
        headers.push(("retry-after".into(), ms.div_ceil(1000).max(1).to_string()));
    }
    write(session, status, &headers, bytes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_request_reaches_the_upstream_with_its_tenant_and_without_its_key() {
        let route = Route::compile(crate::route::RouteConfig::new("/o", "o", "127.0.0.1:9"))
            .expect("route");
        let mut req = pingora::http::RequestHeader::build("POST", b"/o", None).expect("head");
        for (n, v) in [
            ("authorization", "Bearer fgk_1_2"),
            ("x-tenant", "acme"),
            ("content-type", "text/plain"),
        ] {
            req.insert_header(n, v).expect("header");
        }
        let keyed = forwarded_headers(&req, &route, Some("acme"), "acme");
        let names: Vec<&str> = keyed.iter().map(|(n, _)| n.as_str()).collect();
        assert!(!names.contains(&"authorization"), "{names:?}");
        assert_eq!(
            keyed
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("x-tenant"))
                .map(|(_, v)| v.as_slice())
                .collect::<Vec<_>>(),
            [b"acme".as_slice()]
        );
        // A header-tenant route forwards the rest as it came, but never a cluster key.
        let open = forwarded_headers(&req, &route, None, "acme");
        let names: Vec<&str> = open.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x-tenant", "content-type"]);
        // The store's own credential passes.
        req.insert_header("authorization", "Basic c3RvcmU6cHc=")
            .expect("header");
        let open = forwarded_headers(&req, &route, None, "acme");
        assert!(open
            .iter()
            .any(|(n, v)| n == "authorization" && v.as_slice() == b"Basic c3RvcmU6cHc="));
    }

    #[test]
    fn the_upstream_gets_the_host_the_tenant_and_no_hop_headers() {
        let route = Route::compile(crate::route::RouteConfig::new("/o", "o", "127.0.0.1:9"))
            .expect("route");
        let mut req = pingora::http::RequestHeader::build("POST", b"/o", None).expect("head");
        for (n, v) in [
            ("host", "shop.example"),
            ("connection", "keep-alive, X-Drop"),
            ("x-drop", "1"),
            ("keep-alive", "timeout=5"),
            ("content-type", "text/plain"),
        ] {
            req.insert_header(n, v).expect("header");
        }
        let sent = forwarded_headers(&req, &route, None, "demo");
        let value = |name: &str| {
            sent.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        assert_eq!(value("host").as_deref(), Some("shop.example"));
        assert_eq!(
            value("x-tenant").as_deref(),
            Some("demo"),
            "the default tenant"
        );
        assert_eq!(value("content-type").as_deref(), Some("text/plain"));
        for hop in ["connection", "x-drop", "keep-alive"] {
            assert_eq!(value(hop), None, "{hop} was forwarded");
        }
    }

    #[test]
    fn keys_are_percent_encoded_in_the_lookup_path() {
        assert_eq!(percent_encode("abc-1_2.3~"), "abc-1_2.3~");
        assert_eq!(percent_encode("a/b c?"), "a%2Fb%20c%3F");
    }
}
