//! Fuzzing the v1 API over HTTP: arbitrary resource paths (every byte, percent-encoded),
//! actions, methods and bodies against a real node. Every answer is a status below 500 with the
//! JSON error body when it is an error, and the node keeps serving. `PROPTEST_CASES` sets the
//! number of requests (docs/verification.md records a long run).

use lock_core::testkit::{fuzz_cases, TestCluster};
use lock_core::wire::ErrorBody;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Percent-encodes every byte outside the unreserved set, so any byte string is a valid URL
/// path and reaches the server as those bytes.
fn encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (*b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Call {
    get: bool,
    resource: Vec<u8>,
    action: String,
    body: Vec<u8>,
}

fn call() -> impl Strategy<Value = Call> {
    let action = prop_oneof![
        Just("acquire".to_string()),
        Just("renew".to_string()),
        Just("release".to_string()),
        Just("cancel".to_string()),
        "[a-z/%.]{0,8}",
    ];
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        ("[ -~]{0,40}", any::<i64>()).prop_map(|(id, n)| {
            format!(r#"{{"request_id":{id:?},"ttl_ms":{n},"wait_timeout_ms":{n}}}"#).into_bytes()
        }),
        "[0-9a-f]{0,40}".prop_map(|id| format!(r#"{{"lease_id":"{id}"}}"#).into_bytes()),
    ];
    (
        any::<bool>(),
        proptest::collection::vec(any::<u8>(), 0..40),
        action,
        body,
    )
        .prop_map(|(get, resource, action, body)| Call {
            get,
            resource,
            action,
            body,
        })
}

#[test]
fn any_v1_lock_call_answers_below_500_with_a_json_error() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cluster = rt.block_on(TestCluster::start(1));
    let http = reqwest::Client::new();
    let base = cluster.url(1, "/v1/locks/");
    let mut runner = TestRunner::new(Config {
        cases: fuzz_cases(64),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&call(), |c| {
            let url = format!("{base}{}/{}", encode(&c.resource), c.action);
            let (status, body) = rt.block_on(async {
                let req = if c.get {
                    http.get(&url)
                } else {
                    http.post(&url).body(c.body.clone())
                };
                let resp = req.send().await.expect("the node answers");
                let status = resp.status().as_u16();
                (status, resp.bytes().await.expect("body"))
            });
            prop_assert!(status < 500, "{status} for {c:?}: {body:?}");
            if status >= 400 {
                let err: Result<ErrorBody, _> = serde_json::from_slice(&body);
                prop_assert!(
                    err.is_ok(),
                    "{status} without a JSON error for {c:?}: {body:?}"
                );
            }
            Ok(())
        })
        .expect("fuzzed calls");
    let (status, _) = rt.block_on(cluster.get(1, "/healthz"));
    assert_eq!(status, 200);
    rt.block_on(cluster.shutdown());
}
