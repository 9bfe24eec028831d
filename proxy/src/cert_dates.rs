//! Warnings about the dates of a node's TLS certificates. rustls loads an expired certificate
//! without complaint, and the node starts; its clients then fail their handshakes with an
//! error that names neither the file nor the date. So the config check names them instead.

use std::path::Path;

use x509_parser::pem::Pem;

/// A certificate this close to its end is reported ahead of time.
const EXPIRY_NOTICE_S: i64 = 30 * 24 * 3600;

/// Logs a warning for every certificate in `file` (the `key` in the config) that is expired,
/// not valid yet, or ends within 30 days.
pub fn warn_about(key: &str, file: &Path) {
    let Ok(pem) = std::fs::read(file) else {
        // Loading the certificate already failed with its own error if it cannot be read.
        return;
    };
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    for msg in problems(&pem, now_s) {
        tracing::warn!("{key} {}: {msg}", file.display());
    }
}

/// What is wrong with the dates of the certificates in `pem` at `now_s` (Unix seconds).
fn problems(pem: &[u8], now_s: i64) -> Vec<String> {
    let mut out = Vec::new();
    for block in Pem::iter_from_buffer(pem).flatten() {
        if block.label != "CERTIFICATE" {
            continue;
        }
        let Ok(cert) = block.parse_x509() else {
            continue;
        };
        let validity = cert.validity();
        let subject = cert.subject().to_string();
        let (from, until) = (validity.not_before, validity.not_after);
        if until.timestamp() < now_s {
            out.push(format!(
                "the certificate for \"{subject}\" expired on {until}; clients will refuse it"
            ));
        } else if from.timestamp() > now_s {
            out.push(format!(
                "the certificate for \"{subject}\" is not valid before {from}; clients will \
                 refuse it until then (is this machine's clock right?)"
            ));
        } else if until.timestamp() - now_s < EXPIRY_NOTICE_S {
            let left_s = until.timestamp() - now_s;
            let left = if left_s < 2 * 86_400 {
                format!("in {} hours", left_s / 3_600)
            } else {
                format!("in {} days", left_s / 86_400)
            };
            out.push(format!(
                "the certificate for \"{subject}\" expires on {until}, {left}"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_S: i64 = 86_400;
    /// 2025-01-01T00:00:00Z.
    const JAN_2025_S: i64 = 1_735_689_600;

    /// A self-signed certificate for "node1.example" valid through 2025.
    fn cert_valid_in_2025() -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(vec!["node1.example".to_string()]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "node1.example");
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 1, 1);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        // A key block in the same file is passed over.
        format!("{}{}", key.serialize_pem(), cert.pem()).into_bytes()
    }

    #[test]
    fn a_certificate_in_its_validity_far_from_its_end_is_fine() {
        assert!(problems(&cert_valid_in_2025(), JAN_2025_S + 100 * DAY_S).is_empty());
    }

    #[test]
    fn expired_not_yet_valid_and_ending_soon_are_each_named() {
        let pem = cert_valid_in_2025();
        let expired = problems(&pem, JAN_2025_S + 400 * DAY_S);
        assert_eq!(expired.len(), 1, "{expired:?}");
        assert!(
            expired[0].contains("expired on") && expired[0].contains("node1.example"),
            "{expired:?}"
        );
        let early = problems(&pem, JAN_2025_S - DAY_S);
        assert!(early[0].contains("not valid before"), "{early:?}");
        let soon = problems(&pem, JAN_2025_S + 355 * DAY_S);
        assert!(soon[0].contains("in 10 days"), "{soon:?}");
        // The last two days are counted in hours, not rounded down to "0 days".
        let hours = problems(&pem, JAN_2025_S + 365 * DAY_S - 13 * 3_600 - 60);
        assert!(hours[0].contains("in 13 hours"), "{hours:?}");
    }

    #[test]
    fn a_file_without_a_certificate_says_nothing() {
        assert!(problems(b"not pem at all", JAN_2025_S).is_empty());
    }
}
