//! Peer authentication: every node-to-node request carries an HMAC-SHA256 made with the
//! cluster's shared secret.
//!
//! The tag header holds `{unix_ms}.{nonce}.{head_mac}.{body_mac}` (hex):
//!
//! - `head_mac = HMAC(secret, "fencegate-peer-v1" | from | unix_ms | nonce | path)` is checked
//!   from the headers alone, so a caller without the secret is refused before its body is read;
//! - `body_mac = HMAC(secret, head_mac | body)` binds the body to that header, so a captured
//!   header cannot carry another body.
//!
//! A tag is accepted for [`MAX_SKEW_MS`] around the receiver's clock. Within that window a
//! recorded request could be sent again; that is harmless because raft tolerates duplicated
//! messages and every forwarded command is idempotent or deduplicated by its request id for far
//! longer than the window. The secret authenticates, it does not encrypt: peer traffic belongs
//! on a private network.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::wire::hex;

type HmacSha256 = Hmac<Sha256>;

/// The header carrying a peer request's authentication tag.
pub const AUTH_HEADER: &str = "x-fencegate-peer-auth";

/// How far a tag's timestamp may be from the receiver's clock.
pub const MAX_SKEW_MS: u64 = 60_000;

/// The shortest secret accepted (bytes).
pub const MIN_SECRET_LEN: usize = 16;

const DOMAIN: &[u8] = b"fencegate-peer-v1";

/// The cluster's shared peer secret. Its `Debug` never shows the bytes.
#[derive(Clone)]
pub struct PeerSecret(Arc<[u8]>);

impl fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerSecret(..)")
    }
}

/// Why a secret or a tag was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("the peer secret must be at least {MIN_SECRET_LEN} bytes")]
    SecretTooShort,
    #[error("no peer authentication tag")]
    Missing,
    #[error("malformed peer authentication tag")]
    Malformed,
    /// The sender's clock, as its message says, is `ahead_ms` past this node's (negative:
    /// behind) by more than [`MAX_SKEW_MS`].
    #[error(
        "the calling node's clock is {} s {} the called node's; peers' clocks must agree within \
         {} s (run NTP on every node)",
        ahead_ms.unsigned_abs() / 1_000,
        if *ahead_ms >= 0 { "ahead of" } else { "behind" },
        MAX_SKEW_MS / 1_000
    )]
    Stale { ahead_ms: i64 },
    #[error("peer authentication tag does not match (wrong cluster secret?)")]
    BadMac,
}

impl AuthError {
    /// The refusal as the refused peer and the log read it: what is wrong and what to do.
    pub fn refusal(&self) -> String {
        match self {
            AuthError::Stale { .. } => format!("{self}."),
            _ => format!("{self}. Peers must share the cluster's peer secret."),
        }
    }
}

/// Refuses a message stamped more than [`MAX_SKEW_MS`] away from this node's clock.
fn check_skew(unix_ms: u64) -> Result<(), AuthError> {
    let ahead_ms = ms_apart(unix_ms, now_ms());
    if ahead_ms.unsigned_abs() > MAX_SKEW_MS {
        return Err(AuthError::Stale { ahead_ms });
    }
    Ok(())
}

impl PeerSecret {
    /// A secret from its text (surrounding whitespace, such as a file's last newline, is
    /// not part of it).
    pub fn new(text: &str) -> Result<Self, AuthError> {
        let bytes = text.trim().as_bytes();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(AuthError::SecretTooShort);
        }
        Ok(PeerSecret(bytes.into()))
    }

    /// A fresh random secret (256 bits, hex), as `fencegate dev` uses.
    pub fn generate() -> String {
        hex::encode(&rand::random::<[u8; 32]>())
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length; this cannot fail.
        HmacSha256::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!())
    }

    fn head_mac(&self, from: &str, unix_ms: u64, nonce: &str, path: &str) -> HmacSha256 {
        let mut mac = self.mac();
        for part in [
            DOMAIN,
            from.as_bytes(),
            &unix_ms.to_be_bytes(),
            nonce.as_bytes(),
        ] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.update(path.as_bytes());
        mac
    }

    fn body_mac(&self, head: &[u8], body: &[u8]) -> HmacSha256 {
        let mut mac = self.mac();
        mac.update(head);
        mac.update(body);
        mac
    }

    /// The tag for a request from node `from` to `path` with `body`.
    pub fn sign(&self, from: &str, path: &str, body: &[u8]) -> String {
        let unix_ms = now_ms();
        let nonce = hex::encode(&rand::random::<[u8; 12]>());
        let head = self
            .head_mac(from, unix_ms, &nonce, path)
            .finalize()
            .into_bytes();
        let body = self.body_mac(&head, body).finalize().into_bytes();
        format!(
            "{unix_ms}.{nonce}.{}.{}",
            hex::encode(&head),
            hex::encode(&body)
        )
    }

    /// Checks the header part of `tag`; on success returns what [`Self::verify_body`] needs.
    pub fn verify_head(&self, from: &str, path: &str, tag: &str) -> Result<HeadOk, AuthError> {
        let mut parts = tag.split('.');
        let (Some(ms), Some(nonce), Some(head), Some(body), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(AuthError::Malformed);
        };
        let unix_ms: u64 = ms.parse().map_err(|_| AuthError::Malformed)?;
        let head = hex::decode(head).ok_or(AuthError::Malformed)?;
        let body_mac = hex::decode(body).ok_or(AuthError::Malformed)?;
        check_skew(unix_ms)?;
        self.head_mac(from, unix_ms, nonce, path)
            .verify_slice(&head)
            .map_err(|_| AuthError::BadMac)?;
        Ok(HeadOk { head, body_mac })
    }

    /// Checks that `body` is the one the verified header was made for.
    pub fn verify_body(&self, ok: &HeadOk, body: &[u8]) -> Result<(), AuthError> {
        self.body_mac(&ok.head, body)
            .verify_slice(&ok.body_mac)
            .map_err(|_| AuthError::BadMac)
    }
}

/// The domains of a framed connection's handshake and session key (see
/// [`frames`](super::frames)): each MAC answers one question only.
const CONN_HELLO: &[u8] = b"fencegate-peer-conn-v1 hello";
const CONN_ACCEPT: &[u8] = b"fencegate-peer-conn-v1 accept";
const CONN_SESSION: &[u8] = b"fencegate-peer-conn-v1 session";

impl PeerSecret {
    /// The MAC of `parts`, each prefixed with its length so no two lists of parts collide.
    fn mac_parts(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.mac();
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    fn mac_of(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.mac_parts(parts).finalize().into_bytes().into()
    }

    fn hello_parts(&self, from: u64, unix_ms: u64, nonce: &[u8]) -> HmacSha256 {
        self.mac_parts(&[
            CONN_HELLO,
            &from.to_be_bytes(),
            &unix_ms.to_be_bytes(),
            nonce,
        ])
    }

    /// What a node opening a framed connection proves it holds the secret with.
    pub(crate) fn hello_mac(&self, from: u64, unix_ms: u64, nonce: &[u8]) -> [u8; 32] {
        self.hello_parts(from, unix_ms, nonce)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks a connection's hello: made with this secret, within [`MAX_SKEW_MS`] of now.
    pub(crate) fn verify_hello(
        &self,
        from: u64,
        unix_ms: u64,
        nonce: &[u8],
        mac: &[u8],
    ) -> Result<(), AuthError> {
        check_skew(unix_ms)?;
        self.hello_parts(from, unix_ms, nonce)
            .verify_slice(mac)
            .map_err(|_| AuthError::BadMac)
    }

    /// What the accepting node proves it holds the secret with: bound to both nonces, so it
    /// answers this hello only.
    pub(crate) fn accept_mac(&self, client_nonce: &[u8], server_nonce: &[u8]) -> [u8; 32] {
        self.mac_of(&[CONN_ACCEPT, client_nonce, server_nonce])
    }

    /// Checks the accepting node's answer to this node's hello (compared in constant time).
    pub(crate) fn verify_accept(
        &self,
        client_nonce: &[u8],
        server_nonce: &[u8],
        mac: &[u8],
    ) -> Result<(), AuthError> {
        self.mac_parts(&[CONN_ACCEPT, client_nonce, server_nonce])
            .verify_slice(mac)
            .map_err(|_| AuthError::BadMac)
    }

    /// The key that signs every frame of one connection.
    pub(crate) fn session_key(&self, client_nonce: &[u8], server_nonce: &[u8]) -> SessionKey {
        let key = self.mac_of(&[CONN_SESSION, client_nonce, server_nonce]);
        // HMAC takes a key of any length; this cannot fail.
        SessionKey(HmacSha256::new_from_slice(&key).unwrap_or_else(|_| unreachable!()))
    }
}

/// Bytes of a frame's tag: half of an HMAC-SHA256, as in TLS's truncated MACs.
pub(crate) const TAG_LEN: usize = 16;

/// A framed connection's key, known to its two ends only for as long as it lasts: an HMAC
/// already keyed with it, cloned for each frame instead of keyed again.
pub(crate) struct SessionKey(HmacSha256);

impl SessionKey {
    /// The 16-byte tag of one frame: its direction and sequence number are signed with it, so
    /// a frame cannot be replayed, reordered or sent back the other way.
    pub(crate) fn tag(&self, direction: u8, seq: u64, parts: &[&[u8]]) -> [u8; TAG_LEN] {
        let full = self
            .frame_mac(direction, seq, parts)
            .finalize()
            .into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// Whether `tag` is the frame's tag (compared in constant time).
    pub(crate) fn verify(&self, direction: u8, seq: u64, parts: &[&[u8]], tag: &[u8]) -> bool {
        tag.len() == TAG_LEN
            && self
                .frame_mac(direction, seq, parts)
                .verify_truncated_left(tag)
                .is_ok()
    }

    fn frame_mac(&self, direction: u8, seq: u64, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.0.clone();
        mac.update(&[direction]);
        mac.update(&seq.to_be_bytes());
        for part in parts {
            mac.update(part);
        }
        mac
    }
}

/// A tag whose header part was verified.
pub struct HeadOk {
    head: Vec<u8>,
    body_mac: Vec<u8>,
}

/// Peer calls refused for their authentication since the last warning, and when that was.
static REFUSED: AtomicU64 = AtomicU64::new(0);
static WARNED_AT_MS: AtomicU64 = AtomicU64::new(0);
/// A node refusing a misconfigured peer warns at most this often.
const WARN_EVERY_MS: u64 = 10_000;

/// Logs a peer call refused for its authentication, at most once per [`WARN_EVERY_MS`] with
/// the number refused meanwhile: the refusing node says why a member cannot reach it, without
/// a line per attempt.
pub(crate) fn warn_refused(claimed_from: &str, why: &dyn fmt::Display) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    let now = now_ms();
    let last = WARNED_AT_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < WARN_EVERY_MS
        || WARNED_AT_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let refused = REFUSED.swap(0, Ordering::Relaxed);
    tracing::warn!(
        refused,
        from = claimed_from,
        "refused peer calls that failed authentication: {why}"
    );
}

/// How far clock reading `a` is past `b`, in ms (negative: before), saturating.
pub(crate) fn ms_apart(a: u64, b: u64) -> i64 {
    if a >= b {
        i64::try_from(a - b).unwrap_or(i64::MAX)
    } else {
        i64::try_from(b - a).map_or(i64::MIN, |d| -d)
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> PeerSecret {
        PeerSecret::new("0123456789abcdef-test").expect("secret")
    }

    #[test]
    fn a_signed_request_verifies_and_nothing_else_does() {
        let s = secret();
        let tag = s.sign("2", "/raft/vote", b"body");
        let ok = s.verify_head("2", "/raft/vote", &tag).expect("head");
        assert_eq!(s.verify_body(&ok, b"body"), Ok(()));
        assert_eq!(s.verify_body(&ok, b"other"), Err(AuthError::BadMac));
        assert!(matches!(
            s.verify_head("3", "/raft/vote", &tag),
            Err(AuthError::BadMac)
        ));
        assert!(matches!(
            s.verify_head("2", "/raft/append", &tag),
            Err(AuthError::BadMac)
        ));
        let other = PeerSecret::new("another-secret-of-16").expect("secret");
        assert!(matches!(
            other.verify_head("2", "/raft/vote", &tag),
            Err(AuthError::BadMac)
        ));
    }

    #[test]
    fn offsets_keep_their_sign() {
        assert_eq!(ms_apart(10, 3), 7);
        assert_eq!(ms_apart(3, 10), -7);
        assert_eq!(ms_apart(u64::MAX, 0), i64::MAX);
    }

    #[test]
    fn malformed_stale_and_short_are_refused() {
        let s = secret();
        for tag in ["", "1.2.3", "x.n.00.00", "1.n.0g.00", "1.n.00.00.00"] {
            assert!(matches!(
                s.verify_head("1", "/p", tag),
                Err(AuthError::Malformed)
            ));
        }
        assert!(matches!(
            s.verify_head("1", "/p", "1000.n.00.00"),
            Err(AuthError::Stale { .. })
        ));
        let ahead = now_ms() + 95_400;
        let e = s
            .verify_hello(1, ahead, b"nonce", &[0; 32])
            .expect_err("95 s ahead");
        assert_eq!(
            e.refusal(),
            "the calling node's clock is 95 s ahead of the called node's; peers' clocks must \
             agree within 60 s (run NTP on every node)."
        );
        assert_eq!(
            PeerSecret::new("short\n").err(),
            Some(AuthError::SecretTooShort)
        );
        assert_eq!(PeerSecret::generate().len(), 64);
    }
}
