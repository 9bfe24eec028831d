//! The API's error type: a stable code (with its HTTP status) and a sentence.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::node::ProposeError;
use crate::wire::{ErrorBody, ErrorCode};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
    /// The outcome metrics count it as, when not its code (a wait that timed out answers
    /// `lock_held` like a refusal at once, but is counted as `wait_timeout`).
    pub outcome: Option<&'static str>,
}

impl ApiError {
    /// An error answered with its code's own status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let status =
            StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError {
            status,
            body: ErrorBody::new(code, message),
            outcome: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    /// A query string that did not parse: axum's reason without its "Failed to
    /// deserialize" preamble, and what the call takes.
    pub fn bad_query(rejection: &axum::extract::rejection::QueryRejection, takes: &str) -> Self {
        let text = rejection.body_text();
        let reason = text
            .strip_prefix("Failed to deserialize query string: ")
            .unwrap_or(&text);
        Self::invalid(format!(
            "Bad query string: {reason}. This call takes {takes}."
        ))
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    /// Answers with another status than the code's usual one (axum's own rejections).
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub fn with_retry_after(mut self, retry_after_ms: u64) -> Self {
        self.body.retry_after_ms = Some(retry_after_ms);
        self
    }

    pub fn code(&self) -> &ErrorCode {
        &self.body.error
    }

    /// Counted in the outcome metrics and the audit log as `outcome` instead of its code.
    pub fn counted_as(mut self, outcome: &'static str) -> Self {
        self.outcome = Some(outcome);
        self
    }

    /// The outcome the metrics and the audit log record for it.
    pub fn outcome(&self) -> &str {
        self.outcome.unwrap_or_else(|| self.body.error.as_str())
    }
}

impl From<ProposeError> for ApiError {
    fn from(e: ProposeError) -> Self {
        match e {
            ProposeError::NoQuorum | ProposeError::NotLeader(_) => ApiError::new(
                ErrorCode::NoQuorum,
                "No quorum of the cluster answered in time. The call may still take effect: \
                 retry it as it was (an acquire or cancel with the same request_id, a renew or \
                 release with the same lease_id), on this node or another.",
            ),
            ProposeError::Overloaded {
                queued,
                retry_after_ms,
            } => ApiError::new(
                ErrorCode::Overloaded,
                format!(
                    "The leader has {queued} commands waiting for the raft log, as many as it \
                     holds; this call was refused before it was queued, so nothing was done. \
                     Retry after retry_after_ms."
                ),
            )
            .with_retry_after(retry_after_ms),
            ProposeError::Stopped(why) => ApiError::new(
                ErrorCode::NodeStopped,
                format!("This node is shutting down ({why}); use another node."),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}
