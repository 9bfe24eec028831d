//! What one check reports.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// One invariant's result (in verdict.json under `{invariant}_{name}`).
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub invariant: u8,
    #[serde(skip)]
    pub name: &'static str,
    pub description: &'static str,
    /// How many facts were checked (pairs, log entries, answers — see each check).
    pub checked: u64,
    /// `checked`, by kind of fact.
    #[serde(rename = "checked_by_kind")]
    pub parts: BTreeMap<&'static str, u64>,
    #[serde(rename = "count")]
    pub violations: u64,
    /// The first counter-example found, with the history indices of the events involved.
    pub first: Option<Value>,
    /// Up to ten counter-examples.
    pub examples: Vec<Value>,
}

impl CheckResult {
    pub fn new(invariant: u8, name: &'static str, description: &'static str) -> Self {
        CheckResult {
            invariant,
            name,
            description,
            checked: 0,
            parts: BTreeMap::new(),
            violations: 0,
            first: None,
            examples: Vec::new(),
        }
    }

    pub fn count(&mut self, part: &'static str) {
        self.checked += 1;
        *self.parts.entry(part).or_default() += 1;
    }

    pub fn violation(&mut self, v: Value) {
        self.violations += 1;
        if self.first.is_none() {
            self.first = Some(v.clone());
        }
        if self.examples.len() < 10 {
            self.examples.push(v);
        }
    }
}
