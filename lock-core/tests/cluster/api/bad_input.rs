//! Bad input gets a clear JSON error — 400, 404, 405 or 413 — never a panic, a hang or a
//! partial write.

use std::time::Duration;

use lock_core::testkit::{phase, TestCluster};
use serde_json::{json, Value};

use super::support::{assert_error, assert_grant, lock_path};

/// Bad input gets a clear 400, never a panic, a hang or a partial write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_rejects_bad_input_with_a_clear_400() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader)[0];
    let path = lock_path("bad:input", "acquire");

    phase("bad bodies get 400 invalid_request with {error, message} — on a follower");
    let cases: Vec<(&str, Value)> = vec![
        ("missing request_id", json!({ "ttl_ms": 5_000 })),
        ("empty request_id", json!({ "request_id": "" })),
        (
            "129-char request_id",
            json!({ "request_id": "r".repeat(129) }),
        ),
        ("null request_id", json!({ "request_id": null })),
        ("numeric request_id", json!({ "request_id": 7 })),
        (
            "129-char holder",
            json!({ "request_id": "b-1", "holder": "h".repeat(129) }),
        ),
        (
            "holder with a line break (a forged table row)",
            json!({ "request_id": "b-1a", "holder": "evil\nkv:forged true" }),
        ),
        (
            "holder with an escape sequence",
            json!({ "request_id": "b-1b", "holder": "\u{1b}[31mred" }),
        ),
        (
            "request_id with a right-to-left override",
            json!({ "request_id": "gnp.exe\u{202e}" }),
        ),
        (
            "ttl below policy min",
            json!({ "request_id": "b-2", "ttl_ms": 999 }),
        ),
        (
            "ttl above policy max",
            json!({ "request_id": "b-3", "ttl_ms": 300_001 }),
        ),
        ("ttl zero", json!({ "request_id": "b-4", "ttl_ms": 0 })),
        ("negative ttl", json!({ "request_id": "b-5", "ttl_ms": -1 })),
        (
            "string ttl",
            json!({ "request_id": "b-6", "ttl_ms": "5000" }),
        ),
        (
            "wait_timeout above policy max",
            json!({ "request_id": "b-7", "wait_timeout_ms": 300_001 }),
        ),
        (
            "unknown field",
            json!({ "request_id": "b-8", "ttl": 5_000 }),
        ),
        ("array body", json!(["b-9"])),
    ];
    for (what, body) in cases {
        let got = c.post(f, &path, body).await;
        eprintln!("  {what}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("bodies that are not JSON get 400 too");
    for raw in ["not json", "{", "{\"request_id\": \"b-10\",}", ""] {
        let got = c.post_raw(leader, &path, raw).await;
        eprintln!("  {raw:?}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("a byte order mark before the JSON is named as the problem");
    let got = c
        .post_raw(leader, &path, "\u{feff}{\"request_id\": \"b-11\"}")
        .await;
    assert_error(&got, 400, "invalid_request", &[]);
    let message = got.1["message"].as_str().unwrap_or_default();
    assert!(message.contains("byte order mark"), "{message}");

    phase("resource names: anything outside 1–256 bytes of [A-Za-z0-9._:/-] is 400");
    let long = "r".repeat(257);
    let bad_resources = [
        "a%20b",       // space
        long.as_str(), // 257 bytes
        "",            // empty: /v1/locks//acquire
        "caf%C3%A9",   // unicode (é), URL-encoded
        "%E3%83%AD%E3%83%83%E3%82%AF",
        "a%3Fb", // '?'
        "a%25b", // '%'
        "a%2Cb", // ','
    ];
    for r in bad_resources {
        let got = c
            .post(
                f,
                &lock_path(r, "acquire"),
                json!({ "request_id": "b-11", "ttl_ms": 5_000 }),
            )
            .await;
        eprintln!("  resource {r:?}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }
    let got = c.get(f, &format!("/v1/locks/{long}")).await;
    assert_error(&got, 400, "invalid_request", &[]);
    let got = c.get(f, "/v1/locks/").await;
    assert_error(&got, 400, "invalid_request", &[]);

    phase("a path that is not UTF-8 after decoding is a JSON 400, not a plain-text one");
    let got = c
        .post(f, "/v1/locks/%FF/acquire", json!({ "request_id": "b-13" }))
        .await;
    assert_error(&got, 400, "invalid_request", &[]);
    let got = c.get(leader, "/v1/locks/%FF").await;
    assert_error(&got, 400, "invalid_request", &[]);

    phase("an oversized body is refused with a JSON 413");
    let huge = format!("{{\"request_id\": \"{}\"}}", "x".repeat(3 << 20));
    let got = c.post_raw(f, &path, &huge).await;
    assert_error(&got, 413, "payload_too_large", &[]);

    phase("no partial write — the rejected acquires left no trace");
    let (s, v) = c.get(leader, "/v1/locks/bad:input").await;
    assert_eq!(s, 200);
    assert_eq!(v["held"], false, "{v}");
    assert_eq!(v["fencing_token"], Value::Null, "{v}");
    let (s, v) = c.get(leader, "/v1/locks?prefix=").await;
    assert_eq!(s, 200);
    assert_eq!(v["locks"], json!([]), "{v}");

    phase("resource names: 256 bytes of the full alphabet are accepted");
    let alphabet = "AZaz09._:-/";
    let ok = format!("{alphabet}{}", "x".repeat(256 - alphabet.len()));
    assert_eq!(ok.len(), 256);
    let got = c.acquire(f, &ok, "b-12", 5_000).await;
    assert_grant(&got, &ok, 5_000);
    c.shutdown().await;
}

/// Errors are always JSON `{error, message}`, also for unknown paths and wrong methods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_actions_and_methods_are_json_errors() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader)[0];

    phase("an unknown path is 404 with a JSON error body");
    for path in ["/nope", "/v1", "/v1/lockz/x", "/v2/locks/x"] {
        let got = c.get(f, path).await;
        assert_error(&got, 404, "not_found", &[]);
        let got = c.post(leader, path, json!({})).await;
        assert_error(&got, 404, "not_found", &[]);
    }

    phase("an unknown lock action is 404");
    let got = c
        .post(f, "/v1/locks/x/frobnicate", json!({ "request_id": "r" }))
        .await;
    assert_error(&got, 404, "not_found", &[]);
    let got = c
        .post(leader, "/v1/locks/x/ACQUIRE", json!({ "request_id": "r" }))
        .await;
    assert_error(&got, 404, "not_found", &[]);

    phase("a known path with the wrong method is a JSON 405");
    let got = c.get(f, "/v1/cluster/members/add").await;
    assert_error(&got, 405, "method_not_allowed", &[]);
    // A lock's own path is read with GET.
    for path in ["/v1/cluster", "/healthz", "/v1/locks", "/v1/locks/x"] {
        let got = c.post(leader, path, json!({})).await;
        assert_error(&got, 405, "method_not_allowed", &[]);
    }

    phase("nothing was created by those calls");
    let (s, v) = c.get(leader, "/v1/locks").await;
    assert_eq!((s, &v["locks"]), (200, &json!([])), "{v}");
    c.shutdown().await;
}
