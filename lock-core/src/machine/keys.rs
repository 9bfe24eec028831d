//! The replicated table of API keys. Only digests are stored: the secret part of a key is
//! shown once, to whoever created it, and never enters the log, a snapshot or the disk.

use serde::{Deserialize, Serialize};

use super::lock_machine::LockMachine;
use super::types::Response;
use crate::wire::{KeyInfo, KeyRole};

/// One API key as the replicated state keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    /// Public name of the key (also the middle part of the key itself).
    pub id: String,
    pub tenant: String,
    pub role: KeyRole,
    /// SHA-256 of the whole key, lowercase hex.
    pub digest: String,
    #[serde(default)]
    pub label: Option<String>,
    /// Log time of the creation; set by apply, whatever the command carried.
    #[serde(default)]
    pub created_at_ms: u64,
}

impl ApiKeyRecord {
    pub fn info(&self) -> KeyInfo {
        KeyInfo {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            role: self.role,
            label: self.label.clone(),
            created_at_ms: self.created_at_ms,
        }
    }
}

impl LockMachine {
    /// Adds a key; an id already in use is refused (ids are random, so a clash is a retry of
    /// the same creation or a bug: either way the existing key must not change).
    pub(super) fn create_key(&mut self, record: &ApiKeyRecord) -> Response {
        if self.keys.contains_key(&record.id) {
            return Response::KeyCreated(false);
        }
        let mut record = record.clone();
        record.created_at_ms = self.now_ms;
        self.keys.insert(record.id.clone(), record);
        Response::KeyCreated(true)
    }

    pub(super) fn revoke_key(&mut self, id: &str) -> Response {
        Response::KeyRevoked(self.keys.remove(id).is_some())
    }

    /// The key with this id, if it exists (not revoked).
    pub fn api_key(&self, id: &str) -> Option<&ApiKeyRecord> {
        self.keys.get(id)
    }

    /// Every key, in id order.
    pub fn api_keys(&self) -> impl Iterator<Item = &ApiKeyRecord> {
        self.keys.values()
    }
}
