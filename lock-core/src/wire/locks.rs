//! Bodies of the lock calls: `POST /v1/locks/{resource}/{acquire|renew|release|cancel}`,
//! `GET /v1/locks/{resource}` and `GET /v1/locks?prefix=&limit=`.

use serde::{Deserialize, Serialize};

use super::LeaseId;

/// Longest resource name, in bytes.
pub const MAX_RESOURCE_LEN: usize = 256;
/// Longest `request_id` and `holder`, in characters.
pub const MAX_ID_LEN: usize = 128;
/// Most entries one list call returns.
pub const MAX_LIST_LIMIT: usize = 1_000;

/// The lock actions, which end a `POST /v1/locks/{resource}/{action}` path.
pub const LOCK_ACTIONS: [&str; 4] = ["acquire", "renew", "release", "cancel"];

/// Checks a resource name: 1–256 bytes of `[A-Za-z0-9._:/-]`. The error is a sentence for the
/// caller. (In a URL, send it as [`resource_in_path`] spells it.)
pub fn validate_resource(resource: &str) -> Result<(), String> {
    let ok_char = |b: u8| b.is_ascii_alphanumeric() || b"._:/-".contains(&b);
    if resource.is_empty() || resource.len() > MAX_RESOURCE_LEN {
        return Err(format!(
            "Resource names are 1–{MAX_RESOURCE_LEN} bytes; got {}.",
            resource.len()
        ));
    }
    if !resource.bytes().all(ok_char) {
        return Err("Resource names may only contain letters, digits and . _ : / -".into());
    }
    Ok(())
}

/// A valid resource name as one segment of a URL path: each `/` as `%2F`, so that no part of
/// the name is a `.` or `..` segment, which HTTP clients resolve away before sending (`a/./b`
/// would reach the server as `a/b`), and a name ending in a lock action (`jobs/acquire`) is not
/// read as one. The names `.` and `..` cannot be sent this way at all (URL parsers resolve
/// `%2E` too), and are an error.
pub fn resource_in_path(resource: &str) -> Result<String, String> {
    if matches!(resource, "." | "..") {
        return Err(format!(
            "the resource name '{resource}' cannot be sent in a URL: HTTP clients resolve a \
             '{resource}' path segment away"
        ));
    }
    Ok(resource.replace('/', "%2F"))
}

/// Checks a caller-chosen id field (`request_id`, `holder`, an operator's name): 1–128
/// characters, none of them a control or a bidirectional formatting character.
pub fn validate_id(value: &str, field: &str) -> Result<(), String> {
    validate_shown(value, field)?;
    if value.is_empty() {
        // Absent and empty are the same to the API (the field defaults to empty).
        return Err(format!(
            "Field '{field}' is required and must be 1–{MAX_ID_LEN} characters."
        ));
    }
    if value.chars().count() > MAX_ID_LEN {
        return Err(format!(
            "Field '{field}' must be 1–{MAX_ID_LEN} characters."
        ));
    }
    Ok(())
}

/// `POST /v1/locks/{resource}/acquire`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// Names the logical acquire: a retry with the same id returns the original outcome.
    #[serde(default)]
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Lease length; the server's default (30 s) when absent, bounded by its policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// How long to wait in the resource's FIFO queue; absent or 0 means try once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_timeout_ms: Option<u64>,
}

/// `POST /v1/locks/{resource}/renew` and `.../release`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    #[serde(default)]
    pub lease_id: Option<LeaseId>,
}

/// `POST /v1/locks/{resource}/cancel`: withdraws a waiting acquire.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    #[serde(default)]
    pub request_id: String,
}

/// Refuses control characters (line breaks, escape sequences) and bidirectional formatting
/// characters in a field that tables, terminals and the audit log show: they would let a
/// caller forge rows or make `gnp.exe` read as `exe.png`.
pub fn validate_shown(value: &str, field: &str) -> Result<(), String> {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    };
    match value.chars().find(|c| hidden(*c)) {
        Some(c) => Err(format!(
            "Field '{field}' may not hold control or bidirectional formatting characters \
             (found U+{:04X}).",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

/// A granted lease, as its holder sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireResponse {
    pub resource: String,
    pub lease_id: LeaseId,
    pub fencing_token: u64,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
}

/// A renewed lease: same id and token, a later expiry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewResponse {
    pub lease_id: LeaseId,
    pub fencing_token: u64,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
}

/// `released: false` when the lease was not (or no longer) held: release is idempotent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseResponse {
    pub released: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelResponse {
    pub cancelled: bool,
}

/// One resource as readers see it. Never carries the lease id: that is a bearer capability.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockView {
    pub resource: String,
    pub held: bool,
    pub holder: Option<String>,
    /// The latest token issued for the resource (also after its lease ended).
    pub fencing_token: Option<u64>,
    pub expires_at_ms: Option<u64>,
    pub waiters: u32,
}

/// `GET /v1/locks?prefix=&limit=&after=`: held or waited-on resources in name order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockList {
    pub locks: Vec<LockView>,
    /// Set when more may follow: pass it as `after` to get the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
    /// Log time the list was read at, ms since the Unix epoch (time left = `expires_at_ms` −
    /// this).
    #[serde(default)]
    pub now_ms: u64,
}

impl AcquireResponse {
    pub fn ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ttl_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::{resource_in_path, validate_resource};

    #[test]
    fn resource_names_are_checked_like_the_api_documents() {
        for good in [
            "kv:a",
            "a/b.c/..d",
            "...",
            "a.b/.c",
            "x".repeat(256).as_str(),
            "a_b-c:d",
            // Every name of the allowed bytes, dot segments included (sent with `/` as %2F).
            "x/../kv:a",
            "kv:a/./b",
            ".",
            "..",
            "a/.",
            "/",
        ] {
            assert!(validate_resource(good).is_ok(), "{good}");
        }
        assert!(
            validate_resource("jobs/acquire").is_ok(),
            "sent as jobs%2Facquire"
        );
        for bad in ["", "a b", "x".repeat(257).as_str(), "caf\u{e9}"] {
            assert!(validate_resource(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_go_into_a_url_as_one_segment() {
        assert_eq!(resource_in_path("kv:a").unwrap(), "kv:a");
        assert_eq!(resource_in_path("x/../kv:a").unwrap(), "x%2F..%2Fkv:a");
        assert_eq!(resource_in_path("/").unwrap(), "%2F");
        assert!(resource_in_path(".").is_err() && resource_in_path("..").is_err());
    }
}
