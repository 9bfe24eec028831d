//! The resource name as the machine keys its maps and indexes by.
//!
//! Every command looks its resource up several times (the record, then the expiry indexes
//! keyed by deadline and name), and at the seed workload that is millions of ordered
//! comparisons a second. With plain `String` keys each comparison is a `memcmp` call and
//! every index entry is a separate copy of the name. A [`ResName`] carries the name's first
//! 16 bytes as two integers, so most comparisons are two integer compares, and shares one
//! allocation of the name between the record and every index entry that names it, so a copy
//! is a reference-count increment.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A resource name, ordered exactly as its bytes (as `str` orders), compared mostly by its
/// first 16 bytes held inline.
#[derive(Clone)]
pub struct ResName {
    /// The name's first 16 bytes, big-endian, zero-padded. Comparing these words orders
    /// names as their bytes do as far as the 16 bytes go (see [`ResName::cmp`]).
    head: [u64; 2],
    name: Arc<str>,
}

impl ResName {
    pub fn new(name: &str) -> Self {
        let mut bytes = [0u8; 16];
        let n = name.len().min(16);
        bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_be_bytes(w)
        };
        ResName {
            head: [word(0), word(1)],
            name: Arc::from(name),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.name
    }
}

impl Ord for ResName {
    /// Byte order, as `str`'s. Where the zero-padded heads differ, they differ first at a byte
    /// where at least one name has a real byte, and a shorter name's padding (zero) sorts before
    /// any byte, as a name sorts before its extensions: so the heads order the two names exactly
    /// as their bytes do. Equal heads leave it to the whole names.
    fn cmp(&self, other: &Self) -> Ordering {
        self.head.cmp(&other.head).then_with(|| {
            if Arc::ptr_eq(&self.name, &other.name) {
                Ordering::Equal
            } else {
                self.name.as_bytes().cmp(other.name.as_bytes())
            }
        })
    }
}

impl PartialOrd for ResName {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for ResName {
    fn eq(&self, other: &Self) -> bool {
        self.head == other.head && (Arc::ptr_eq(&self.name, &other.name) || self.name == other.name)
    }
}

impl Eq for ResName {}

/// Equality and order agree with `str`'s, so maps keyed by names can be read by `&str`.
impl Borrow<str> for ResName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl Deref for ResName {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for ResName {
    fn from(name: String) -> Self {
        ResName::new(&name)
    }
}

impl fmt::Debug for ResName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ResName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Written as the plain string, as `String` keys were.
impl Serialize for ResName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ResName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(ResName::new(&name))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Names of the characters resource names use, plus the tenant separator and bytes that
    /// sort below them (a zero byte is where padding could be confused with the name).
    fn name() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(vec!['\0', '\u{1}', '#', '-', '/', '0', '9', 'a', 'z', 'é']),
            0..40,
        )
        .prop_map(|chars| chars.into_iter().collect())
    }

    proptest! {
        #[test]
        fn orders_and_compares_exactly_as_the_strings(a in name(), b in name()) {
            let (x, y) = (ResName::new(&a), ResName::new(&b));
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            prop_assert_eq!(x == y, a == b);
            prop_assert_eq!(x.as_str(), a.as_str());
        }
    }

    #[test]
    fn names_that_share_their_first_sixteen_bytes_are_told_apart() {
        let base = "tenant-with-long#name";
        let (a, b) = (
            ResName::new(&format!("{base}-a")),
            ResName::new(&format!("{base}-b")),
        );
        assert_eq!(a.head, b.head);
        assert!(a < b);
        assert_ne!(a, b);
        assert!(ResName::new("ab") < ResName::new("ab\0"));
        assert!(ResName::new("") < ResName::new("\0"));
    }

    #[test]
    fn is_written_as_the_plain_string() {
        let bytes = rmp_serde::to_vec(&ResName::new("kv:orders/7")).expect("encode");
        assert_eq!(bytes, rmp_serde::to_vec("kv:orders/7").expect("encode"));
        let back: ResName = rmp_serde::from_slice(&bytes).expect("decode");
        assert_eq!(back.as_str(), "kv:orders/7");
    }
}
