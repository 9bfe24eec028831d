//! What every HTTP listener of a node holds its clients to — body and header size, how long a
//! client may take to send them, how many connections it may hold — and the optional TLS
//! certificate of the public API.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Limits of one HTTP listener (`[node.limits]` for the public API, `[node.peer_limits]` for
/// the peer port). Each bounds what one client can make the node hold: memory for a body or a
/// header, a connection kept open by sending nothing or one byte at a time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpLimits {
    /// Largest request body; a larger one is refused with 413 `payload_too_large` before it is
    /// read (with `Content-Length`) or as soon as it passes the limit (chunked).
    pub max_body_bytes: usize,
    /// Largest request line plus headers; a larger head is refused with 431.
    pub max_header_bytes: usize,
    /// How long a client may take to send a whole request head, counted from the moment the
    /// connection is ready for it (so it also closes idle keep-alive connections).
    pub header_timeout_ms: u64,
    /// How long a client may take to send a whole request body: 408 `request_timeout`.
    pub body_timeout_ms: u64,
    /// How long an answer may wait for the client to read any of it; a connection whose client
    /// reads nothing for this long is closed (each byte read starts the time again).
    pub send_timeout_ms: u64,
    /// Connections served at once; further ones wait in the listen backlog until one closes.
    pub max_connections: usize,
}

/// hyper's smallest read buffer: a header limit below it is not enforceable.
pub const MIN_HEADER_BYTES: usize = 8 * 1024;

impl Default for HttpLimits {
    /// The public API's limits: lock calls are small JSON bodies.
    fn default() -> Self {
        HttpLimits {
            max_body_bytes: 64 * 1024,
            max_header_bytes: 16 * 1024,
            header_timeout_ms: 10_000,
            body_timeout_ms: 10_000,
            send_timeout_ms: 60_000,
            max_connections: 4_096,
        }
    }
}

impl HttpLimits {
    /// The peer port's limits. A snapshot chunk is at most 1 MiB plus its header and an append
    /// carries a bounded number of entries; 64 MiB leaves room for both while still refusing a
    /// runaway body. Peers keep pooled connections open between heartbeats.
    pub fn peer() -> Self {
        HttpLimits {
            max_body_bytes: 64 << 20,
            max_header_bytes: 16 * 1024,
            header_timeout_ms: 30_000,
            body_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            max_connections: 1_024,
        }
    }

    /// Checks the limits are usable; the error names the setting (`what` is its table).
    pub fn validate(&self, what: &str) -> Result<(), String> {
        if self.max_body_bytes == 0 {
            return Err(format!("{what}.max_body_bytes must be at least 1"));
        }
        if self.max_header_bytes < MIN_HEADER_BYTES {
            return Err(format!(
                "{what}.max_header_bytes ({}) must be at least {MIN_HEADER_BYTES}",
                self.max_header_bytes
            ));
        }
        if self.header_timeout_ms == 0 || self.body_timeout_ms == 0 || self.send_timeout_ms == 0 {
            return Err(format!(
                "{what}.header_timeout_ms, {what}.body_timeout_ms and {what}.send_timeout_ms \
                 must be at least 1"
            ));
        }
        if self.max_connections == 0 {
            return Err(format!("{what}.max_connections must be at least 1"));
        }
        Ok(())
    }
}

/// A certificate chain and its private key, PEM files (`[node.tls]`, or a proxy's `[proxy.tls]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The server's certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// The private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}
