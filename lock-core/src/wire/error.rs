//! The error body every failed call answers with, its stable codes, and [`classify`].

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = ($code:literal, $status:literal),)*) => {
        /// A stable error code. Each has one HTTP status; a code this version does not know
        /// (from a newer server) is kept as [`ErrorCode::Other`].
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
            /// A code this client does not know.
            Other(String),
        }

        impl ErrorCode {
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                    ErrorCode::Other(s) => s,
                }
            }

            /// The HTTP status the server answers this code with (500 for unknown codes).
            pub fn status(&self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)*
                    ErrorCode::Other(_) => 500,
                }
            }

            /// The code's own static text when this version knows it.
            pub fn known(code: &str) -> Option<&'static str> {
                match code {
                    $($code => Some($code),)*
                    _ => None,
                }
            }

            pub fn parse(code: &str) -> ErrorCode {
                match code {
                    $($code => ErrorCode::$variant,)*
                    other => ErrorCode::Other(other.to_string()),
                }
            }
        }
    };
}

error_codes! {
    /// The request is malformed (body, path, field bounds); the message says which part.
    InvalidRequest = ("invalid_request", 400),
    NotFound = ("not_found", 404),
    MethodNotAllowed = ("method_not_allowed", 405),
    PayloadTooLarge = ("payload_too_large", 413),
    /// Try-once acquire of a held resource, or a wait that ended without the lock.
    LockHeld = ("lock_held", 409),
    /// Try-once acquire while the previous lease's token is being fenced off at the proxies
    /// (usually milliseconds; `retry_after_ms` is the longest it can take).
    LockRevoking = ("lock_revoking", 409),
    /// A waiting acquire was withdrawn by a cancel (its own, or an earlier attempt's).
    WaitCancelled = ("wait_cancelled", 409),
    /// Renew of a lease that is no longer held.
    LeaseLost = ("lease_lost", 409),
    MembershipChangeFailed = ("membership_change_failed", 409),
    /// A node being added did not catch up with the leader's log in time; it stays out.
    MemberNotCaughtUp = ("member_not_caught_up", 409),
    /// A removal would leave fewer reachable voters than a quorum (pass `force` to insist).
    QuorumAtRisk = ("quorum_at_risk", 409),
    TooManyWaiters = ("too_many_waiters", 429),
    FaultInjectionDisabled = ("fault_injection_disabled", 403),
    /// No quorum answered in time: the call may still take effect. Safe to retry as it was.
    NoQuorum = ("no_quorum", 503),
    NoLeader = ("no_leader", 503),
    /// The leader has as many commands waiting for the raft log as it holds; this one was
    /// refused before it was queued. Safe to retry after `retry_after_ms`.
    Overloaded = ("overloaded", 503),
    NodeStopped = ("node_stopped", 503),
    /// `/readyz`: this node applies the log too far behind the leader to serve reads in time.
    NodeBehind = ("node_behind", 503),
    /// A peer link is cut by an injected fault.
    Partitioned = ("partitioned", 503),
    Internal = ("internal", 500),
    /// A call on the peer port without a valid tag made with the cluster's peer secret.
    PeerUnauthenticated = ("peer_unauthenticated", 401),
    /// Fencing proxy: a protected write without `Fence-Token`.
    FencingTokenRequired = ("fencing_token_required", 428),
    /// Fencing proxy: a newer token was issued or admitted for the resource.
    StaleFencingToken = ("stale_fencing_token", 412),
    /// Fencing proxy: the token was never issued for this resource.
    UnknownFencingToken = ("unknown_fencing_token", 412),
    /// Fencing proxy: `Fence-Token` is not a decimal u64.
    MalformedFencingToken = ("malformed_fencing_token", 400),
    /// Fencing proxy: the path maps to a resource name the lock service would refuse.
    InvalidResource = ("invalid_resource", 400),
    /// Fencing proxy: `Fence-Resource` names another resource than the path's.
    FenceResourceMismatch = ("fence_resource_mismatch", 400),
    /// Fencing proxy: more than one `Fence-Token` or `Fence-Resource` header.
    DuplicateFenceHeader = ("duplicate_fence_header", 400),
    /// Fencing proxy: the path has dot segments, empty segments or encoded separators that a
    /// store could resolve to another resource.
    InvalidPath = ("invalid_path", 400),
    /// Fencing proxy: no route matches the path.
    NoRoute = ("no_route", 404),
    /// Fencing proxy: the client's request could not be read.
    BadRequest = ("bad_request", 400),
    /// Fencing proxy: the upstream did not answer in time; the write may have landed.
    UpstreamTimeout = ("upstream_timeout", 504),
    /// Fencing proxy: the upstream failed; the write may have landed.
    UpstreamError = ("upstream_error", 502),
    ProxyError = ("proxy_error", 500),
    /// Fencing proxy: too many first writes of one resource queued for admission here.
    ProxyBusy = ("proxy_busy", 503),
    /// Fencing proxy: the route requires an `Idempotency-Key` header and the request had none.
    IdempotencyKeyRequired = ("idempotency_key_required", 400),
    /// Fencing proxy: `Idempotency-Key` is not 1–255 printable ASCII characters.
    InvalidIdempotencyKey = ("invalid_idempotency_key", 400),
    /// Fencing proxy: the key was used before with a different request (method, path, body or
    /// listed headers).
    IdempotencyKeyMismatch = ("idempotency_key_mismatch", 422),
    /// Fencing proxy: the first request with this key is still in flight; retry after
    /// `retry_after_ms`.
    IdempotencyKeyInUse = ("idempotency_key_in_use", 409),
    /// Fencing proxy: the answer to the first request with this key was lost and the upstream
    /// could not tell whether it acted; the request is not run again.
    IdempotencyOutcomeUnknown = ("idempotency_outcome_unknown", 409),
    /// Fencing proxy: the key's record has expired; use a new key for a new request.
    IdempotencyKeyExpired = ("idempotency_key_expired", 422),
    /// An operator's resolution of an idempotency record that is not (or no longer) unknown
    /// for the attempt named: it settled, is in flight, or another attempt was lost since.
    IdempotencyNotUnknown = ("idempotency_not_unknown", 409),
    /// An operator action without the admin credential (`Authorization: Bearer <token>`).
    Unauthorized = ("unauthorized", 401),
    /// An operator action with a wrong credential, or on a node without an admin token; with
    /// authentication on, a key whose role does not allow the call (a client key on an
    /// operator endpoint).
    Forbidden = ("forbidden", 403),
    /// An operator action could not be completed (e.g. no other voter took over a drain);
    /// the message says what state the cluster was left in.
    ActionFailed = ("action_failed", 409),
    /// Fencing proxy: the tenant's rate limit is used up here; retry after `Retry-After` when
    /// the answer has one.
    RateLimited = ("rate_limited", 429),
    /// With authentication on: a call without `Authorization: Bearer <api key>`, or with a key
    /// that is unknown or revoked.
    Unauthenticated = ("unauthenticated", 401),
    /// The tenant holds as many leases as its limit allows; release one or retry later.
    TenantLeaseLimit = ("tenant_lease_limit", 429),
    /// The tenant has as many waiting acquires as its limit allows.
    TenantWaiterLimit = ("tenant_waiter_limit", 429),
    /// The tenant sent more lock calls to this node than its rate allows; retry after
    /// `retry_after_ms`.
    TenantRateLimited = ("tenant_rate_limited", 429),
    /// The client did not send its whole request body in time (see the listener limits).
    RequestTimeout = ("request_timeout", 408),
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(ErrorCode::parse(&s))
    }
}

/// `{"error": code, "message": sentence}` plus, for `lock_held`, `retry_after_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Fencing proxy, fence rejections: the token the request carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presented_token: Option<u64>,
    /// Fencing proxy, `stale_fencing_token`: the highest token issued or admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_token: Option<u64>,
}

impl ErrorBody {
    pub fn new(error: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            error,
            message: message.into(),
            retry_after_ms: None,
            presented_token: None,
            highest_token: None,
        }
    }

    /// The error body of an answer that did not succeed, whatever its status. Harnesses that
    /// count outcomes by code need it for 5xx answers too, which [`classify`] only describes.
    pub fn from_answer(status: u16, body: &[u8]) -> ErrorBody {
        serde_json::from_slice(body).unwrap_or_else(|_| unparsed(status, body))
    }
}

/// How a call that did not succeed ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The server answered and the answer is final for this call (any non-5xx error).
    Definite { status: u16, body: ErrorBody },
    /// We cannot know whether the call took effect: 5xx (`no_quorum` may still commit later),
    /// or an answer that does not parse. Safe to retry with the same request or lease id.
    Uncertain(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Definite { status, body } => {
                write!(f, "{status} {}: {}", body.error, body.message)
            }
            Failure::Uncertain(why) => f.write_str(why),
        }
    }
}

/// Sorts one HTTP answer: 2xx parses as `T`; 5xx or garbage is uncertain; any other status is
/// a definite refusal with its error body. Every client uses this one rule.
pub fn classify<T: DeserializeOwned>(status: u16, body: &[u8]) -> Result<T, Failure> {
    if (200..300).contains(&status) {
        return serde_json::from_slice(body).map_err(|e| {
            Failure::Uncertain(format!(
                "answer {status} does not parse ({e}): {}",
                snippet(body)
            ))
        });
    }
    let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
    if status >= 500 {
        let why = match parsed {
            Some(b) => format!("{status} {}: {}", b.error, b.message),
            None => format!("{status}: {}", snippet(body)),
        };
        return Err(Failure::Uncertain(why));
    }
    let body = parsed.unwrap_or_else(|| unparsed(status, body));
    Err(Failure::Definite { status, body })
}

/// What stands in for an answer that is not an error body (a load balancer's page, a cut-off
/// body): the code `http_{status}` and the start of the text.
fn unparsed(status: u16, body: &[u8]) -> ErrorBody {
    let answer = match snippet(body) {
        s if s.trim().is_empty() => "an empty body".to_string(),
        s => format!("'{}'", s.trim()),
    };
    ErrorBody::new(
        ErrorCode::Other(format!("http_{status}")),
        format!(
            "HTTP {status} with {answer}, not a fencegate error: is the endpoint a fencegate \
             node's API port?"
        ),
    )
}

/// The start of an answer, for messages.
fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ReleaseResponse;

    #[test]
    fn codes_round_trip_with_their_status() {
        for code in [
            ErrorCode::LockHeld,
            ErrorCode::NoQuorum,
            ErrorCode::StaleFencingToken,
            ErrorCode::Other("brand_new".into()),
        ] {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
        }
        assert_eq!(ErrorCode::LockHeld.status(), 409);
        assert_eq!(ErrorCode::parse("no_quorum").status(), 503);
    }

    #[test]
    fn classify_sorts_answers() {
        let ok: ReleaseResponse = classify(200, br#"{"released":true}"#).unwrap();
        assert!(ok.released);
        let held = classify::<ReleaseResponse>(
            409,
            br#"{"error":"lock_held","message":"m","retry_after_ms":5}"#,
        );
        match held {
            Err(Failure::Definite { status: 409, body }) => {
                assert_eq!(body.error, ErrorCode::LockHeld);
                assert_eq!(body.retry_after_ms, Some(5));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify::<ReleaseResponse>(503, br#"{"error":"no_quorum","message":"m"}"#),
            Err(Failure::Uncertain(_))
        ));
        assert!(matches!(
            classify::<ReleaseResponse>(200, b"not json"),
            Err(Failure::Uncertain(_))
        ));
        assert!(matches!(
            classify::<ReleaseResponse>(404, b"plain text"),
            Err(Failure::Definite { status: 404, .. })
        ));
    }

    #[test]
    fn from_answer_names_every_failure() {
        let quorum = ErrorBody::from_answer(503, br#"{"error":"no_quorum","message":"m"}"#);
        assert_eq!(quorum.error, ErrorCode::NoQuorum);
        let page = ErrorBody::from_answer(502, b"<html>bad gateway</html>");
        assert_eq!(page.error.as_str(), "http_502");
        assert!(
            page.message.contains("'<html>bad gateway</html>'"),
            "{}",
            page.message
        );
        let empty = ErrorBody::from_answer(404, b"");
        assert!(
            empty.message.contains("HTTP 404 with an empty body"),
            "{}",
            empty.message
        );
    }
}
