//! Plain API calls the lock client does not cover (reads, cluster administration), over the
//! same endpoint list, parsed into the wire types with the one `classify` rule.

use std::time::{Duration, Instant};

use lock_core::client::error_chain;
use lock_core::wire::{classify, Failure};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{CliError, ClientArgs};

/// Longest one request may take; reads are linearizable and may wait for a leader.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Api {
    endpoints: Vec<String>,
    http: reqwest::Client,
    admin_token: Option<String>,
    api_key: Option<String>,
    /// `--timeout`: how long a read may take over all the endpoints it tries.
    timeout: Duration,
}

impl Api {
    pub fn new(args: &ClientArgs) -> Result<Self, CliError> {
        let http = reqwest::Client::builder()
            .connect_timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| CliError::internal(e.to_string()))?;
        Ok(Api {
            endpoints: args.endpoints.clone(),
            http,
            admin_token: args.admin_token.clone(),
            api_key: args.api_key.clone(),
            timeout: args.timeout,
        })
    }

    /// A read: every endpoint is tried in turn until one answers definitely.
    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, CliError> {
        self.send(
            reqwest::Method::GET,
            path,
            query,
            None::<&()>,
            false,
            self.timeout,
        )
        .await
    }

    /// An admin read (cluster status): carries the admin credential.
    pub async fn admin_get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        self.send(
            reqwest::Method::GET,
            path,
            &[],
            None::<&()>,
            true,
            self.timeout,
        )
        .await
    }

    /// An admin change. Only a refused connection moves on to the next endpoint: after a
    /// timeout or a `503` the change may still happen, and sending it again elsewhere could
    /// apply it twice. `timeout` bounds the whole call.
    pub async fn admin_post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, CliError> {
        self.send(reqwest::Method::POST, path, &[], Some(body), true, timeout)
            .await
    }

    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
        admin: bool,
        timeout: Duration,
    ) -> Result<T, CliError> {
        let retry_any = method == reqwest::Method::GET;
        let mut problems = Vec::new();
        // `timeout` bounds the whole call; a read gives each endpoint at most `REQUEST_TIMEOUT`
        // of it, so one that hangs leaves time for the next.
        let deadline = Instant::now() + timeout;
        for base in &self.endpoints {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                problems.push(format!("--timeout of {timeout:?} used up"));
                break;
            }
            let url = format!("{base}{path}");
            let url = if query.is_empty() {
                reqwest::Url::parse(&url)
            } else {
                reqwest::Url::parse_with_params(&url, query)
            }
            .map_err(|e| CliError::usage(format!("endpoint {base}: {e}")))?;
            let per_endpoint = if retry_any {
                left.min(REQUEST_TIMEOUT)
            } else {
                left
            };
            let mut req = self.http.request(method.clone(), url).timeout(per_endpoint);
            if let Some(b) = body {
                req = req.json(b);
            }
            // Admin calls prefer the admin credential, others the API key; either stands in
            // for the other (the bootstrap admin token is an admin key of the default tenant).
            let bearer = if admin {
                self.admin_token.as_ref().or(self.api_key.as_ref())
            } else {
                self.api_key.as_ref().or(self.admin_token.as_ref())
            };
            if let Some(token) = bearer {
                req = req.bearer_auth(token);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("{base}: {}", error_chain(&e)));
                    if retry_any || e.is_connect() {
                        continue;
                    }
                    break;
                }
            };
            let status = resp.status().as_u16();
            let bytes = match resp.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    problems.push(format!("{base}: reading the answer: {}", error_chain(&e)));
                    if retry_any {
                        continue;
                    }
                    break;
                }
            };
            match classify::<T>(status, &bytes) {
                Ok(v) => return Ok(v),
                Err(Failure::Definite { status, body }) => {
                    return Err(CliError::from_body(status, body))
                }
                Err(Failure::Uncertain(why)) => {
                    problems.push(format!("{base}: {why}"));
                    if !retry_any {
                        break;
                    }
                }
            }
        }
        Err(CliError::unavailable(format!(
            "no node gave a definite answer ({})",
            problems.join("; ")
        )))
    }
}
