//! Proxy metrics, registered in the node's registry so `/metrics` on the node shows them.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct ProxyMetrics {
    /// Fencing decisions: outcome = forwarded | rejected | passthrough; reason = fast_path,
    /// consensus, or the rejection code.
    pub decisions: IntCounterVec,
    /// End-to-end latency of proxied requests by outcome.
    pub seconds: HistogramVec,
    /// Upstream failures by kind (connect, timeout, other).
    pub upstream_errors: IntCounterVec,
}

impl ProxyMetrics {
    pub fn new(registry: &Registry) -> Self {
        let m = ProxyMetrics {
            decisions: IntCounterVec::new(
                Opts::new(
                    "proxy_fence_decisions_total",
                    "Fencing decisions of the proxy",
                ),
                &["outcome", "reason"],
            )
            .unwrap_or_else(|e| panic!("metric: {e}")),
            seconds: HistogramVec::new(
                HistogramOpts::new("proxy_request_seconds", "Proxied request latency").buckets(
                    vec![
                        0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064,
                        0.128, 0.256, 0.512, 1.024, 2.048,
                    ],
                ),
                &["outcome"],
            )
            .unwrap_or_else(|e| panic!("metric: {e}")),
            upstream_errors: IntCounterVec::new(
                Opts::new(
                    "proxy_upstream_errors_total",
                    "Failures talking to the upstream",
                ),
                &["kind"],
            )
            .unwrap_or_else(|e| panic!("metric: {e}")),
        };
        // Every fixed combination starts at 0, so the first rejection shows as an increase
        // (a series that appears with its first count reads to rate() as no change).
        let decisions: [(&str, &[&str]); 3] = [
            ("forwarded", &["fast_path", "consensus"]),
            (
                "rejected",
                &[
                    "fencing_token_required",
                    "stale_fencing_token",
                    "unknown_fencing_token",
                    "no_quorum",
                ],
            ),
            ("passthrough", &["unprotected_method"]),
        ];
        for (outcome, reasons) in decisions {
            for reason in reasons {
                m.decisions.with_label_values(&[outcome, reason]);
            }
        }
        for kind in ["connect", "timeout", "other"] {
            m.upstream_errors.with_label_values(&[kind]);
        }
        // Registering twice (a second proxy in one process) is harmless: keep the first.
        let _ = registry.register(Box::new(m.decisions.clone()));
        let _ = registry.register(Box::new(m.seconds.clone()));
        let _ = registry.register(Box::new(m.upstream_errors.clone()));
        m
    }
}
