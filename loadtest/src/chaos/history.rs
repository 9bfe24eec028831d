//! The history: every invocation and every completion, in the order the harness saw them.
//!
//! One JSON object per line (`history.jsonl`), Jepsen-style: an `invoke` event when a client
//! sends a request, then exactly one `ok` (definitely happened, with the answer), `fail`
//! (definitely did not happen) or `info` (unknown: timed out, connection lost, response
//! dropped) event with the same `op` id. Nemesis actions are `info` events of process
//! `nemesis`. Timestamps are the wall clock in ms since the Unix epoch (the clock the nodes
//! stamp leases with: they run on the same host) and a monotonic offset from the run's start.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    Invoke,
    Ok,
    Fail,
    Info,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history.
    pub index: u64,
    /// Wall clock, ms since the Unix epoch (µs resolution).
    pub time_ms: f64,
    /// ms since the run started (monotonic).
    pub mono_ms: f64,
    /// `w3` (worker), `z1` (zombie), `nemesis`, `final`.
    pub process: String,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// `acquire`, `renew`, `release`, `write`, `read`, `read_kv`, `final_read`, ... or the
    /// nemesis action.
    pub f: String,
    /// Pairs an invocation with its completion.
    pub op: u64,
    /// The node whose API or proxy the request went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    #[serde(default)]
    pub value: Value,
}

/// An invoked, not yet completed operation.
#[derive(Debug)]
pub struct Pending {
    pub op: u64,
    process: String,
    f: String,
    node: Option<u64>,
}

pub struct History {
    start: Instant,
    next_op: AtomicU64,
    inner: Mutex<Inner>,
}

struct Inner {
    events: Vec<Event>,
    file: Option<BufWriter<File>>,
}

pub fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_micros() as f64 / 1000.0)
}

impl History {
    /// A history kept in memory and, with `path`, streamed to that file as it grows (so a
    /// crashed run still leaves its history behind).
    pub fn new(path: Option<&Path>) -> anyhow::Result<Self> {
        let file = match path {
            Some(p) => Some(BufWriter::new(File::create(p)?)),
            None => None,
        };
        Ok(History {
            start: Instant::now(),
            next_op: AtomicU64::new(1),
            inner: Mutex::new(Inner {
                events: Vec::new(),
                file,
            }),
        })
    }

    fn push(
        &self,
        process: &str,
        kind: EventType,
        f: &str,
        op: u64,
        node: Option<u64>,
        value: Value,
    ) {
        let mono_ms = self.start.elapsed().as_micros() as f64 / 1000.0;
        let time_ms = wall_ms();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let event = Event {
            index: inner.events.len() as u64,
            time_ms,
            mono_ms,
            process: process.to_string(),
            kind,
            f: f.to_string(),
            op,
            node,
            value,
        };
        if let Some(file) = inner.file.as_mut() {
            // Best effort: the in-memory history is what the checker reads.
            let _ = serde_json::to_writer(&mut *file, &event).map(|()| file.write_all(b"\n"));
        }
        inner.events.push(event);
    }

    pub fn invoke(&self, process: &str, f: &str, node: Option<u64>, value: Value) -> Pending {
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.push(process, EventType::Invoke, f, op, node, value);
        Pending {
            op,
            process: process.to_string(),
            f: f.to_string(),
            node,
        }
    }

    pub fn complete(&self, p: Pending, kind: EventType, value: Value) {
        debug_assert!(kind != EventType::Invoke);
        self.push(&p.process, kind, &p.f, p.op, p.node, value);
    }

    /// A single event with no completion (nemesis actions, run markers).
    pub fn note(&self, process: &str, f: &str, node: Option<u64>, value: Value) {
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.push(process, EventType::Info, f, op, node, value);
    }

    pub fn flush(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = inner.file.as_mut() {
            let _ = f.flush();
        }
    }

    pub fn events(&self) -> Vec<Event> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events
            .clone()
    }
}

/// Reads a `history.jsonl` written by a run (for `--recheck`).
pub fn load(path: &Path) -> anyhow::Result<Vec<Event>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: Event = serde_json::from_str(line)
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), i + 1))?;
        out.push(e);
    }
    Ok(out)
}
