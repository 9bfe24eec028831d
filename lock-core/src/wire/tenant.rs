//! Tenants and API keys: tenant names, how a tenant's resource names are kept apart from
//! another's, the key format, and the bodies of the key management calls
//! (`/v1/admin/keys`).
//!
//! A tenant's resources live in their own namespace. The node stores a resource of tenant `t`
//! under `t#name`; `#` is not allowed in resource names, so no name a caller can send reaches
//! another tenant's namespace. The tenant [`DEFAULT_TENANT`] is stored without a prefix: it is
//! the one implicit tenant of a node without authentication, so turning authentication on keeps
//! existing locks reachable through keys of that tenant.

use serde::{Deserialize, Serialize};

/// The tenant of a node without authentication, and of its bootstrap admin credential.
pub const DEFAULT_TENANT: &str = "default";

/// Between a tenant and a resource name in the stored name; never part of a valid resource
/// name or tenant.
pub const TENANT_SEPARATOR: char = '#';

/// Longest tenant name, in bytes.
pub const MAX_TENANT_LEN: usize = 64;

/// The prefix of every API key, so a leaked key is recognisable in logs and secret scanners.
pub const API_KEY_PREFIX: &str = "fgk_";

/// Checks a tenant name: 1–64 bytes of `[a-z0-9_-]`. The error is a sentence for the caller.
pub fn validate_tenant(tenant: &str) -> Result<(), String> {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-';
    if tenant.is_empty() || tenant.len() > MAX_TENANT_LEN || !tenant.bytes().all(ok) {
        return Err(format!(
            "Tenant names are 1–{MAX_TENANT_LEN} characters of a-z, 0-9, _ and -."
        ));
    }
    Ok(())
}

/// The stored name of `tenant`'s resource `name`.
pub fn scoped_name(tenant: &str, name: &str) -> String {
    if tenant == DEFAULT_TENANT {
        name.to_string()
    } else {
        format!("{tenant}{TENANT_SEPARATOR}{name}")
    }
}

/// The tenant and the caller-visible name of a stored resource name.
pub fn split_scoped(stored: &str) -> (&str, &str) {
    stored
        .split_once(TENANT_SEPARATOR)
        .unwrap_or((DEFAULT_TENANT, stored))
}

/// Checks a stored resource name, as the operator endpoints take them: a valid resource name,
/// optionally after `tenant#`.
pub fn validate_stored_name(stored: &str) -> Result<(), String> {
    if let Some((tenant, _)) = stored.split_once(TENANT_SEPARATOR) {
        validate_tenant(tenant)?;
    }
    super::validate_resource(split_scoped(stored).1)
}

/// The role of an API key: `client` keys make lock calls in their tenant's namespace; `admin`
/// keys also manage keys and members and act as operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyRole {
    Client,
    Admin,
}

impl KeyRole {
    pub fn as_str(&self) -> &'static str {
        match self {
            KeyRole::Client => "client",
            KeyRole::Admin => "admin",
        }
    }
}

/// The key id inside a presented key (`fgk_<id>_<secret>`), if it has that shape. The id is
/// not secret: it names the key in listings and the audit log.
pub fn api_key_id(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(API_KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id) && hex(secret)).then_some(id)
}

/// `POST /v1/admin/keys`: creates a key for `tenant` with `role`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    pub tenant: String,
    pub role: KeyRole,
    /// A note for operators (who the key is for); at most 128 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// The answer to a key creation: the only time the secret `key` is ever shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedKey {
    pub id: String,
    /// The bearer token: `Authorization: Bearer <key>`. Only its SHA-256 digest is stored.
    pub key: String,
    pub tenant: String,
    pub role: KeyRole,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// A key as listings show it: never the secret, nor its digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    pub id: String,
    pub tenant: String,
    pub role: KeyRole,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Log time of the creation, ms since the Unix epoch.
    pub created_at_ms: u64,
}

/// `GET /v1/admin/keys`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyList {
    pub keys: Vec<KeyInfo>,
}

/// `POST /v1/admin/keys/{id}/revoke`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeKeyResponse {
    pub id: String,
    /// False when no key had that id (already revoked, or never created).
    pub revoked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::validate_resource;

    #[test]
    fn no_valid_resource_name_reaches_another_tenants_namespace() {
        // A caller of the default tenant sends names unprefixed; the separator is refused,
        // so `acme#x` (tenant acme's `x`) cannot be named by anyone but acme.
        assert!(validate_resource("acme#x").is_err());
        assert_eq!(scoped_name("acme", "x"), "acme#x");
        assert_eq!(split_scoped("acme#x"), ("acme", "x"));
        assert_eq!(scoped_name(DEFAULT_TENANT, "x"), "x");
        assert_eq!(split_scoped("x"), (DEFAULT_TENANT, "x"));
        // A tenant's name cannot contain the separator either, so the split is unambiguous.
        assert!(validate_tenant("a#b").is_err());
        assert!(validate_tenant("acme-2_x").is_ok());
        assert!(validate_tenant("").is_err());
        assert!(validate_tenant("Acme").is_err());
        assert!(validate_stored_name("acme#kv:1").is_ok());
        assert!(validate_stored_name("kv:1").is_ok());
        assert!(validate_stored_name("Acme#kv:1").is_err());
        assert!(validate_stored_name("acme#kv#1").is_err());
    }

    #[test]
    fn key_ids_are_read_only_from_well_formed_keys() {
        assert_eq!(api_key_id("fgk_0a1b_ffee"), Some("0a1b"));
        assert_eq!(api_key_id("fgk__ffee"), None);
        assert_eq!(api_key_id("fgk_0a1b_"), None);
        assert_eq!(api_key_id("xyz_0a1b_ffee"), None);
        assert_eq!(api_key_id("fgk_0a1b_zz"), None);
    }
}
