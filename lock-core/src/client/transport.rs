//! HTTP to the nodes: one attempt at a time, sorted into definite answers and uncertain
//! outcomes, and a retry loop for calls that are safe to repeat.

use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::route::NodeRoute;
use super::schedule::{backoff_delay, instant_after};
use super::{error_chain, ClientOptions, Error};
use crate::wire::{self, classify, ErrorBody, ErrorCode, Failure};

/// A definite error answer from a node (anything but 5xx).
#[derive(Debug, Clone)]
pub(crate) struct ApiReply {
    pub status: u16,
    pub body: ErrorBody,
}

impl ApiReply {
    /// The caller-facing error for this answer.
    pub fn into_error(self, resource: &str) -> Error {
        let resource = resource.to_string();
        match self.body.error {
            ErrorCode::LockHeld | ErrorCode::LockRevoking => Error::LockHeld {
                resource,
                retry_after: Duration::from_millis(self.body.retry_after_ms.unwrap_or(0)),
            },
            ErrorCode::LeaseLost => Error::LeaseLost { resource },
            ErrorCode::TooManyWaiters => Error::TooManyWaiters { resource },
            code => Error::Api {
                status: self.status,
                code: code.as_str().to_string(),
                message: self.body.message,
            },
        }
    }
}

/// The outcome of one attempt that did not succeed.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// The node answered, and the answer is final for this call.
    Api(ApiReply),
    /// We do not know whether the command was applied: timeout, connection error, `503`
    /// (`no_quorum` may still commit later), other 5xx, or a garbled answer. Safe to retry
    /// with the same request id / lease id.
    Uncertain(String),
}

/// How a retried call ended without success.
#[derive(Debug)]
pub(crate) enum CallFailure {
    Api(ApiReply),
    Exhausted {
        attempts: u32,
        elapsed: Duration,
        last: String,
    },
}

impl CallFailure {
    pub fn into_error(self, resource: &str) -> Error {
        match self {
            CallFailure::Api(reply) => reply.into_error(resource),
            CallFailure::Exhausted {
                attempts,
                elapsed,
                last,
            } => Error::Timeout {
                elapsed,
                attempts,
                last,
            },
        }
    }
}

pub(crate) struct Transport {
    /// Base URLs without a trailing slash.
    nodes: Vec<String>,
    /// The node we currently talk to: the leader once an answer names it and we know which
    /// of our nodes that is, and the next node after an uncertain outcome.
    route: NodeRoute,
    http: reqwest::Client,
    pub opts: ClientOptions,
}

impl Transport {
    pub fn new(nodes: Vec<String>, opts: ClientOptions) -> Result<Self, Error> {
        if nodes.is_empty() {
            return Err(Error::NoNodes);
        }
        let clean = nodes
            .iter()
            .map(|n| node_base(n))
            .collect::<Result<Vec<_>, _>>()?;
        opts.validate().map_err(Error::Invalid)?;
        // Pooled connections are dropped before a node's listener would close them as idle
        // (its header timeout, 10 s by default), so a call never races that close.
        let http = reqwest::Client::builder()
            .connect_timeout(opts.request_timeout)
            .pool_idle_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Transport {
            route: NodeRoute::new(clean.len()),
            nodes: clean,
            http,
            opts,
        })
    }

    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// One `POST /v1/locks/{resource}/{action}` to the current node, bounded by `timeout`.
    /// After an uncertain outcome the next call goes to the next node.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        resource: &str,
        action: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, AttemptError> {
        let idx = self.route.current();
        let base = &self.nodes[idx];
        // Names were checked before (`validate_resource`): only `.` and `..` have no path form.
        let segment = wire::resource_in_path(resource).unwrap_or_default();
        let url = format!("{base}/v1/locks/{segment}/{action}");
        let outcome = if timeout.is_zero() {
            Err(AttemptError::Uncertain("no time left".into()))
        } else {
            // The outer timeout also bounds reading the body, whatever reqwest's own covers.
            match tokio::time::timeout(timeout, self.attempt(idx, &url, body, timeout)).await {
                Ok(r) => r,
                Err(_) => Err(AttemptError::Uncertain(format!(
                    "{base}: no answer within {timeout:?}"
                ))),
            }
        };
        if matches!(outcome, Err(AttemptError::Uncertain(_))) {
            self.route.failed(idx);
        }
        outcome
    }

    /// Sends the next calls to the next node (the current one refused for want of room).
    pub fn move_on(&self) {
        self.route.failed(self.route.current());
    }

    async fn attempt<B: Serialize, T: DeserializeOwned>(
        &self,
        idx: usize,
        url: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, AttemptError> {
        let mut req = self.http.post(url).json(body).timeout(timeout);
        if let Some(key) = &self.opts.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| AttemptError::Uncertain(format!("{url}: {}", error_chain(&e))))?;
        self.route.learn(idx, resp.headers());
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| {
            AttemptError::Uncertain(format!("{url}: reading the answer: {}", error_chain(&e)))
        })?;
        classify(status, &bytes).map_err(|f| match f {
            Failure::Definite { status, body } => AttemptError::Api(ApiReply { status, body }),
            Failure::Uncertain(why) => AttemptError::Uncertain(format!("{url}: {why}")),
        })
    }

    /// Repeats a call that is safe to repeat (renew, release, cancel) on uncertain outcomes,
    /// with backoff, until `until`. Returns the answer and when the successful attempt was
    /// sent (the only moment a renewal's lease is provably measured from).
    pub async fn call_until<B: Serialize, T: DeserializeOwned>(
        &self,
        resource: &str,
        action: &str,
        body: &B,
        until: Instant,
    ) -> Result<(Instant, T), CallFailure> {
        let started = Instant::now();
        let mut attempts = 0u32;
        let mut last = String::from("no attempt made");
        loop {
            let sent = Instant::now();
            let left = until.saturating_duration_since(sent);
            if left.is_zero() {
                return Err(CallFailure::Exhausted {
                    attempts,
                    elapsed: started.elapsed(),
                    last,
                });
            }
            attempts += 1;
            let timeout = self.opts.request_timeout.min(left);
            match self.post(resource, action, body, timeout).await {
                Ok(v) => return Ok((sent, v)),
                Err(AttemptError::Api(reply)) => return Err(CallFailure::Api(reply)),
                Err(AttemptError::Uncertain(why)) => {
                    tracing::debug!(resource, action, attempts, %why, "uncertain outcome; retrying");
                    last = why;
                }
            }
            let pause = self.backoff(attempts);
            let left = until.saturating_duration_since(Instant::now());
            tokio::time::sleep(pause.min(left)).await;
        }
    }

    /// `until` for a call that starts now and may take `budget` (saturating: "forever" is fine).
    pub fn until(&self, budget: Duration) -> Instant {
        instant_after(Instant::now(), budget)
    }

    pub fn backoff(&self, attempt: u32) -> Duration {
        backoff_delay(
            attempt,
            self.opts.backoff_base,
            self.opts.backoff_max,
            &mut rand::rng(),
        )
    }
}

/// A node's base URL, checked whole before anything is sent: a URL that cannot work (a bad
/// host or port, a path, a query) would otherwise only show up as every call timing out.
fn node_base(raw: &str) -> Result<String, Error> {
    let s = raw.trim();
    let refuse = |why: String| {
        Err(Error::Invalid(format!(
            "node '{s}': {why}; a node is a base URL such as http://127.0.0.1:7001"
        )))
    };
    if s.get(..8)
        .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
    {
        return refuse(
            "https is not supported: this client speaks plain HTTP only (it is built without \
             TLS), so reach the nodes with http:// over a network you trust"
                .into(),
        );
    }
    if !s
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("http://"))
    {
        return refuse("it must start with http://".into());
    }
    let url = match reqwest::Url::parse(s) {
        Ok(url) => url,
        Err(e) => return refuse(format!("not a usable URL ({e})")),
    };
    if url.host_str().is_none_or(str::is_empty) {
        return refuse("it has no host".into());
    }
    if url.port() == Some(0) {
        return refuse("port 0 cannot be connected to".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return refuse(
            "credentials in the URL are not supported (use ClientOptions::api_key)".into(),
        );
    }
    if url.query().is_some() {
        return refuse("it has a query ('?…'), which a base URL cannot have".into());
    }
    if url.fragment().is_some() {
        return refuse("it has a fragment ('#…'), which a base URL cannot have".into());
    }
    if url.path() != "/" {
        return refuse(format!(
            "it has a path ('{}'); the client adds /v1/... itself",
            url.path()
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_are_parsed_whole() {
        for (good, base) in [
            ("http://127.0.0.1:7001", "http://127.0.0.1:7001"),
            (" http://127.0.0.1:7001/ ", "http://127.0.0.1:7001"),
            ("http://[::1]:7001", "http://[::1]:7001"),
            ("http://node-1.internal:7001", "http://node-1.internal:7001"),
        ] {
            assert_eq!(node_base(good).expect(good), base);
        }
        for (bad, why) in [
            ("http://127.0.0.1:99999", "invalid port"),
            ("http://127.0.0.1:0", "port 0"),
            ("http://not a host:1", "not a usable URL"),
            ("http://127.0.0.1:22001?x=1", "query"),
            ("http://127.0.0.1:22001/?x=1", "query"),
            ("http://127.0.0.1:22001#top", "fragment"),
            ("http://127.0.0.1:22001/v1", "path"),
            ("http://user:pw@127.0.0.1:22001", "credentials"),
            ("https://127.0.0.1:22001", "plain HTTP only"),
            ("127.0.0.1:22001", "must start with http://"),
            ("http://", "not a usable URL"),
        ] {
            match node_base(bad) {
                Err(Error::Invalid(m)) => {
                    assert!(m.contains(why) && m.contains(bad.trim()), "{bad}: {m}")
                }
                other => panic!("{bad} was accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn client_options_are_checked_when_the_client_is_made() {
        let opts = ClientOptions {
            backoff_base: Duration::ZERO,
            ..Default::default()
        };
        match Transport::new(vec!["http://127.0.0.1:7001".into()], opts) {
            Err(Error::Invalid(m)) => assert!(m.contains("backoff_base"), "{m}"),
            Err(e) => panic!("expected Invalid, got {e:?}"),
            Ok(_) => panic!("a zero backoff was accepted"),
        }
    }
}
