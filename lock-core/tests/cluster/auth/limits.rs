//! Per-tenant bounds: leases and waiters (cluster-wide, in the replicated state) and the call
//! rate (a bucket per tenant on each node), each a 429 with its own code, counted in metrics.

use std::time::Duration;

use lock_core::node::TenantPolicy;
use lock_core::testkit::{eventually, phase};
use lock_core::wire::AcquireRequest;

use super::support::{counter, two_tenants, As, ADMIN_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_beyond_its_lease_and_waiter_bounds_gets_429() {
    let tenants = TenantPolicy {
        max_leases: 2,
        max_waiters: 1,
        rate_per_s: 0,
        ..TenantPolicy::default()
    };
    let (cluster, leader, a_key, b_key) = two_tenants(tenants).await;
    let a = As::key(&cluster, &a_key.key);
    let b = As::key(&cluster, &b_key.key);

    phase("two leases are A's bound: the third is refused, whichever node is asked");
    let first = a.granted(leader, "x1", "r1").await;
    a.granted(leader, "x2", "r2").await;
    for node in [1, 2, 3] {
        a.acquire(node, "x3", &format!("r3-{node}"))
            .await
            .refused(429, "tenant_lease_limit");
    }
    assert!(!a.view(leader, "x3").await.held);

    phase("the bound is A's alone: B still gets its leases");
    b.granted(leader, "x3", "b1").await;

    phase("the bootstrap admin token is the operator's: no tenant bound applies to it");
    let operator = As::key(&cluster, ADMIN_TOKEN);
    for i in 0..4 {
        operator
            .granted(leader, &format!("ops{i}"), &format!("ops-{i}"))
            .await;
    }

    phase("one waiter is A's bound: a second waiting acquire is refused at once");
    let a_reader = As::key(&cluster, &a_key.key);
    let waiting = tokio::spawn({
        let url = cluster.url(leader, "/v1/locks/x1/acquire");
        let key = a_key.key.clone();
        async move {
            let body = AcquireRequest {
                request_id: "w1".into(),
                wait_timeout_ms: Some(30_000),
                ..AcquireRequest::default()
            };
            reqwest::Client::new()
                .post(url)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .expect("wait")
                .status()
                .as_u16()
        }
    });
    eventually(Duration::from_secs(10), "A's waiter queued", async || {
        a_reader.view(leader, "x1").await.waiters == 1
    })
    .await;
    let second = AcquireRequest {
        request_id: "w2".into(),
        wait_timeout_ms: Some(30_000),
        ..AcquireRequest::default()
    };
    a.post(leader, "/v1/locks/x2/acquire", &second)
        .await
        .refused(429, "tenant_waiter_limit");

    phase("the lock passes to the waiter when released: bounds never block a hand-off");
    assert!(a.release(leader, "x1", &first).await);
    assert_eq!(waiting.await.expect("join"), 200);

    phase("refusals are counted by bound");
    let leases: u64 = {
        let mut n = 0;
        for node in [1, 2, 3] {
            n += counter(&cluster, node, "tenant_limited_total", "limit=\"leases\"").await;
        }
        n
    };
    assert_eq!(leases, 3);
    assert_eq!(
        counter(
            &cluster,
            leader,
            "tenant_limited_total",
            "limit=\"waiters\""
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_beyond_its_call_rate_on_a_node_gets_429_with_retry_after() {
    let tenants = TenantPolicy {
        rate_per_s: 1,
        burst: 3,
        ..TenantPolicy::default()
    };
    let (cluster, leader, a_key, b_key) = two_tenants(tenants).await;
    let a = As::key(&cluster, &a_key.key);
    let b = As::key(&cluster, &b_key.key);

    phase("A's burst of 3 passes; calls beyond it are refused until the bucket refills");
    let mut refused = None;
    for i in 0..10 {
        let r = a.get(leader, &format!("/v1/locks/kv:{i}")).await;
        if r.status == 429 {
            refused = Some(r);
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let refused = refused.expect("a call beyond the rate was refused");
    let body = refused.refused(429, "tenant_rate_limited");
    assert!(body.retry_after_ms.is_some_and(|ms| ms > 0 && ms <= 1_000));

    phase("the bootstrap admin token has no call rate");
    let operator = As::key(&cluster, ADMIN_TOKEN);
    for i in 0..10 {
        let r = operator.get(leader, &format!("/v1/locks/kv:{i}")).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }

    phase("B has its own bucket, and the bucket is per node");
    assert_eq!(b.get(leader, "/v1/locks/kv:0").await.status, 200);
    let other = cluster.followers(leader)[0];
    assert_eq!(a.get(other, "/v1/locks/kv:0").await.status, 200);
    assert!(counter(&cluster, leader, "tenant_limited_total", "limit=\"rate\"").await >= 1);
}
