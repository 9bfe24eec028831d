//! The API's error type: a status, a stable code and a sentence (SPEC §4).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::node::ProposeError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Extra fields merged into the body (e.g. `retry_after_ms`).
    pub extra: Map<String, Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: Map::new(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_string(), value.into());
        self
    }
}

impl From<ProposeError> for ApiError {
    fn from(e: ProposeError) -> Self {
        match e {
            ProposeError::NoQuorum | ProposeError::NotLeader(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_quorum",
                "No quorum of the cluster answered in time; nothing was granted. Retry with the \
                 same request_id.",
            ),
            ProposeError::Stopped(why) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "node_stopped",
                format!("This node is shutting down ({why}); use another node."),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.code, "message": self.message });
        if let Value::Object(map) = &mut body {
            map.extend(self.extra);
        }
        (self.status, axum::Json(body)).into_response()
    }
}
