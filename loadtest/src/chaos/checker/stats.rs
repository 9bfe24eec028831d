//! The operation counts of the verdict.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::Model;
use crate::chaos::history::{EventType, WriteCall};

/// Counts for the verdict: operations by function and outcome, and what the clients saw.
pub fn stats(m: &Model) -> Value {
    let mut ops: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    let mut writes: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for o in &m.ops {
        let kind = match o.kind {
            EventType::Ok => "ok",
            EventType::Fail => "fail",
            _ => "info",
        };
        let e = ops.entry(o.f.as_str()).or_default();
        *e.entry("invoked").or_default() += 1;
        *e.entry(kind).or_default() += 1;
        if o.f == "write" {
            let role = o.request::<WriteCall>().map(|w| w.role).unwrap_or_default();
            *writes
                .entry(role.as_str())
                .or_default()
                .entry(kind)
                .or_default() += 1;
        }
    }
    let client_ops: u64 = m
        .ops
        .iter()
        .filter(|o| matches!(o.f.as_str(), "acquire" | "renew" | "release" | "write"))
        .count() as u64;
    json!({
        "client_operations": client_ops,
        "by_function": ops,
        "writes_by_role": writes,
        "leases_granted": m.leases.len(),
        "store_log_entries": m.store_log.as_ref().map(Vec::len),
        "max_forward_clock_offset_ms": m.max_forward_offset_ms,
    })
}
