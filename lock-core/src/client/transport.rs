//! HTTP to the nodes: one attempt at a time, sorted into definite answers and uncertain
//! outcomes, and a retry loop for calls that are safe to repeat.

use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::route::NodeRoute;
use super::schedule::backoff_delay;
use super::{error_chain, ClientOptions, Error};
use crate::wire::{classify, ErrorBody, ErrorCode, Failure};

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
        let mut clean = Vec::with_capacity(nodes.len());
        for n in nodes {
            let n = n.trim().trim_end_matches('/').to_string();
            if !(n.starts_with("http://") || n.starts_with("https://")) {
                return Err(Error::Invalid(format!(
                    "node '{n}' must be a base URL such as http://127.0.0.1:7001"
                )));
            }
            clean.push(n);
        }
        if opts.request_timeout.is_zero() || opts.call_timeout.is_zero() {
            return Err(Error::Invalid(
                "request_timeout and call_timeout must be positive".into(),
            ));
        }
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
        let url = format!("{base}/v1/locks/{resource}/{action}");
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

    pub fn backoff(&self, attempt: u32) -> Duration {
        backoff_delay(
            attempt,
            self.opts.backoff_base,
            self.opts.backoff_max,
            &mut rand::rng(),
        )
    }
}
