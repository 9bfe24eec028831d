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

use anyhow::Context;
use serde::de::DeserializeOwned;
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

/// A recorded value read as `T`, if it is one.
pub fn value_as<T: DeserializeOwned>(value: &Value) -> Option<T> {
    T::deserialize(value).ok()
}

// ---- what the clients record --------------------------------------------------------------

/// The invocation of a lock call: the resource and the request body as sent.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LockCall<B> {
    pub resource: String,
    #[serde(flatten)]
    pub body: B,
}

/// Why a protected write was sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteRole {
    /// By a holder, within its lease by its own clock.
    #[default]
    Normal,
    /// By a holder that stalled past its lease: late.
    Zombie,
    /// With a token that was issued for another resource.
    Foreign,
    /// By a holder right after its release was acknowledged: must never land.
    #[serde(rename = "after_release")]
    AfterRelease,
}

impl WriteRole {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteRole::Normal => "normal",
            WriteRole::Zombie => "zombie",
            WriteRole::Foreign => "foreign",
            WriteRole::AfterRelease => "after_release",
        }
    }
}

/// The invocation of a protected write through a fencing proxy.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WriteCall {
    pub resource: String,
    pub key: String,
    pub token: u64,
    /// Unique per write (see [`written_value`]).
    pub value: String,
    #[serde(default)]
    pub role: WriteRole,
}

/// The invocation of an idempotent create-order (`POST /orders` through a fencing proxy).
/// Every attempt of one logical order carries the same tenant, key and body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OrderCall {
    pub tenant: String,
    pub key: String,
    pub body: String,
    /// The demo store holds its answer back this long after creating the order (past the
    /// proxy's upstream timeout, the answer is lost after the effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_delay_ms: Option<u64>,
    /// Sent alongside other attempts of the same order (a client racing itself).
    #[serde(default)]
    pub concurrent: bool,
}

/// The invocation of a read: `{"resource": …}`, `{"key": …}` or `{"url": …}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadCall {
    /// `GET /v1/locks/{resource}` on a node.
    Resource(String),
    /// `GET /kv/{key}` on the store.
    Key(String),
    /// Any other GET (the final cluster views, the store's log).
    Url(String),
}

/// The invocation of a request on the rate-limited route `/limited/{key}` through a fencing
/// proxy (history function `limited`). The key is unique per request, so the store's record
/// of it (`GET /limited-log`) can be traced back to this invocation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LimitedCall {
    pub key: String,
    pub tenant: String,
}

/// The quota the run's proxies enforce on `/limited/{key}` (history note `quota` of process
/// `harness`): what the quota check judges the store's record against.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QuotaNote {
    pub rate_per_s: u64,
    pub burst: u64,
    /// The emergency allowance per proxy (0 under `strict`).
    pub allowance: u64,
    pub proxies: u64,
    pub lease_ms: u64,
    pub unsafe_refill_on_renew: bool,
}

/// The value of a `fail` or `info` completion: why, and the answer if one came.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trouble {
    /// The answer's error code (`lock_core::wire::ErrorCode`), or one of the client's own:
    /// [`Trouble::CONNECT`], [`Trouble::TIMEOUT`], [`Trouble::TRANSPORT`],
    /// [`Trouble::ABANDONED`], [`Trouble::RESPONSE_DROPPED`].
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How long after sending an abandoned request was given up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_ms: Option<u64>,
    /// The answer's body: for `response_dropped`, the answer the client threw away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
}

impl Trouble {
    /// No connection could be made: nothing was sent.
    pub const CONNECT: &'static str = "connect";
    pub const TIMEOUT: &'static str = "timeout";
    pub const TRANSPORT: &'static str = "transport";
    /// The client hung up while the server may still have been deciding.
    pub const ABANDONED: &'static str = "abandoned";
    /// The answer came and was thrown away (the drop-responses nemesis).
    pub const RESPONSE_DROPPED: &'static str = "response_dropped";

    pub fn new(error: impl Into<String>) -> Self {
        Trouble {
            error: error.into(),
            status: None,
            message: None,
            after_ms: None,
            body: None,
        }
    }
}

/// What the checker reads of a nemesis note: the kind of fault a `start` note begins, and the
/// clock offset a note sets.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct FaultNote {
    pub kind: Option<String>,
    pub offset_ms: Option<i64>,
}

/// The value a client writes: unique, and naming the token it was written with, so that a
/// store entry can be traced back to its write: `w3:t41:n7`.
pub fn written_value(process: &str, token: u64, seq: u64) -> String {
    format!("{process}:t{token}:n{seq}")
}

/// The token in a value made by [`written_value`]: `w3:t41:n7` → 41.
pub fn token_in_value(value: &str) -> Option<u64> {
    value
        .split(':')
        .find_map(|p| p.strip_prefix('t'))
        .and_then(|t| t.parse().ok())
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
            Some(p) => Some(BufWriter::new(
                File::create(p).with_context(|| format!("create {}", p.display()))?,
            )),
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
            // Best effort: the in-memory history is what the checker reads. One whole line
            // per write: the buffer then only ever flushes whole lines, so a run that is
            // interrupted (and flushes on the way out) leaves no line cut in two.
            if let Ok(mut line) = serde_json::to_vec(&event) {
                line.push(b'\n');
                let _ = file.write_all(&line);
            }
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
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
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
