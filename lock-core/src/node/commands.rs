//! Turning a caller's request into a command: the node's policy and the lease id.
//!
//! This is node policy, not HTTP: the API handlers only translate requests and answers.

use super::{Node, Policy};
use crate::machine::{Acquire, LeaseId};
use crate::wire::{validate_id, validate_shown, AcquireRequest, MAX_ID_LEN};

impl Policy {
    /// Checks an acquire against this policy and stamps the policy's bounds into the command,
    /// so every replica applies it the same way whatever its own configuration. The error is
    /// a sentence for the caller.
    pub fn acquire(
        &self,
        resource: &str,
        req: AcquireRequest,
        lease_id: LeaseId,
    ) -> Result<Acquire, String> {
        validate_id(&req.request_id, "request_id")?;
        if let Some(holder) = &req.holder {
            validate_shown(holder, "holder")?;
        }
        if req
            .holder
            .as_ref()
            .is_some_and(|h| h.chars().count() > MAX_ID_LEN)
        {
            return Err(format!(
                "Field 'holder' must be at most {MAX_ID_LEN} characters."
            ));
        }
        let ttl_ms = req.ttl_ms.unwrap_or(self.default_ttl_ms);
        if !(self.min_ttl_ms..=self.max_ttl_ms).contains(&ttl_ms) {
            return Err(format!(
                "ttl_ms must be between {} and {} (policy).",
                self.min_ttl_ms, self.max_ttl_ms
            ));
        }
        let wait_timeout_ms = req.wait_timeout_ms.unwrap_or(0);
        if wait_timeout_ms > self.max_wait_timeout_ms {
            return Err(format!(
                "wait_timeout_ms must be at most {} (policy).",
                self.max_wait_timeout_ms
            ));
        }
        Ok(Acquire {
            resource: resource.to_string(),
            request_id: req.request_id,
            holder: req.holder,
            ttl_ms,
            wait_timeout_ms,
            lease_id,
            retain_ms: self.retry_window_ms,
            max_waiters: self.max_waiters_per_resource,
            max_total_waiters: self.max_total_waiters,
            tenant_limits: None,
        })
    }
}

impl Node {
    /// The acquire command for a caller's request, with a fresh lease id: 128 random bits,
    /// used if this acquire is granted now or later by hand-off (a queued acquire carries its
    /// future lease id, so apply needs no randomness).
    pub fn acquire_command(&self, resource: &str, req: AcquireRequest) -> Result<Acquire, String> {
        self.config
            .policy
            .acquire(resource, req, LeaseId(rand::random()))
    }
}
