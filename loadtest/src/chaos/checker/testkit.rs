//! Hand-written histories for the checks' tests: each check must be able to fail, so each
//! test plants one violation.

use lock_core::wire::LeaseId;
use serde_json::{json, Value};

use super::{model, Model};
use crate::chaos::history::{Event, EventType};

/// Lease `n`'s id as the wire shows it.
pub fn lease(n: u128) -> String {
    LeaseId(n).to_string()
}

pub struct TestHistory {
    events: Vec<Event>,
    op: u64,
}

impl TestHistory {
    pub fn new() -> Self {
        TestHistory {
            events: Vec::new(),
            op: 0,
        }
    }

    fn push(&mut self, t: f64, process: &str, kind: EventType, f: &str, op: u64, value: Value) {
        self.events.push(Event {
            index: self.events.len() as u64,
            time_ms: t,
            mono_ms: t,
            process: process.into(),
            kind,
            f: f.into(),
            op,
            node: Some(1),
            value,
        });
    }

    /// An operation invoked at wall ms `t0` with `req` and completed at `t1` with `resp`.
    #[allow(clippy::too_many_arguments)]
    pub fn op(
        &mut self,
        t0: f64,
        t1: f64,
        p: &str,
        f: &str,
        kind: EventType,
        req: Value,
        resp: Value,
    ) {
        self.op += 1;
        let op = self.op;
        self.push(t0, p, EventType::Invoke, f, op, req);
        self.push(t1, p, kind, f, op, resp);
    }

    /// A granted acquire: lease `lease_n` with `token`, granted at log time `granted`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire(
        &mut self,
        t0: f64,
        t1: f64,
        p: &str,
        res: &str,
        rid: &str,
        lease_n: u128,
        token: u64,
        granted: u64,
        ttl: u64,
    ) {
        self.op(
            t0,
            t1,
            p,
            "acquire",
            EventType::Ok,
            json!({ "resource": res, "request_id": rid, "ttl_ms": ttl }),
            json!({ "resource": res, "lease_id": lease(lease_n), "fencing_token": token, "ttl_ms": ttl, "expires_at_ms": granted + ttl }),
        );
    }

    /// A renew of lease `lease_n`: answered `(token, ttl, expires)` when `Ok`, `lease_lost`
    /// when `Fail`.
    #[allow(clippy::too_many_arguments)]
    pub fn renew(
        &mut self,
        t0: f64,
        t1: f64,
        p: &str,
        kind: EventType,
        res: &str,
        lease_n: u128,
        answer: Option<(u64, u64, u64)>,
    ) {
        let resp = match answer {
            Some((token, ttl, expires)) => json!({
                "lease_id": lease(lease_n), "fencing_token": token, "ttl_ms": ttl, "expires_at_ms": expires,
            }),
            None => json!({ "status": 409, "error": "lease_lost" }),
        };
        let req = json!({ "resource": res, "lease_id": lease(lease_n) });
        self.op(t0, t1, p, "renew", kind, req, resp);
    }

    /// A write of `value` with `token` to `key`: acknowledged when `Ok`, refused when `Fail`.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        t0: f64,
        t1: f64,
        p: &str,
        kind: EventType,
        key: &str,
        token: u64,
        value: &str,
    ) {
        let req =
            json!({ "resource": format!("kv:{key}"), "key": key, "value": value, "token": token });
        let resp = match kind {
            EventType::Ok => json!({ "seq": 1 }),
            _ => json!({ "status": 412, "error": "stale_fencing_token" }),
        };
        self.op(t0, t1, p, "write", kind, req, resp);
    }

    /// The history as recorded so far, with nothing read at its end.
    pub fn unfinished(self) -> Model {
        model(&self.events)
    }

    /// The history of a run ended early (nothing read at its end), as the checks see it.
    pub fn cut_short(self) -> Model {
        let mut m = self.unfinished();
        m.cut_short = true;
        m
    }

    /// The history with the store's final log, as the checks see it.
    pub fn finish(mut self, store: Value) -> Model {
        self.op(
            9e12,
            9e12,
            "final",
            "store_log",
            EventType::Ok,
            json!({ "url": "http://store/log" }),
            store,
        );
        model(&self.events)
    }
}
