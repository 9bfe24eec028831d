//! Lease ids: 128 random bits, shown as 32 lowercase hex digits.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

/// A lease identifier: 128 random bits chosen by the leader that proposed the grant.
///
/// It is a bearer capability (whoever knows it may renew or release), so it is never shown by
/// read APIs. On the wire it is 32 lowercase hex digits; it is encoded and parsed without an
/// allocation, since every log entry, snapshot and lock call carries lease ids.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u128);

const HEX_DIGITS: usize = 32;
const BAD_LEASE_ID: &str = "lease_id must be 32 hex digits";

impl LeaseId {
    /// A short digest for logs and the audit trail, where the id itself (a bearer
    /// capability) must not appear: the first 64 bits of the id's SHA-256, enough to match
    /// lines that concern one lease and one-way, so a reader of the audit log learns nothing
    /// of the id.
    #[cfg(feature = "server")]
    pub fn digest(&self) -> String {
        self.short_digest().as_str().to_owned()
    }

    /// [`LeaseId::digest`] without an allocation.
    #[cfg(feature = "server")]
    pub fn short_digest(&self) -> LeaseDigest {
        use sha2::{Digest, Sha256};
        let hash = Sha256::digest(self.0.to_be_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&hash[..8]);
        LeaseDigest(hex_digits(u128::from(u64::from_be_bytes(first))))
    }

    /// The 32 lowercase hex digits, most significant first.
    fn hex(&self) -> [u8; HEX_DIGITS] {
        hex_digits(self.0)
    }

    /// Parses 32 hex digits (either case) or says why not.
    fn parse(s: &[u8]) -> Result<Self, &'static str> {
        if s.len() != HEX_DIGITS {
            return Err(BAD_LEASE_ID);
        }
        let mut value = 0u128;
        for &b in s {
            let nibble = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                b'A'..=b'F' => b - b'A' + 10,
                _ => return Err(BAD_LEASE_ID),
            };
            value = value << 4 | u128::from(nibble);
        }
        Ok(LeaseId(value))
    }
}

/// The 16 lowercase hex digits of a lease id's digest.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LeaseDigest([u8; 16]);

impl LeaseDigest {
    pub fn as_str(&self) -> &str {
        // Only ASCII digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// The low `N` hex digits of `value`, lowercase, most significant first.
fn hex_digits<const N: usize>(value: u128) -> [u8; N] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; N];
    for (i, digit) in out.iter_mut().enumerate() {
        let shift = 4 * (N - 1 - i);
        *digit = DIGITS[(value >> shift) as usize & 0xf];
    }
    out
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex();
        // Only ASCII digits were written.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only a prefix: debug output ends up in logs, and the id is a capability.
        write!(f, "LeaseId({:08x}…)", (self.0 >> 96) as u32)
    }
}

impl From<LeaseId> for String {
    fn from(id: LeaseId) -> String {
        id.to_string()
    }
}

impl TryFrom<String> for LeaseId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl std::str::FromStr for LeaseId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LeaseId::parse(s.as_bytes()).map_err(str::to_string)
    }
}

impl Serialize for LeaseId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let hex = self.hex();
        let text = std::str::from_utf8(&hex).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(text)
    }
}

impl<'de> Deserialize<'de> for LeaseId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(LeaseIdVisitor)
    }
}

struct LeaseIdVisitor;

impl Visitor<'_> for LeaseIdVisitor {
    type Value = LeaseId;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a lease id of 32 hex digits")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<LeaseId, E> {
        LeaseId::parse(s.as_bytes()).map_err(E::custom)
    }

    fn visit_bytes<E: de::Error>(self, s: &[u8]) -> Result<LeaseId, E> {
        LeaseId::parse(s).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn text_round_trips_and_matches_the_hex_format(v in any::<u128>()) {
            let id = LeaseId(v);
            let text = id.to_string();
            prop_assert_eq!(&text, &format!("{v:032x}"));
            prop_assert_eq!(text.parse::<LeaseId>(), Ok(id));
            prop_assert_eq!(text.to_uppercase().parse::<LeaseId>(), Ok(id));
        }

        /// The digest is the first 16 hex digits of the id's SHA-256, never a part of the id.
        #[test]
        fn digest_is_a_prefix_of_the_ids_sha256(v in any::<u128>()) {
            use sha2::{Digest, Sha256};
            let id = LeaseId(v);
            let hash: String = Sha256::digest(v.to_be_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let digest = id.short_digest();
            prop_assert_eq!(digest.as_str(), &hash[..16]);
            prop_assert_eq!(id.digest(), &hash[..16]);
            let hex = id.to_string();
            prop_assert!(!hex.contains(digest.as_str()));
        }

        #[test]
        fn json_round_trips(v in any::<u128>()) {
            let id = LeaseId(v);
            let json = serde_json::to_string(&id).unwrap();
            prop_assert_eq!(&json, &format!("\"{v:032x}\""));
            prop_assert_eq!(serde_json::from_str::<LeaseId>(&json).unwrap(), id);
        }

        #[test]
        fn anything_but_32_hex_digits_is_refused(s in "\\PC{0,40}") {
            let hex = s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
            prop_assert_eq!(s.parse::<LeaseId>().is_ok(), hex);
        }
    }

    #[cfg(feature = "server")]
    proptest! {
        /// Log entries and snapshots hold lease ids as MessagePack strings; they still do.
        #[test]
        fn messagepack_round_trips_as_the_same_string(v in any::<u128>()) {
            let id = LeaseId(v);
            let packed = rmp_serde::to_vec(&id).unwrap();
            prop_assert_eq!(rmp_serde::from_slice::<LeaseId>(&packed).unwrap(), id);
            prop_assert_eq!(packed, rmp_serde::to_vec(&format!("{v:032x}")).unwrap());
        }
    }

    #[test]
    fn refusals_say_what_a_lease_id_is() {
        let long = "0".repeat(33);
        let not_hex = "g".repeat(32);
        for bad in [
            "",
            "abc",
            &long,
            &not_hex,
            "0x000000000000000000000000000000",
        ] {
            assert_eq!(bad.parse::<LeaseId>(), Err(BAD_LEASE_ID.to_string()));
            let err = serde_json::from_str::<LeaseId>(&format!("\"{bad}\"")).unwrap_err();
            assert!(err.to_string().contains(BAD_LEASE_ID), "{err}");
        }
        assert!(serde_json::from_str::<LeaseId>("42").is_err());
    }
}
