//! What a web page can make a browser do to a node: nothing that changes state from another
//! origin; refused operator calls recorded at a bounded pace under the name of nobody; the
//! operator page and the admin API answered with headers that keep them unframed and uncached.

use std::collections::BTreeMap;
use std::time::Duration;

use lock_core::testkit::{phase, TestCluster};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_other_origins_change_nothing_and_refusals_are_paced() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let http = reqwest::Client::new();
    let acquire = c.url(leader, "/v1/locks/csrf/acquire");

    phase("a cross-site POST (a form, a no-cors fetch) is refused and takes no lock");
    for (name, value) in [
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
        ("origin", "http://evil.example:8080"),
        ("origin", "null"),
    ] {
        let r = http
            .post(&acquire)
            .header(name, value)
            .header("content-type", "text/plain")
            .body(r#"{"request_id":"csrf-1","holder":"evil-page"}"#)
            .send()
            .await
            .expect("POST");
        assert_eq!(r.status().as_u16(), 403, "{name}: {value}");
        let body: Value = r.json().await.expect("JSON error");
        assert_eq!(body["error"], "forbidden", "{body}");
    }
    let (_, view) = c.get(leader, "/v1/locks/csrf").await;
    assert_eq!(view["held"], false, "{view}");

    phase("the node's own page (same origin) and programs without Origin are served");
    let own = c.url(leader, "");
    let r = http
        .post(&acquire)
        .header("origin", own.as_str())
        .json(&json!({"request_id": "own-1"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 200);
    let r = http
        .post(c.url(leader, "/v1/locks/csrf2/acquire"))
        .header("sec-fetch-site", "same-origin")
        .json(&json!({"request_id": "own-2"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 200);

    phase("refused operator calls: the claimed name is unverified, 20 a second recorded at most");
    for _ in 0..200 {
        let r = http
            .post(c.url(leader, "/v1/admin/snapshot"))
            .json(&json!({"operator": "alice"}))
            .send()
            .await
            .expect("POST");
        assert_eq!(r.status().as_u16(), 401);
    }
    let (status, audit) = c
        .get(leader, "/v1/admin/audit?outcome=unauthorized&limit=1000")
        .await;
    assert_eq!(status, 200, "{audit}");
    let entries = audit["entries"].as_array().expect("entries");
    assert!(!entries.is_empty());
    let mut per_second: BTreeMap<u64, usize> = BTreeMap::new();
    for e in entries {
        assert_eq!(e["caller"], "unverified", "{e}");
        let detail = e["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("claimed operator: alice"), "{e}");
        *per_second
            .entry(e["time_ms"].as_u64().expect("time") / 1_000)
            .or_default() += 1;
    }
    assert!(per_second.values().all(|n| *n <= 20), "{per_second:?}");

    phase("a quota change names the quota in its audit line");
    let token = c.admin_token.clone().expect("an admin token");
    let r = http
        .put(c.url(leader, "/v1/admin/quotas/orders"))
        .bearer_auth(&token)
        .json(&json!({"operator": "ops", "rate_per_s": 5, "burst": 5, "lease_ms": 1000}))
        .send()
        .await
        .expect("PUT");
    assert_eq!(r.status().as_u16(), 200);
    let (_, audit) = c.get(leader, "/v1/admin/audit?caller=operator:ops").await;
    let line = &audit["entries"][0];
    assert_eq!(line["op"], "set_quota", "{audit}");
    assert!(
        line["detail"]
            .as_str()
            .is_some_and(|d| d.contains("quota=\"orders\"")),
        "{line}"
    );

    phase("the operator page cannot be framed; admin answers are cached nowhere");
    let page = http
        .get(c.url(leader, "/ui"))
        .send()
        .await
        .expect("GET /ui");
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .expect("ascii");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    let admin = http
        .get(c.url(leader, "/v1/admin/overview"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("GET overview");
    assert_eq!(admin.headers()["cache-control"], "no-store");
    c.shutdown().await;
}
