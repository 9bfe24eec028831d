//! Release: a stale release never removes the new holder, and release is idempotent.

use std::time::Duration;

use lock_core::testkit::{phase, TestCluster};
use serde_json::json;

use super::support::{
    assert_error, assert_grant, lock_path, random_lease_id, release, renew, wait_for_lock,
};

/// Only the current lease id releases: a stale release never removes the new holder, and
/// release is idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_release_never_removes_the_new_holder() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("A holds a short lease; a release with someone else's id is {released:false}");
    let got = c.acquire(f[0], "rel:a", "rel-A", 1_000).await;
    let (lease_a, token_a) = assert_grant(&got, "rel:a", 1_000);
    let (s, r) = release(&c, leader, "rel:a", &random_lease_id()).await;
    assert_eq!((s, r), (200, json!({ "released": false })));

    phase("A pauses past its lease: wait for the server to expire it");
    wait_for_lock(&c, leader, "rel:a", "expiry of A", |v| v["held"] == false).await;

    phase("B acquires with a larger token (tokens only grow)");
    let got = c.acquire(f[1], "rel:a", "rel-B", 30_000).await;
    let (lease_b, token_b) = assert_grant(&got, "rel:a", 30_000);
    assert!(token_b > token_a);

    phase("a stale release never removes the new holder: A's is {released:false}, B still holds");
    let (s, r) = release(&c, f[0], "rel:a", &lease_a).await;
    assert_eq!((s, r), (200, json!({ "released": false })));
    let (s, v) = c.get(f[0], "/v1/locks/rel:a").await;
    assert_eq!(s, 200);
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["fencing_token"].as_u64(), Some(token_b), "{v}");
    let (s, r) = renew(&c, leader, "rel:a", &lease_b).await;
    assert_eq!(s, 200, "B can still renew: {r}");

    phase("release is idempotent: B's release works once, and is harmless after");
    let (s, r) = release(&c, f[1], "rel:a", &lease_b).await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let (s, r) = release(&c, f[0], "rel:a", &lease_b).await;
    assert_eq!((s, r), (200, json!({ "released": false })));
    let (s, v) = c.get(leader, "/v1/locks/rel:a").await;
    assert_eq!((s, &v["held"]), (200, &json!(false)), "{v}");

    phase("release of a never-used resource is {released:false}; a malformed id is 400");
    let (s, r) = release(&c, leader, "rel:none", &lease_b).await;
    assert_eq!((s, r), (200, json!({ "released": false })));
    let got = c
        .post(
            leader,
            &lock_path("rel:a", "release"),
            json!({ "lease_id": "xyz" }),
        )
        .await;
    assert_error(&got, 400, "invalid_request", &[]);
    let got = c
        .post(leader, &lock_path("rel:a", "release"), json!({}))
        .await;
    assert_error(&got, 400, "invalid_request", &[]);
    c.shutdown().await;
}
