//! Writes that carry the lease's fencing token and are refused once the lease is invalid.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::RequestBuilder;

use super::state::{fence_headers, LeaseState};
use super::Error;

/// A request built by [`LeaseGuard::fenced_request`](super::LeaseGuard::fenced_request).
/// Shape it like a `reqwest::RequestBuilder`; [`send`](Self::send) adds the fencing headers
/// and checks the guard immediately before the request leaves.
///
/// The check narrows the window for a zombie write but cannot close it (the request may sit
/// in a socket buffer while the lease runs out). The fencing proxy closes it: a write whose
/// token is older than the newest one issued is rejected there.
#[must_use = "a fenced request does nothing until sent"]
pub struct FencedRequest {
    state: Arc<LeaseState>,
    builder: RequestBuilder,
}

impl FencedRequest {
    pub(crate) fn new(state: Arc<LeaseState>, builder: RequestBuilder) -> Self {
        FencedRequest { state, builder }
    }

    /// Adds a header (use [`map`](Self::map) for reqwest's generic `header`).
    pub fn header(self, name: HeaderName, value: HeaderValue) -> Self {
        self.map(|b| b.header(name, value))
    }

    pub fn body(self, body: impl Into<reqwest::Body>) -> Self {
        self.map(|b| b.body(body))
    }

    pub fn json<T: serde::Serialize + ?Sized>(self, value: &T) -> Self {
        self.map(|b| b.json(value))
    }

    pub fn timeout(self, timeout: Duration) -> Self {
        self.map(|b| b.timeout(timeout))
    }

    /// Anything else `RequestBuilder` can do.
    pub fn map(mut self, f: impl FnOnce(RequestBuilder) -> RequestBuilder) -> Self {
        self.builder = f(self.builder);
        self
    }

    /// Sends the write with `Fence-Token` and `Fence-Resource`, unless the guard is invalid,
    /// in which case nothing is sent and the answer is [`Error::LeaseInvalid`].
    pub async fn send(self) -> Result<reqwest::Response, Error> {
        self.state.check()?;
        let headers = fence_headers(&self.state)?;
        Ok(self.builder.headers(headers).send().await?)
    }
}
