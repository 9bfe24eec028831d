//! The `Idempotency-Key` contract as pure functions: route settings, key and tenant checks, the
//! request fingerprint, which upstream answers are final, and how an answer is stored.

use base64::Engine as _;
use blake2::{Blake2b, Digest};
use lock_core::machine::{Completion, StoredAnswer, StoredBody};
use lock_core::wire::hex;
use serde::{Deserialize, Serialize};

type Blake2b256 = Blake2b<blake2::digest::consts::U32>;

/// Whether a route's writes need an `Idempotency-Key`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdempotencyMode {
    /// Writes without a key are refused (400 `idempotency_key_required`).
    Required,
    /// Writes with a key are deduplicated; writes without one are forwarded as they are.
    Optional,
    /// The header is forwarded like any other; nothing is recorded.
    #[default]
    Off,
}

/// A route's idempotency settings (`[routes.idempotency_options]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyOptions {
    /// Header naming the tenant a key belongs to; keys of different tenants never meet.
    pub tenant_header: String,
    /// The tenant of requests without that header.
    pub default_tenant: String,
    /// How long a key's record is kept and replayed (default 24 h).
    pub retain_ms: u64,
    /// After retention, how long the key is still refused as `idempotency_key_expired` before
    /// it is forgotten and may be used again (default 24 h).
    pub tombstone_ms: u64,
    /// Request headers that are part of the fingerprint (besides method, path and body).
    pub fingerprint_headers: Vec<String>,
    /// Response bodies up to this many bytes are stored and replayed; larger ones are stored as
    /// a digest (default 64 KiB).
    pub body_cap_bytes: usize,
    /// The upstream's lookup for a key whose answer was lost, e.g. `/orders/by-key/{key}`:
    /// 200 means the request ran (its body is the answer replayed), 404 that it never ran.
    pub reconcile: Option<String>,
}

impl Default for IdempotencyOptions {
    fn default() -> Self {
        IdempotencyOptions {
            tenant_header: "X-Tenant".into(),
            default_tenant: "demo".into(),
            retain_ms: 24 * 3_600_000,
            tombstone_ms: 24 * 3_600_000,
            fingerprint_headers: Vec::new(),
            body_cap_bytes: 64 * 1024,
            reconcile: None,
        }
    }
}

/// The largest request body accepted on an idempotent route: the body is read whole before the
/// key is claimed (it is part of the fingerprint), in pingora's request buffer.
pub const MAX_REQUEST_BODY: usize = 64 * 1024;

/// Why a key or tenant is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("Idempotency-Key must be 1 to 255 printable ASCII characters")]
    BadKey,
    #[error("the tenant header must be 1 to 255 printable ASCII characters")]
    BadTenant,
    #[error("send the tenant header once: a store reading another copy would book the effect under another tenant than its record")]
    TenantTwice,
}

fn printable(v: &[u8]) -> bool {
    (1..=255).contains(&v.len()) && v.iter().all(|b| (0x20..=0x7e).contains(b))
}

/// Checks an `Idempotency-Key` value.
pub fn parse_key(raw: &[u8]) -> Result<String, KeyError> {
    if !printable(raw) {
        return Err(KeyError::BadKey);
    }
    Ok(String::from_utf8_lossy(raw).into_owned())
}

/// The tenant from its header, or the route's default.
pub fn parse_tenant(raw: Option<&[u8]>, default: &str) -> Result<String, KeyError> {
    match raw {
        None => Ok(default.to_string()),
        Some(v) if printable(v) => Ok(String::from_utf8_lossy(v).into_owned()),
        Some(_) => Err(KeyError::BadTenant),
    }
}

/// Methods whose requests are deduplicated (everything but the safe ones).
pub fn applies_to(method: &str) -> bool {
    !matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE")
}

/// BLAKE2b-256 of `data`, hex.
pub fn digest(data: &[u8]) -> String {
    hex::encode(&Blake2b256::digest(data))
}

/// [`digest`] and length of a body read piece by piece (an answer too large to hold whole).
#[derive(Default)]
pub struct BodyDigest {
    hasher: Blake2b256,
    len: u64,
}

impl BodyDigest {
    pub fn update(&mut self, piece: &[u8]) {
        self.hasher.update(piece);
        self.len += piece.len() as u64;
    }

    /// The length and the digest, as [`StoredBody::Digest`] holds them.
    pub fn finish(self) -> (u64, String) {
        (self.len, hex::encode(&self.hasher.finalize()))
    }
}

/// A header value as an answer keeps it: one `char` per byte (ISO-8859-1), so any value an
/// upstream sends — UTF-8 in a `Content-Disposition` filename, say — is kept and replayed byte
/// for byte; ASCII values read as themselves.
pub fn header_text(value: &[u8]) -> String {
    value.iter().map(|&b| char::from(b)).collect()
}

/// The bytes of a value kept by [`header_text`].
pub fn header_bytes(text: &str) -> Vec<u8> {
    text.chars()
        .map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?'))
        .collect()
}

/// The body as it counts for the fingerprint: a JSON body is canonicalised (keys sorted,
/// whitespace dropped) so two spellings of the same document are the same request. A document
/// that [`Canonical`] cannot rebuild without losing a difference counts byte for byte.
fn canonical_body(content_type: Option<&str>, body: &[u8]) -> Vec<u8> {
    let is_json = content_type.is_some_and(|t| t.to_ascii_lowercase().contains("json"));
    if is_json {
        if let Ok(Canonical(doc)) = serde_json::from_slice::<Canonical>(body) {
            if let Ok(canonical) = serde_json::to_vec(&doc) {
                return canonical;
            }
        }
    }
    body.to_vec()
}

/// A JSON document rebuilt with every object's keys in sorted order. It refuses what a rebuild
/// could make two different requests agree on: a key given twice (parsers disagree on which
/// value counts, and the upstream may read the other one) and a number that is not an integer
/// of at most 64 bits (it is read as a float, and two different numbers can round to one).
struct Canonical(serde_json::Value);

impl<'de> Deserialize<'de> for Canonical {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CanonicalVisitor)
    }
}

struct CanonicalVisitor;

impl<'de> serde::de::Visitor<'de> for CanonicalVisitor {
    type Value = Canonical;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON document without repeated keys or non-integer numbers")
    }

    fn visit_unit<E>(self) -> Result<Canonical, E> {
        Ok(Canonical(serde_json::Value::Null))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Canonical, E> {
        Ok(Canonical(v.into()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Canonical, E> {
        Ok(Canonical(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Canonical, E> {
        Ok(Canonical(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Canonical, E> {
        Err(E::custom("a number that is not a 64-bit integer"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Canonical, E> {
        Ok(Canonical(v.into()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Canonical, A::Error> {
        let mut items = Vec::new();
        while let Some(Canonical(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Canonical(serde_json::Value::Array(items)))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Canonical, A::Error> {
        let mut entries = std::collections::BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let Canonical(value) = map.next_value()?;
            if entries.insert(key, value).is_some() {
                return Err(serde::de::Error::custom("a key given twice"));
            }
        }
        Ok(Canonical(serde_json::Value::Object(
            entries.into_iter().collect(),
        )))
    }
}

/// The request fingerprint: method, path (with query), body hash and the listed headers
/// (`headers` yields each listed header's value, absent ones as `None`).
pub fn fingerprint<'a>(
    method: &str,
    path_and_query: &str,
    content_type: Option<&str>,
    body: &[u8],
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
) -> String {
    let mut h = Blake2b256::new();
    // Length-prefixed fields, so no two different requests hash the same input.
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(method.as_bytes());
    field(path_and_query.as_bytes());
    field(digest(&canonical_body(content_type, body)).as_bytes());
    for (name, value) in headers {
        field(name.to_ascii_lowercase().as_bytes());
        match value {
            Some(v) => field(v),
            None => field(b"\xff(absent)"),
        }
    }
    hex::encode(&h.finalize())
}

/// An upstream answer as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Response headers not worth storing: they describe the connection or this one transfer.
fn stored_header(name: &str) -> bool {
    !matches!(
        name.to_ascii_lowercase().as_str(),
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "content-length"
            | "date"
            | "server"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authenticate"
    )
}

/// The answer as a record stores it: the body inline up to `cap`, else its digest.
pub fn store_answer(answer: &Answer, cap: usize, reconciled: bool) -> StoredAnswer {
    let body = if answer.body.len() <= cap {
        StoredBody::Inline(base64::engine::general_purpose::STANDARD.encode(&answer.body))
    } else {
        StoredBody::Digest {
            len: answer.body.len() as u64,
            blake2b: digest(&answer.body),
        }
    };
    StoredAnswer {
        status: answer.status,
        headers: answer
            .headers
            .iter()
            .filter(|(n, _)| stored_header(n))
            .cloned()
            .collect(),
        body,
        reconciled,
    }
}

/// The body a replay sends: the stored bytes, or nothing for an answer stored as a digest.
pub fn replay_body(answer: &StoredAnswer) -> Vec<u8> {
    match &answer.body {
        StoredBody::Inline(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default(),
        StoredBody::Digest { .. } => Vec::new(),
    }
}

/// Which answers are final. 2xx and 4xx (and 1xx/3xx) are what the upstream decided and are
/// replayed; 408, 425 and 429 say the request was not processed, so the key is released for a
/// retry; 5xx may or may not have acted, so the outcome is unknown.
pub fn classify(answer: &Answer, cap: usize) -> Completion {
    classify_status(answer.status, || store_answer(answer, cap, false))
}

/// [`classify`] for an answer whose body was too large to hold: relayed piece by piece, and
/// stored as its length and digest.
pub fn classify_relayed(
    status: u16,
    headers: &[(String, String)],
    len: u64,
    blake2b: String,
) -> Completion {
    classify_status(status, || {
        stored_relayed(status, headers, len, blake2b, false)
    })
}

/// An answer as a record stores it when its body was too large to hold: its length and digest.
pub fn stored_relayed(
    status: u16,
    headers: &[(String, String)],
    len: u64,
    blake2b: String,
    reconciled: bool,
) -> StoredAnswer {
    StoredAnswer {
        status,
        headers: headers
            .iter()
            .filter(|(n, _)| stored_header(n))
            .cloned()
            .collect(),
        body: StoredBody::Digest { len, blake2b },
        reconciled,
    }
}

fn classify_status(status: u16, stored: impl FnOnce() -> StoredAnswer) -> Completion {
    match status {
        408 | 425 | 429 => Completion::NotRun,
        s if s >= 500 => Completion::Unknown,
        _ => Completion::Final(stored()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_255_printable_ascii() {
        assert_eq!(parse_key(b"order-1").as_deref(), Ok("order-1"));
        assert_eq!(parse_key(b"a b~").as_deref(), Ok("a b~"));
        assert!(parse_key(&[b'k'; 255]).is_ok());
        assert_eq!(parse_key(&[b'k'; 256]), Err(KeyError::BadKey));
        assert_eq!(parse_key(b""), Err(KeyError::BadKey));
        assert_eq!(parse_key(b"tab\there"), Err(KeyError::BadKey));
        assert_eq!(parse_key("ключ".as_bytes()), Err(KeyError::BadKey));
        assert_eq!(parse_tenant(None, "demo").as_deref(), Ok("demo"));
        assert_eq!(parse_tenant(Some(b"acme"), "demo").as_deref(), Ok("acme"));
        assert_eq!(parse_tenant(Some(b""), "demo"), Err(KeyError::BadTenant));
    }

    fn fp(method: &str, path: &str, ct: Option<&str>, body: &str, hdr: Option<&str>) -> String {
        fingerprint(
            method,
            path,
            ct,
            body.as_bytes(),
            [("X-Account", hdr.map(str::as_bytes))],
        )
    }

    #[test]
    fn json_bodies_are_canonicalised_other_bodies_are_not() {
        let json = Some("application/json");
        assert_eq!(
            fp("POST", "/orders", json, r#"{"a":1,"b":[1,2]}"#, None),
            fp("POST", "/orders", json, r#"{ "b": [1, 2], "a": 1 }"#, None)
        );
        assert_ne!(
            fp("POST", "/orders", json, r#"{"a":1}"#, None),
            fp("POST", "/orders", json, r#"{"a":2}"#, None)
        );
        // What a rebuild would lose counts byte for byte: repeated keys (which one counts is
        // the upstream's parser's choice) and numbers read as floats (two can round to one).
        assert_ne!(
            fp("POST", "/orders", json, r#"{"a":1,"a":2}"#, None),
            fp("POST", "/orders", json, r#"{"a":2}"#, None)
        );
        assert_ne!(
            fp(
                "POST",
                "/orders",
                json,
                r#"{"n":12345678901234567890123}"#,
                None
            ),
            fp(
                "POST",
                "/orders",
                json,
                r#"{"n":12345678901234567890124}"#,
                None
            )
        );
        assert_ne!(
            fp("POST", "/orders", json, r#"{"x":0.1}"#, None),
            fp(
                "POST",
                "/orders",
                json,
                r#"{"x":0.10000000000000001}"#,
                None
            )
        );
        assert_eq!(
            fp(
                "POST",
                "/orders",
                json,
                r#"{"a":{"d":[null,true,-5,"\u0041"],"c":"x"}}"#,
                None
            ),
            fp(
                "POST",
                "/orders",
                json,
                r#"{"a":{"c":"x","d":[null,true,-5,"A"]}}"#,
                None
            ),
            "nested objects are sorted too, and a string's escapes are its value"
        );
        assert_ne!(
            fp(
                "POST",
                "/orders",
                Some("text/plain"),
                r#"{"a":1,"b":2}"#,
                None
            ),
            fp(
                "POST",
                "/orders",
                Some("text/plain"),
                r#"{"b":2,"a":1}"#,
                None
            )
        );
    }

    #[test]
    fn every_part_of_the_request_counts() {
        let base = fp("POST", "/orders", None, "x", Some("1"));
        assert_ne!(base, fp("PUT", "/orders", None, "x", Some("1")));
        assert_ne!(base, fp("POST", "/orders?a=1", None, "x", Some("1")));
        assert_ne!(base, fp("POST", "/orders", None, "y", Some("1")));
        assert_ne!(base, fp("POST", "/orders", None, "x", Some("2")));
        assert_ne!(base, fp("POST", "/orders", None, "x", None));
        assert_eq!(base, fp("POST", "/orders", None, "x", Some("1")));
    }

    fn answer(status: u16, body: &[u8]) -> Answer {
        Answer {
            status,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("date".into(), "now".into()),
            ],
            body: body.to_vec(),
        }
    }

    #[test]
    fn final_and_unknown_answers() {
        assert!(matches!(
            classify(&answer(201, b"{}"), 10),
            Completion::Final(_)
        ));
        assert!(matches!(
            classify(&answer(422, b"{}"), 10),
            Completion::Final(_)
        ));
        assert_eq!(classify(&answer(429, b""), 10), Completion::NotRun);
        assert_eq!(classify(&answer(500, b""), 10), Completion::Unknown);
        assert_eq!(classify(&answer(503, b""), 10), Completion::Unknown);
    }

    #[test]
    fn bodies_above_the_cap_are_kept_as_a_digest() {
        let small = store_answer(&answer(201, b"{\"id\":1}"), 16, false);
        assert_eq!(replay_body(&small), b"{\"id\":1}");
        assert_eq!(
            small.headers,
            vec![("content-type".to_string(), "application/json".to_string())]
        );
        let big = store_answer(&answer(201, &[b'x'; 17]), 16, false);
        assert!(matches!(big.body, StoredBody::Digest { len: 17, .. }));
        assert!(replay_body(&big).is_empty());
    }
}
