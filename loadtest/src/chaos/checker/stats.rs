//! The operation counts of the verdict.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Model;
use crate::chaos::history::{EventType, WriteCall, WriteRole};

/// Outcome counts (`invoked`, `ok`, `fail`, `info`) by name.
pub type Counts = BTreeMap<String, BTreeMap<&'static str, u64>>;

/// What the clients did and saw.
#[derive(Clone, Debug, Serialize)]
pub struct Operations {
    /// Lock calls, writes and orders, retries included.
    pub client_operations: u64,
    pub by_function: Counts,
    pub writes_by_role: Counts,
    pub leases_granted: usize,
    pub store_log_entries: Option<usize>,
    pub max_forward_clock_offset_ms: f64,
}

impl Operations {
    /// Whether any client call succeeded: a lock call, a write, an order or a request on the
    /// rate-limited route.
    pub fn measured_anything(&self) -> bool {
        CLIENT_FUNCTIONS.iter().any(|f| {
            self.by_function
                .get(*f)
                .and_then(|c| c.get("ok"))
                .is_some_and(|n| *n > 0)
        })
    }
}

/// The history functions of the clients (the rest are the harness's reads and notes).
const CLIENT_FUNCTIONS: [&str; 6] = ["acquire", "renew", "release", "write", "order", "limited"];

/// Counts for the verdict: operations by function and outcome, and what the clients saw.
pub fn stats(m: &Model) -> Operations {
    let mut by_function = Counts::new();
    let mut writes_by_role = Counts::new();
    for o in &m.ops {
        let kind = match o.kind {
            EventType::Ok => "ok",
            EventType::Fail => "fail",
            _ => "info",
        };
        let e = by_function.entry(o.f.clone()).or_default();
        *e.entry("invoked").or_default() += 1;
        *e.entry(kind).or_default() += 1;
        if o.f == "write" {
            let role: WriteRole = o.request::<WriteCall>().map(|w| w.role).unwrap_or_default();
            *writes_by_role
                .entry(role.as_str().to_string())
                .or_default()
                .entry(kind)
                .or_default() += 1;
        }
    }
    let client_operations = m
        .ops
        .iter()
        .filter(|o| {
            matches!(
                o.f.as_str(),
                "acquire" | "renew" | "release" | "write" | "order"
            )
        })
        .count() as u64;
    Operations {
        client_operations,
        by_function,
        writes_by_role,
        leases_granted: m.leases.len(),
        store_log_entries: m.store_log.as_ref().map(Vec::len),
        max_forward_clock_offset_ms: m.max_forward_offset_ms,
    }
}
