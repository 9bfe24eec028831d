//! Invariant 7: at most one upstream effect per (tenant, Idempotency-Key).

use std::collections::BTreeMap;

use lock_core::wire::{Order, StoreLogEntry};
use serde_json::{json, Value};

use super::model::Op;
use super::{CheckResult, Model};
use crate::chaos::history::OrderCall;

/// Attempts listed per counter-example (the history has them all).
const MAX_ATTEMPTS_SHOWN: usize = 30;

/// Invariant 7 — the store's log holds (a) at most one order per (tenant, key); (b) only
/// orders some client sent, with the key, tenant and body it sent; and (c) every answer a
/// client got (created, replayed or reconciled) names the one order of its (tenant, key), with
/// its body. A duplicate's counter-example shows the key, the orders it created and every
/// attempt the clients made with it. Counts: orders in the store plus answered attempts.
pub fn check(m: &Model) -> CheckResult {
    let mut r = CheckResult::new(
        7,
        "one_effect_per_key",
        "at most one order per (tenant, Idempotency-Key) reached the store, each sent by a client, and every answer names that order",
    );
    let Some(log) = &m.store_log else {
        if !m.cut_short {
            r.violation(
                json!({ "reason": "the store's log was not recorded at the end of the run" }),
            );
        }
        return r;
    };
    let mut attempts: BTreeMap<(String, String), Vec<(&Op, OrderCall)>> = BTreeMap::new();
    for o in m.ops.iter().filter(|o| o.f == "order") {
        if let Some(call) = o.request::<OrderCall>() {
            attempts
                .entry((call.tenant.clone(), call.key.clone()))
                .or_default()
                .push((o, call));
        }
    }
    let mut orders: BTreeMap<(String, String), Vec<&StoreLogEntry>> = BTreeMap::new();
    for entry in log.iter().filter(|e| e.is_order()) {
        r.count("orders_in_store");
        let (Some(tenant), Some(key)) = (&entry.tenant, &entry.idempotency_key) else {
            r.violation(json!({
                "reason": "an order without an Idempotency-Key reached the store",
                "order": entry,
            }));
            continue;
        };
        orders
            .entry((tenant.clone(), key.clone()))
            .or_default()
            .push(entry);
    }
    for ((tenant, key), created) in &orders {
        let sent = attempts.get(&(tenant.clone(), key.clone()));
        if created.len() > 1 {
            r.violation(json!({
                "reason": "one (tenant, Idempotency-Key) created more than one order",
                "tenant": tenant,
                "key": key,
                "orders": created,
                "attempts": history_of(sent),
            }));
        }
        let Some(sent) = sent else {
            r.violation(json!({
                "reason": "an order no client sent (no attempt with this tenant and key)",
                "tenant": tenant,
                "key": key,
                "orders": created,
            }));
            continue;
        };
        for entry in created {
            if sent.iter().all(|(_, call)| call.body != entry.value) {
                r.violation(json!({
                    "reason": "an order's body differs from what its key's client sent",
                    "order": entry,
                    "attempts": history_of(Some(sent)),
                }));
            }
        }
    }
    for ((tenant, key), sent) in &attempts {
        let created = orders.get(&(tenant.clone(), key.clone()));
        for (o, call) in sent {
            let Some(answer) = o.answer::<Order>() else {
                continue;
            };
            r.count("answered_attempts");
            if let Some(why) = answer_problem(&answer, call, created.map(Vec::as_slice)) {
                r.violation(json!({
                    "reason": why,
                    "tenant": tenant,
                    "key": key,
                    "answer": answer,
                    "attempt": o.brief(),
                    "orders": created,
                }));
            }
        }
    }
    r
}

/// (c): what is wrong with `answer` to `call`, given the orders of its (tenant, key).
fn answer_problem(
    answer: &Order,
    call: &OrderCall,
    created: Option<&[&StoreLogEntry]>,
) -> Option<&'static str> {
    if answer.tenant != call.tenant || answer.idempotency_key.as_deref() != Some(&call.key) {
        return Some("an answer names an order of another tenant or key");
    }
    if answer.body != call.body {
        return Some("an answer's order body differs from what was sent");
    }
    match created {
        None | Some([]) => Some("a client was answered with an order the store does not have"),
        // More than one is reported above, once per key.
        Some([one]) if one.key != format!("order:{}", answer.id) => {
            Some("an answer names another order than the one its key created")
        }
        Some(_) => None,
    }
}

/// The attempts of one (tenant, key), in the order they were sent.
fn history_of(sent: Option<&Vec<(&Op, OrderCall)>>) -> Value {
    let Some(sent) = sent else {
        return json!([]);
    };
    let mut out: Vec<Value> = sent
        .iter()
        .take(MAX_ATTEMPTS_SHOWN)
        .map(|(o, _)| o.brief())
        .collect();
    if sent.len() > MAX_ATTEMPTS_SHOWN {
        out.push(json!({ "more_attempts": sent.len() - MAX_ATTEMPTS_SHOWN }));
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::super::testkit::TestHistory;
    use super::*;
    use crate::chaos::history::EventType;

    fn call(tenant: &str, key: &str) -> Value {
        json!({ "tenant": tenant, "key": key, "body": format!("{tenant}/{key}") })
    }

    fn order(id: u64, tenant: &str, key: &str) -> Value {
        json!({ "id": format!("ord-{id}"), "tenant": tenant, "idempotency_key": key, "body": format!("{tenant}/{key}") })
    }

    /// An attempt sent at `t` and completed 10 ms later.
    fn attempt(h: &mut TestHistory, t: f64, kind: EventType, call: Value, resp: Value) {
        h.op(t, t + 10.0, "o1", "order", kind, call, resp);
    }

    /// An attempt answered with order `id` of its own tenant and key.
    fn answered(h: &mut TestHistory, t: f64, tenant: &str, key: &str, id: u64) {
        attempt(
            h,
            t,
            EventType::Ok,
            call(tenant, key),
            order(id, tenant, key),
        );
    }

    fn entry(seq: u64, tenant: &str, key: &str) -> Value {
        json!({ "seq": seq, "key": format!("order:ord-{seq}"), "fence_token": null,
                "value": format!("{tenant}/{key}"), "idempotency_key": key, "tenant": tenant })
    }

    #[test]
    fn one_order_per_key_with_replays_passes() {
        let mut h = TestHistory::new();
        // A lost answer, then a replay; the same key for another tenant is its own order.
        let lost = json!({ "error": "timeout" });
        attempt(&mut h, 10.0, EventType::Info, call("acme", "k"), lost);
        answered(&mut h, 30.0, "acme", "k", 1);
        answered(&mut h, 50.0, "globex", "k", 2);
        let in_use = json!({ "error": "idempotency_key_in_use", "status": 409 });
        attempt(&mut h, 51.0, EventType::Fail, call("globex", "k"), in_use);
        let r = check(&h.finish(json!([entry(1, "acme", "k"), entry(2, "globex", "k")])));
        assert_eq!(r.violations, 0, "{r:#?}");
        assert_eq!(r.parts.get("orders_in_store"), Some(&2));
        assert_eq!(r.parts.get("answered_attempts"), Some(&2));
    }

    #[test]
    fn a_duplicate_is_caught_with_its_attempts() {
        let mut h = TestHistory::new();
        let lost = json!({ "error": "response_dropped" });
        attempt(&mut h, 10.0, EventType::Info, call("acme", "k"), lost);
        answered(&mut h, 30.0, "acme", "k", 2);
        let r = check(&h.finish(json!([entry(1, "acme", "k"), entry(2, "acme", "k")])));
        assert_eq!(r.violations, 1, "{r:#?}");
        let first = r.first.expect("a counter-example");
        assert_eq!(first["key"], "k");
        assert_eq!(first["orders"].as_array().map(Vec::len), Some(2));
        assert_eq!(first["attempts"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn wrong_answers_and_unsent_orders_are_caught() {
        let mut h = TestHistory::new();
        // Tenant acme's retry answered with globex's order (a lookup that ignored the tenant).
        attempt(
            &mut h,
            10.0,
            EventType::Ok,
            call("acme", "k"),
            order(1, "globex", "k"),
        );
        // An answer naming an order the store never made.
        answered(&mut h, 30.0, "acme", "m", 9);
        let store = json!([entry(1, "globex", "k"), entry(2, "acme", "x")]);
        let r = check(&h.finish(store));
        // globex/k and acme/x unsent; two wrong answers.
        assert_eq!(r.violations, 4, "{r:#?}");
    }
}
