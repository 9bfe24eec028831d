//! Renew: only the current lease id extends a lease, and only while the server says it lasts.

use std::time::{Duration, Instant};

use lock_core::testkit::{phase, TestCluster};
use serde_json::{json, Value};

use super::support::{
    assert_error, assert_grant, keys, lock_path, metrics, random_lease_id, release, renew, sample,
    set, wait_for_lock,
};

/// Only the current lease id renews, and only while the lease lasts by the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_extends_only_the_current_lease() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);

    phase("renew: 200 carries exactly lease_id, fencing_token, ttl_ms, expires_at_ms");
    let got = c.acquire(f[0], "ren:a", "ren-1", 5_000).await;
    let (lease, token) = assert_grant(&got, "ren:a", 5_000);
    let first_expiry = got.1["expires_at_ms"].as_u64().unwrap();
    let (s, r) = renew(&c, f[1], "ren:a", &lease).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        keys(&r),
        set(&["lease_id", "fencing_token", "ttl_ms", "expires_at_ms"]),
        "{r}"
    );
    assert_eq!(r["lease_id"], lease.as_str());
    // A renewal keeps the token and never shortens the lease.
    assert_eq!(r["fencing_token"].as_u64(), Some(token));
    assert_eq!(r["ttl_ms"].as_u64(), Some(5_000));
    assert!(r["expires_at_ms"].as_u64().unwrap() >= first_expiry, "{r}");

    phase("only the current lease id renews: not a random one, on a held or unknown resource");
    for res in ["ren:a", "ren:never-used"] {
        let got = c
            .post(
                leader,
                &lock_path(res, "renew"),
                json!({ "lease_id": random_lease_id() }),
            )
            .await;
        assert_error(&got, 409, "lease_lost", &[]);
    }
    phase("only the current lease id renews: not the right id on the wrong resource");
    let got = renew(&c, leader, "ren:other", &lease).await;
    assert_error(&got, 409, "lease_lost", &[]);

    phase("a malformed lease_id is 400 invalid_request");
    let malformed = [
        json!({}),
        json!({ "lease_id": "" }),
        json!({ "lease_id": "not-a-lease" }),
        json!({ "lease_id": "0".repeat(31) }),
        json!({ "lease_id": "0".repeat(33) }),
        json!({ "lease_id": "g".repeat(32) }),
        json!({ "lease_id": 12345 }),
        json!({ "lease_id": lease, "ttl_ms": 1_000 }),
    ];
    for body in malformed {
        let got = c
            .post(f[0], &lock_path("ren:a", "renew"), body.clone())
            .await;
        eprintln!("  {body}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
    }

    phase("only the current lease id renews: a released lease cannot");
    let (s, r) = release(&c, f[1], "ren:a", &lease).await;
    assert_eq!((s, r), (200, json!({ "released": true })));
    let got = renew(&c, f[0], "ren:a", &lease).await;
    assert_error(&got, 409, "lease_lost", &[]);

    phase("lease time is judged by the server: a 1 s lease expires there; renew is lease_lost");
    let expirations_before = sample(
        &metrics(&c, leader).await,
        "fencegate_lease_expirations_total",
        &[],
    );
    let got = c.acquire(f[0], "ren:short", "ren-2", 1_000).await;
    let (short, short_token) = assert_grant(&got, "ren:short", 1_000);
    let v = wait_for_lock(&c, leader, "ren:short", "expiry", |v| v["held"] == false).await;
    // The record keeps the last token for readers (and the proxy) after expiry.
    assert_eq!(v["fencing_token"].as_u64(), Some(short_token), "{v}");
    assert_eq!(v["holder"], Value::Null);
    let got = renew(&c, f[1], "ren:short", &short).await;
    assert_error(&got, 409, "lease_lost", &[]);

    phase("metrics: the expiry was counted (committed expiry, applied on the leader)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(
        &metrics(&c, leader).await,
        "fencegate_lease_expirations_total",
        &[],
    ) <= expirations_before
    {
        assert!(Instant::now() < deadline, "expiration never counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.shutdown().await;
}
