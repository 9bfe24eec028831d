//! The fence verdict, as pure functions: header parsing, the fast path against this proxy's
//! local admission grants, and the mapping of the cluster's answer.
//!
//! No pingora, no IO: everything here is unit-tested directly.

use std::time::{Duration, Instant};

use lock_core::machine::AdmitOutcome;
use serde_json::{json, Value};

/// Why a protected write is not forwarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// 428: a protected method without `Fence-Token`.
    TokenRequired,
    /// 400: `Fence-Token` is not a decimal u64.
    MalformedToken,
    /// 400: the path maps to a resource name the lock service would refuse.
    BadResource(String),
    /// 400: `Fence-Resource` names another resource than the one derived from the path.
    ResourceMismatch { header: String, derived: String },
    /// 400: a fence header appears more than once (a store reading another copy than the one
    /// checked would see another token).
    DuplicateHeader(&'static str),
    /// 412: a larger token was issued or admitted for the resource.
    Stale { presented: u64, highest: u64 },
    /// 412: the token's lease has ended, or ends before the upstream timeout could elapse:
    /// then `short_of` is what the lease had left and what a write on this route needs (ms).
    Ended {
        presented: u64,
        short_of: Option<(u64, u64)>,
    },
    /// 412: the token was never issued for this resource.
    Unknown { presented: u64 },
    /// 503: the cluster could not decide (no quorum).
    NoQuorum,
    /// 503: too many first writes of this resource were waiting for an admission here.
    Busy,
}

impl Rejection {
    pub fn status(&self) -> u16 {
        match self {
            Rejection::TokenRequired => 428,
            Rejection::MalformedToken
            | Rejection::BadResource(_)
            | Rejection::ResourceMismatch { .. }
            | Rejection::DuplicateHeader(_) => 400,
            Rejection::Stale { .. } | Rejection::Ended { .. } | Rejection::Unknown { .. } => 412,
            Rejection::NoQuorum | Rejection::Busy => 503,
        }
    }

    /// The stable error code (also the metrics label).
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::TokenRequired => "fencing_token_required",
            Rejection::MalformedToken => "malformed_fencing_token",
            Rejection::BadResource(_) => "invalid_resource",
            Rejection::ResourceMismatch { .. } => "fence_resource_mismatch",
            Rejection::DuplicateHeader(_) => "duplicate_fence_header",
            Rejection::Stale { .. } | Rejection::Ended { .. } => "stale_fencing_token",
            Rejection::Unknown { .. } => "unknown_fencing_token",
            Rejection::NoQuorum => "no_quorum",
            Rejection::Busy => "proxy_busy",
        }
    }

    /// The JSON body: `{"error", "message"}` plus the tokens involved.
    pub fn body(&self) -> Value {
        let mut body = json!({ "error": self.code(), "message": self.message() });
        match self {
            Rejection::Stale { presented, highest } => {
                body["presented_token"] = json!(presented);
                body["highest_token"] = json!(highest);
            }
            Rejection::Ended { presented, .. } | Rejection::Unknown { presented } => {
                body["presented_token"] = json!(presented);
            }
            _ => {}
        }
        body
    }

    fn message(&self) -> String {
        match self {
            Rejection::TokenRequired => {
                "This route is fenced: send the lease's token in a Fence-Token header.".into()
            }
            Rejection::MalformedToken => "Fence-Token must be a decimal unsigned integer.".into(),
            Rejection::DuplicateHeader(name) => {
                format!("Send exactly one {name} header; this request has several.")
            }
            Rejection::BadResource(why) => format!("The path maps to an invalid resource: {why}"),
            Rejection::ResourceMismatch { header, derived } => {
                format!("Fence-Resource is '{header}' but this path is fenced on '{derived}'.")
            }
            Rejection::Stale { presented, highest } => format!(
                "Token {presented} is stale: token {highest} or a later one has been issued or \
                 admitted (tokens only grow). Stop writing; your lease is gone."
            ),
            Rejection::Ended {
                presented,
                short_of: Some((left_ms, needs_ms)),
            } => format!(
                "The lease of token {presented} has {left_ms} ms left, and a write on this route \
                 is forwarded only while its lease outlasts the route's upstream timeout \
                 ({needs_ms} ms with the proxy's margins). Renew before writing, and take leases \
                 with a ttl_ms well above {needs_ms}."
            ),
            Rejection::Ended { presented, .. } => format!(
                "The lease of token {presented} has ended, or ends before this write could \
                 complete (a write is forwarded only while its lease outlasts the route's \
                 upstream timeout). Renew or acquire again before writing."
            ),
            Rejection::Unknown { presented } => {
                format!("Token {presented} was never issued for this resource.")
            }
            Rejection::Busy => "Too many writes of this resource are waiting for their first \
                 admission at this proxy; nothing was forwarded. Retry shortly."
                .into(),
            Rejection::NoQuorum => {
                "The lock cluster has no quorum, so the token cannot be verified; nothing was \
                 forwarded. Retry."
                    .into()
            }
        }
    }
}

/// Parses the `Fence-Token` header.
pub fn parse_token(header: Option<&[u8]>) -> Result<u64, Rejection> {
    let raw = header.ok_or(Rejection::TokenRequired)?;
    let text = std::str::from_utf8(raw).map_err(|_| Rejection::MalformedToken)?;
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Rejection::MalformedToken);
    }
    text.parse().map_err(|_| Rejection::MalformedToken)
}

/// Checks the optional `Fence-Resource` header against the derived resource.
pub fn check_resource_header(header: Option<&[u8]>, derived: &str) -> Result<(), Rejection> {
    match header {
        None => Ok(()),
        Some(h) if h == derived.as_bytes() => Ok(()),
        Some(h) => Err(Rejection::ResourceMismatch {
            header: String::from_utf8_lossy(h).into_owned(),
            derived: derived.to_string(),
        }),
    }
}

/// This proxy's admission grant for a resource: writes with `token` may be forwarded while a
/// forwarded request can finish (upstream timeout) before `deadline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalGrant {
    pub token: u64,
    pub deadline: Instant,
}

/// The fast-path decision, without asking the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FastVerdict {
    Forward,
    Reject(Rejection),
    /// Needs a committed admission (first write of an epoch, or the grant ran low).
    Consult,
}

pub fn fast_verdict(
    grant: Option<&LocalGrant>,
    token: u64,
    now: Instant,
    upstream_timeout: Duration,
) -> FastVerdict {
    let Some(g) = grant else {
        return FastVerdict::Consult;
    };
    if token < g.token {
        // The cluster admitted g.token for this resource, and admitted tokens only grow.
        return FastVerdict::Reject(Rejection::Stale {
            presented: token,
            highest: g.token,
        });
    }
    if token == g.token && now + upstream_timeout <= g.deadline {
        return FastVerdict::Forward;
    }
    FastVerdict::Consult
}

/// Turns the cluster's admission answer into a local grant. `sent` is when the admission was
/// proposed: the grant is measured from then (the leader stamped it later), minus `margin`
/// for clock-rate differences.
pub fn grant_from_outcome(
    outcome: &AdmitOutcome,
    token: u64,
    sent: Instant,
    margin: Duration,
) -> Result<LocalGrant, Rejection> {
    match outcome {
        AdmitOutcome::Admitted { grant_ms } => Ok(LocalGrant {
            token,
            // A grant too long to represent (only a corrupt answer could carry one) gives no
            // time at all rather than a panic: the next write asks the cluster again.
            deadline: sent
                .checked_add(Duration::from_millis(*grant_ms).saturating_sub(margin))
                .unwrap_or(sent),
        }),
        AdmitOutcome::Stale { highest } => Err(Rejection::Stale {
            presented: token,
            highest: *highest,
        }),
        AdmitOutcome::Unknown => Err(Rejection::Unknown { presented: token }),
        AdmitOutcome::Ended => Err(Rejection::Ended {
            presented: token,
            short_of: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(1000);

    #[test]
    fn token_header_parsing() {
        assert_eq!(parse_token(None), Err(Rejection::TokenRequired));
        assert_eq!(parse_token(Some(b"42")), Ok(42));
        assert_eq!(parse_token(Some(b" 42 ")), Ok(42));
        for bad in [
            &b""[..],
            b"-1",
            b"4x",
            b"1e3",
            b"99999999999999999999",
            b"\xff",
        ] {
            assert_eq!(
                parse_token(Some(bad)),
                Err(Rejection::MalformedToken),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn resource_header_must_match_the_path() {
        assert_eq!(check_resource_header(None, "kv:a"), Ok(()));
        assert_eq!(check_resource_header(Some(b"kv:a"), "kv:a"), Ok(()));
        assert!(matches!(
            check_resource_header(Some(b"kv:b"), "kv:a"),
            Err(Rejection::ResourceMismatch { .. })
        ));
    }

    #[test]
    fn fast_path_forwards_only_the_granted_token_with_time_left() {
        let now = Instant::now();
        let g = LocalGrant {
            token: 7,
            deadline: now + Duration::from_millis(1500),
        };
        assert_eq!(fast_verdict(Some(&g), 7, now, T), FastVerdict::Forward);
        // Not enough time left for a request to finish before the grant ends.
        assert_eq!(
            fast_verdict(Some(&g), 7, now + Duration::from_millis(600), T),
            FastVerdict::Consult
        );
        // Below the admitted token is stale, without asking anyone.
        assert_eq!(
            fast_verdict(Some(&g), 6, now, T),
            FastVerdict::Reject(Rejection::Stale {
                presented: 6,
                highest: 7
            })
        );
        // A newer token is a new epoch: the cluster decides.
        assert_eq!(fast_verdict(Some(&g), 8, now, T), FastVerdict::Consult);
        assert_eq!(fast_verdict(None, 7, now, T), FastVerdict::Consult);
    }

    #[test]
    fn cluster_outcomes_map_to_spec_codes() {
        let sent = Instant::now();
        let m = Duration::from_millis(100);
        let g = grant_from_outcome(&AdmitOutcome::Admitted { grant_ms: 2000 }, 5, sent, m).unwrap();
        assert_eq!(g.deadline, sent + Duration::from_millis(1900));
        let stale =
            grant_from_outcome(&AdmitOutcome::Stale { highest: 9 }, 5, sent, m).unwrap_err();
        assert_eq!((stale.status(), stale.code()), (412, "stale_fencing_token"));
        assert_eq!(stale.body()["highest_token"], 9);
        assert_eq!(stale.body()["presented_token"], 5);
        let unknown = grant_from_outcome(&AdmitOutcome::Unknown, 5, sent, m).unwrap_err();
        assert_eq!(
            (unknown.status(), unknown.code()),
            (412, "unknown_fencing_token")
        );
        let ended = grant_from_outcome(&AdmitOutcome::Ended, 5, sent, m).unwrap_err();
        assert_eq!(ended.status(), 412);
        assert_eq!(Rejection::TokenRequired.status(), 428);
        assert_eq!(Rejection::NoQuorum.status(), 503);
        // A grant shorter than the margin yields an already-expired local grant.
        let g = grant_from_outcome(&AdmitOutcome::Admitted { grant_ms: 50 }, 5, sent, m).unwrap();
        assert_eq!(g.deadline, sent);
    }
}

/// Header values from the network never panic the token parser.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(lock_core::testkit::fuzz_cases(3_000)))]

        #[test]
        fn any_token_header_parses_or_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            match parse_token(Some(&bytes)) {
                Ok(t) => prop_assert_eq!(std::str::from_utf8(&bytes).map(|s| s.trim().parse::<u64>().ok()), Ok(Some(t))),
                Err(r) => prop_assert!(matches!(r, Rejection::MalformedToken)),
            }
        }

        #[test]
        fn any_resource_header_is_checked_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = check_resource_header(Some(&bytes), "kv:a");
        }

        /// The fast path forwards only the admitted token, only while a whole upstream timeout
        /// fits in the grant; a lower token is stale; everything else asks the cluster.
        #[test]
        fn fast_verdict_forwards_only_the_admitted_token_in_time(
            granted in proptest::option::of(0u64..8),
            token in 0u64..8,
            left_ms in 0u64..10_000,
            timeout_ms in 0u64..10_000,
        ) {
            let now = Instant::now();
            let grant = granted.map(|t| LocalGrant { token: t, deadline: now + Duration::from_millis(left_ms) });
            let timeout = Duration::from_millis(timeout_ms);
            let verdict = fast_verdict(grant.as_ref(), token, now, timeout);
            match (grant, verdict) {
                (None, v) => prop_assert_eq!(v, FastVerdict::Consult),
                (Some(g), FastVerdict::Forward) => {
                    prop_assert_eq!(token, g.token);
                    prop_assert!(now + timeout <= g.deadline);
                }
                (Some(g), FastVerdict::Reject(r)) => {
                    prop_assert!(token < g.token);
                    prop_assert_eq!(r, Rejection::Stale { presented: token, highest: g.token });
                }
                (Some(g), FastVerdict::Consult) => {
                    prop_assert!(token > g.token || now + timeout > g.deadline);
                }
            }
        }

        /// Any answer of the cluster becomes a grant or a rejection without panicking, and a
        /// grant never reaches past what the cluster granted.
        #[test]
        fn any_admission_answer_maps_without_panic(
            kind in 0u8..4,
            n in any::<u64>(),
            token in any::<u64>(),
            margin_ms in any::<u64>(),
        ) {
            let outcome = match kind {
                0 => AdmitOutcome::Admitted { grant_ms: n },
                1 => AdmitOutcome::Stale { highest: n },
                2 => AdmitOutcome::Unknown,
                _ => AdmitOutcome::Ended,
            };
            let sent = Instant::now();
            match grant_from_outcome(&outcome, token, sent, Duration::from_millis(margin_ms)) {
                Ok(g) => {
                    prop_assert_eq!(kind, 0);
                    prop_assert_eq!(g.token, token);
                    prop_assert!(g.deadline >= sent);
                    prop_assert!(g.deadline.duration_since(sent) <= Duration::from_millis(n));
                }
                Err(_) => prop_assert!(kind != 0),
            }
        }
    }
}
