//! SPEC §4 on a real 3-node cluster: every call of the table, on leader and followers.

mod support;

use serde_json::json;
use support::{phase, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_through_any_node() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(std::time::Duration::from_secs(5)).await;
    let follower = c.followers(leader)[0];

    phase("acquire on a follower is forwarded and granted");
    let (s, a) = c.acquire(follower, "kv:one", "req-1", 5_000).await;
    assert_eq!(s, 200, "{a}");
    let lease = a["lease_id"].as_str().unwrap().to_string();
    let token = a["fencing_token"].as_u64().unwrap();
    assert_eq!(lease.len(), 32);

    phase("a second acquire is refused with lock_held");
    let (s, b) = c.acquire(leader, "kv:one", "req-2", 5_000).await;
    assert_eq!(s, 409, "{b}");
    assert_eq!(b["error"], "lock_held");
    assert!(b["retry_after_ms"].as_u64().unwrap() <= 5_000);

    phase("renew keeps the token");
    let (s, r) = c.post(leader, "/v1/locks/kv:one/renew", json!({ "lease_id": lease })).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["fencing_token"].as_u64().unwrap(), token);

    phase("linearizable read on the other follower shows the holder, never the lease id");
    let other = c.followers(leader)[1];
    let (s, g) = c.get(other, "/v1/locks/kv:one").await;
    assert_eq!(s, 200);
    assert_eq!(g["held"], true);
    assert_eq!(g["fencing_token"].as_u64().unwrap(), token);
    assert!(!g.to_string().contains(&lease));

    phase("release, then the next acquire gets a larger token");
    let (s, r) = c.post(other, "/v1/locks/kv:one/release", json!({ "lease_id": lease })).await;
    assert_eq!((s, r["released"].as_bool()), (200, Some(true)));
    let (s, r) = c.post(other, "/v1/locks/kv:one/release", json!({ "lease_id": lease })).await;
    assert_eq!((s, r["released"].as_bool()), (200, Some(false)), "release is idempotent");
    let (s, b) = c.acquire(follower, "kv:one", "req-3", 5_000).await;
    assert_eq!(s, 200, "{b}");
    assert!(b["fencing_token"].as_u64().unwrap() > token);
    c.shutdown().await;
}
