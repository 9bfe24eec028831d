//! Tenants from API keys through the proxy: a real 3-node cluster that requires keys
//! (`auth = "on"`), one proxy per node with the `fencegate dev` routes, the demo store behind
//! them (see `common/`). With keys on, the routes take the tenant from the request's key.
//!
//! Checked: a key of tenant A can neither replay nor collide with tenant B's
//! `Idempotency-Key` records (at most one effect per tenant, route and key — per *real*
//! tenant), spend B's quota, nor write with a fencing token issued in B's namespace; a
//! request without a valid key is refused (401) and a tenant header that names another tenant
//! than the key is refused (403), counted and audited.

mod common;

use common::{eventually, phase, FenceHarness, Reply, Write, EVENT};
use lock_core::wire::{AuditTail, CreateKeyRequest, CreatedKey, KeyRole, LimitedLogEntry};
use reqwest::Method;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "tenants-test-admin-token-0123456789";

/// A client of one tenant: its API key, for the lock API and the proxies.
struct Tenant {
    name: String,
    key: String,
}

impl Tenant {
    /// Creates a client key for `name` and waits until every node's copy of the key table
    /// has it (a key is checked on the node that receives the request).
    async fn create(h: &FenceHarness, name: &str) -> Tenant {
        let (status, body) = h
            .cluster
            .post(
                h.cluster.running()[0],
                "/v1/admin/keys",
                CreateKeyRequest {
                    tenant: name.to_string(),
                    role: KeyRole::Client,
                    label: None,
                },
            )
            .await;
        assert_eq!(status, 200, "create key for {name}: {body}");
        let created: CreatedKey = serde_json::from_value(body).expect("a created key");
        let tenant = Tenant {
            name: name.to_string(),
            key: created.key,
        };
        for id in h.cluster.running() {
            eventually(
                EVENT,
                &format!("node {id} knows {name}'s key"),
                async || tenant.call(h, id, Method::GET, "/v1/cluster", None).await.0 == 200,
            )
            .await;
        }
        tenant
    }

    /// A lock API call with this tenant's key.
    async fn call(
        &self,
        h: &FenceHarness,
        node: u64,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = reqwest::Client::new()
            .request(method, h.cluster.url(node, path))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("lock API call");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Acquires `resource` in this tenant's namespace; returns its fencing token and lease id.
    async fn acquire(&self, h: &FenceHarness, resource: &str) -> (u64, String) {
        let (status, body) = self
            .call(
                h,
                h.cluster.running()[0],
                Method::POST,
                &format!("/v1/locks/{resource}/acquire"),
                Some(
                    json!({ "request_id": format!("{}-{resource}", self.name), "ttl_ms": 30_000 }),
                ),
            )
            .await;
        assert_eq!(status, 200, "{} acquires {resource}: {body}", self.name);
        (
            body["fencing_token"].as_u64().expect("fencing_token"),
            body["lease_id"].as_str().expect("lease_id").to_string(),
        )
    }

    /// `w` with this tenant's key.
    fn sign(&self, w: Write) -> Write {
        w.header("authorization", format!("Bearer {}", self.key))
    }
}

/// `POST /orders` with an `Idempotency-Key`.
fn order(key: &str, item: &str) -> Write {
    Write::new(
        Method::POST,
        "/orders",
        &json!({ "item": item }).to_string(),
    )
    .header("content-type", "application/json")
    .header("idempotency-key", key)
}

/// A 401 `unauthenticated` or 403 `forbidden` with the usual error body.
#[track_caller]
fn assert_refused(r: &Reply, status: u16, code: &str) {
    assert_eq!((r.status, r.code()), (status, code), "{}", r.body);
    assert!(
        r.body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        r.body
    );
}

/// The sum of a counter's samples on every node whose labels contain all of `labels`.
async fn counted(h: &FenceHarness, name: &str, labels: &[&str]) -> u64 {
    let mut sum = 0;
    for id in h.cluster.running() {
        let (_, page) = h.cluster.get(id, "/metrics").await;
        for line in page.as_str().unwrap_or_default().lines() {
            let Some(rest) = line.strip_prefix(&format!("fencegate_{name}{{")) else {
                continue;
            };
            if labels.iter().all(|l| rest.contains(l)) {
                let value = rest.rsplit(' ').next().unwrap_or("0");
                sum += value.parse::<f64>().unwrap_or(0.0) as u64;
            }
        }
    }
    sum
}

/// Tenant A's key cannot replay, collide with or overwrite tenant B's record of the same
/// `Idempotency-Key`; the store gets the key's tenant, never the client's claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_records_belong_to_the_keys_tenant() {
    let h = FenceHarness::start_with_auth(ADMIN_TOKEN, |_| {}).await;
    h.leader().await;
    let acme = Tenant::create(&h, "acme").await;
    let bolt = Tenant::create(&h, "bolt").await;

    phase("acme creates an order with key k-1; the store is told the tenant is acme");
    let first = h.client.send(1, &acme.sign(order("k-1", "anvil"))).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.body["tenant"], "acme", "{}", first.body);

    phase("bolt uses the same key with another payload: its own record, not a mismatch");
    let other = h
        .client
        .send(2, &bolt.sign(order("k-1", "bolt-cutter")))
        .await;
    assert_eq!(other.status, 201, "{}", other.body);
    assert_eq!(other.body["tenant"], "bolt", "{}", other.body);
    assert_ne!(other.body["id"], first.body["id"]);

    phase("bolt with acme's payload does not get acme's order replayed");
    let same = h.client.send(3, &bolt.sign(order("k-1", "anvil"))).await;
    assert_eq!(
        (same.status, same.code()),
        (422, "idempotency_key_mismatch"),
        "bolt's k-1 is bolt's own record (bolt-cutter): {}",
        same.body
    );

    phase("acme's retry replays acme's order");
    let retry = h.client.send(3, &acme.sign(order("k-1", "anvil"))).await;
    assert_eq!((retry.status, &retry.body["id"]), (201, &first.body["id"]));

    phase("acme naming bolt in X-Tenant is refused, and reaches neither record nor store");
    let spoof = acme
        .sign(order("k-1", "bolt-cutter"))
        .header("X-Tenant", "bolt");
    assert_refused(&h.client.send(1, &spoof).await, 403, "forbidden");
    let spoof_new = acme.sign(order("k-2", "x")).header("X-Tenant", "bolt");
    assert_refused(&h.client.send(1, &spoof_new).await, 403, "forbidden");
    // Naming its own tenant is allowed.
    let own = acme.sign(order("k-1", "anvil")).header("X-Tenant", "acme");
    let own = h.client.send(2, &own).await;
    assert_eq!((own.status, &own.body["id"]), (201, &first.body["id"]));

    phase("without a key, or with a key that is not one, nothing is forwarded (401)");
    assert_refused(
        &h.client.send(1, &order("k-3", "x")).await,
        401,
        "unauthenticated",
    );
    let forged = order("k-3", "x").header(
        "authorization",
        "Bearer fgk_00000000deadbeef_0123456789abcdef",
    );
    assert_refused(&h.client.send(1, &forged).await, 401, "unauthenticated");
    let revoked_shape = order("k-3", "x").header("authorization", "Bearer not-a-key");
    assert_refused(
        &h.client.send(2, &revoked_shape).await,
        401,
        "unauthenticated",
    );

    phase("the store created exactly the two tenants' orders");
    let orders: Vec<(String, String)> = h
        .client
        .store_log()
        .await
        .into_iter()
        .filter(|w| w.key.starts_with("order:"))
        .map(|w| (w.key, w.value))
        .collect();
    assert_eq!(orders.len(), 2, "{orders:?}");

    phase("refusals are counted by reason and audited with the key's id, never the key");
    assert!(counted(&h, "auth_denied_total", &["reason=\"tenant\""]).await >= 2);
    assert!(counted(&h, "auth_denied_total", &["reason=\"missing\""]).await >= 1);
    assert!(counted(&h, "auth_denied_total", &["reason=\"invalid\""]).await >= 2);
    let (status, audit) = h
        .cluster
        .get(1, "/v1/admin/audit?outcome=tenant&limit=100")
        .await;
    assert_eq!(status, 200, "{audit}");
    let audit: AuditTail = serde_json::from_value(audit).expect("audit tail");
    let acme_id = acme.key.split('_').nth(1).expect("key id");
    let line = audit
        .entries
        .iter()
        .find(|e| e.op == "denied")
        .expect("an audited tenant refusal on node 1");
    assert_eq!(
        line.caller.as_deref(),
        Some(format!("key:{acme_id}").as_str())
    );
    assert!(
        line.detail
            .as_deref()
            .is_some_and(|d| d.contains("/orders")),
        "{line:?}"
    );
    let (_, everything) = h.cluster.get(1, "/v1/admin/audit?limit=1000").await;
    assert!(
        !everything.to_string().contains(&acme.key),
        "a key reached the audit log"
    );
    h.shutdown().await;
}

/// A client of one tenant spends only its own tenant's quota bucket, whatever tenant header it
/// sends: every decision the limiter takes is counted under the key's tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_is_spent_from_the_keys_tenant() {
    let h = FenceHarness::start_with_auth(ADMIN_TOKEN, |_| {}).await;
    h.leader().await;
    let acme = Tenant::create(&h, "acme").await;
    let bolt = Tenant::create(&h, "bolt").await;
    let limited = |t: &Tenant| t.sign(Write::new(Method::GET, "/limited/a", ""));

    phase("bolt's requests are admitted once its bucket has a share");
    let mut bolt_sent = 0;
    eventually(EVENT, "a request of bolt admitted", async || {
        bolt_sent += 1;
        h.client.send(1, &limited(&bolt)).await.status == 200
    })
    .await;

    phase("acme's requests, with and without a tenant header naming bolt");
    let mut acme_sent = 0;
    eventually(EVENT, "a request of acme admitted", async || {
        acme_sent += 1;
        h.client.send(1, &limited(&acme)).await.status == 200
    })
    .await;
    for _ in 0..5 {
        let spoof = limited(&acme).header("X-Tenant", "bolt");
        assert_refused(&h.client.send(1, &spoof).await, 403, "forbidden");
    }
    let unkeyed = Write::new(Method::GET, "/limited/a", "").header("X-Tenant", "bolt");
    assert_refused(&h.client.send(1, &unkeyed).await, 401, "unauthenticated");

    phase("every decision on bolt's bucket was one of bolt's own requests");
    let decisions = |tenant: &'static str| {
        let h = &h;
        async move {
            let label = format!("tenant=\"{tenant}\"");
            counted(h, "proxy_quota_requests_total", &[&label]).await
        }
    };
    assert_eq!(decisions("bolt").await, bolt_sent);
    assert_eq!(decisions("acme").await, acme_sent);
    assert_eq!(
        decisions("demo").await,
        0,
        "no request fell to the header default"
    );

    phase("the store saw each admitted request with its key's tenant");
    let resp = reqwest::get(format!("http://{}/limited-log", h.client.store_addr))
        .await
        .expect("limited log");
    let entries: Vec<LimitedLogEntry> = resp.json().await.expect("limited log JSON");
    assert!(!entries.is_empty());
    for e in &entries {
        assert!(
            matches!(e.tenant.as_deref(), Some("acme" | "bolt")),
            "the store saw tenant {:?}",
            e.tenant
        );
    }
    h.shutdown().await;
}

/// A fencing token issued in tenant A's namespace admits A's writes to the path it guards,
/// and no other tenant's write to the same path; the default tenant's tokens admit no
/// tenant's writes either. Two tenants' locks of one name guard two copies of the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fence_token_admits_only_its_tenants_writes() {
    let h = FenceHarness::start_with_auth(ADMIN_TOKEN, |_| {}).await;
    h.leader().await;
    let acme = Tenant::create(&h, "acme").await;
    let bolt = Tenant::create(&h, "bolt").await;

    phase("acme takes kv:x in its namespace and writes /kv/x with its token");
    let (acme_token, acme_lease) = acme.acquire(&h, "kv:x").await;
    let r = h
        .client
        .send(1, &acme.sign(Write::put("x", acme_token, "acme-1")))
        .await;
    assert_eq!(r.status, 200, "acme's own write: {}", r.body);

    phase("bolt presents acme's token for the same path: refused on every proxy");
    for id in h.proxy_ids() {
        let w = bolt.sign(Write::put("x", acme_token, "bolt-with-acme-token"));
        let r = h.client.send(id, &w).await;
        assert_eq!(
            (r.status, r.code()),
            (412, "unknown_fencing_token"),
            "via proxy {id}: {}",
            r.body
        );
    }

    phase("bolt claiming to be acme in X-Tenant is refused before any fence check");
    let spoof = bolt
        .sign(Write::put("x", acme_token, "bolt-as-acme"))
        .header("X-Tenant", "acme");
    assert_refused(&h.client.send(2, &spoof).await, 403, "forbidden");

    phase("a default-tenant token (the bootstrap admin's) admits no tenant's write");
    let default_lease = h.acquire("kv:y", "admin-y", 30_000, 0).await;
    let r = h
        .client
        .send(
            3,
            &bolt.sign(Write::put("y", default_lease.token, "bolt-y")),
        )
        .await;
    assert_eq!(
        (r.status, r.code()),
        (412, "unknown_fencing_token"),
        "{}",
        r.body
    );

    phase("bolt's own lock of kv:x admits bolt's writes, to bolt's copy of x");
    let (bolt_token, _) = bolt.acquire(&h, "kv:x").await;
    assert!(bolt_token > acme_token, "tokens stay one global counter");
    let r = h
        .client
        .send(2, &bolt.sign(Write::put("x", bolt_token, "bolt-1")))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = h
        .client
        .send(3, &acme.sign(Write::put("x", acme_token, "acme-2")))
        .await;
    assert_eq!(
        r.status, 200,
        "acme's lock still guards acme's x: {}",
        r.body
    );

    phase("acme releases: every proxy refuses acme's token at once, bolt's still writes");
    let (status, body) = acme
        .call(
            &h,
            h.cluster.running()[0],
            Method::POST,
            "/v1/locks/kv:x/release",
            Some(json!({ "lease_id": acme_lease })),
        )
        .await;
    assert_eq!((status, &body["released"]), (200, &json!(true)), "{body}");
    for id in h.proxy_ids() {
        let r = h
            .client
            .send(id, &acme.sign(Write::put("x", acme_token, "acme-late")))
            .await;
        assert_eq!(
            (r.status, r.code()),
            (412, "stale_fencing_token"),
            "via proxy {id}: {}",
            r.body
        );
    }
    let r = h
        .client
        .send(1, &bolt.sign(Write::put("x", bolt_token, "bolt-2")))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    phase("the store got exactly the admitted writes, each in its tenant's copy");
    let landed: Vec<(String, Option<u64>, String)> = h
        .client
        .store_log()
        .await
        .into_iter()
        .map(|w| (w.key, w.fence_token, w.value))
        .collect();
    assert_eq!(
        landed,
        vec![
            ("acme#x".to_string(), Some(acme_token), "acme-1".to_string()),
            ("bolt#x".to_string(), Some(bolt_token), "bolt-1".to_string()),
            ("acme#x".to_string(), Some(acme_token), "acme-2".to_string()),
            ("bolt#x".to_string(), Some(bolt_token), "bolt-2".to_string()),
        ]
    );
    h.shutdown().await;
}

/// A route that says `tenant = "header"` keeps the client's tenant header on a node with keys
/// on: no key is asked for, and its records are the header's tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_route_may_keep_the_header_explicitly() {
    let h = FenceHarness::start_with_auth(ADMIN_TOKEN, |c| {
        for r in &mut c.routes {
            if r.path == "/orders" {
                r.tenant = Some(fencegate_proxy::tenant::TenantSource::Header);
            }
        }
    })
    .await;
    h.leader().await;
    phase("/orders takes X-Tenant without a key; /kv still needs one");
    let r = h
        .client
        .send(1, &order("k-1", "anvil").header("X-Tenant", "zeta"))
        .await;
    assert_eq!(
        (r.status, &r.body["tenant"]),
        (201, &json!("zeta")),
        "{}",
        r.body
    );
    let r = h.client.send(1, &Write::put("x", 1, "v")).await;
    assert_refused(&r, 401, "unauthenticated");
    h.shutdown().await;
}

/// A store with credentials of its own (an S3 signature, a password in `Authorization`): the
/// client sends its API key to the proxy in `Fencegate-Key` instead, and the store receives
/// `Authorization` as the client sent it, and never the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_in_fencegate_key_leaves_authorization_to_the_store() {
    let (upstream, heads) = common::recording_upstream().await;
    let h = FenceHarness::start_with_auth(ADMIN_TOKEN, |c| {
        c.routes.push(fencegate_proxy::route::RouteConfig::new(
            "/signed/{key}",
            "signed:{key}",
            &upstream,
        ));
    })
    .await;
    h.leader().await;
    let acme = Tenant::create(&h, "acme").await;
    let (token, _) = acme.acquire(&h, "signed:a").await;
    let store_credential = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261207/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=abc123";
    let write = |key: &str| {
        Write::new(Method::PUT, "/signed/a", "v")
            .header("fence-token", token.to_string())
            .header("authorization", store_credential)
            .header("fencegate-key", key)
    };

    phase("the key in Fencegate-Key: admitted; the store gets its own Authorization only");
    let r = h.client.send(1, &write(&acme.key)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = h
        .client
        .send(2, &write(&format!("Bearer {}", acme.key)))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = heads.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for head in &seen {
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains(&format!(
                "authorization: {}",
                store_credential.to_ascii_lowercase()
            )),
            "{head}"
        );
        assert!(!lower.contains("fencegate-key"), "{head}");
        assert!(
            !head.contains(&acme.key),
            "the API key reached the store: {head}"
        );
        assert!(lower.contains("x-tenant: acme"), "{head}");
    }

    phase("a wrong key in Fencegate-Key is refused, whatever Authorization says");
    assert_refused(
        &h.client.send(3, &write("fgk_not_a_key")).await,
        401,
        "unauthenticated",
    );
    assert_eq!(
        heads.lock().unwrap().len(),
        2,
        "a refused write reached the store"
    );
    h.shutdown().await;
}
