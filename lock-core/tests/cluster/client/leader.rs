//! Finding the leader: nodes name themselves and the leader on every answer, and the client
//! sends its calls to the leader instead of through a follower, and follows a new one.

use lock_core::client::{AcquireOptions, Client};
use lock_core::testkit::{phase, TestCluster};
use lock_core::wire::{LEADER_ID_HEADER, NODE_ID_HEADER};

use super::SEC;
use crate::api::support::{metrics, sample};

/// Acquires this node answered itself (a follower counts the calls it forwarded, too).
async fn acquires_on(c: &TestCluster, node: u64) -> f64 {
    let text = metrics(c, node).await;
    sample(&text, "fencegate_op_seconds_count", &[("op", "acquire")])
}

async fn lock_cycles(client: &Client, prefix: &str, n: usize) {
    for i in 0..n {
        let lease = client
            .acquire(&format!("kv:{prefix}-{i}"), AcquireOptions::new(5 * SEC))
            .await
            .expect("acquire");
        assert!(lease.release().await.expect("release"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_calls_go_to_the_leader_and_follow_a_new_one() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(10 * SEC).await;
    // The followers first: a client that stayed on its first node would never reach the leader.
    let mut order = c.followers(leader);
    order.push(leader);
    let client =
        Client::new(order.iter().map(|id| format!("http://{}", c.addrs[id]))).expect("client");

    phase("a follower's answer names the follower and the leader");
    let answer = reqwest::get(c.url(order[0], "/v1/locks/kv:lead-probe"))
        .await
        .expect("get");
    let id_in =
        |name: &str| -> Option<u64> { answer.headers().get(name)?.to_str().ok()?.parse().ok() };
    assert_eq!(id_in(NODE_ID_HEADER), Some(order[0]));
    assert_eq!(id_in(LEADER_ID_HEADER), Some(leader));

    phase("20 lock cycles: after at most two answers from followers, the leader serves them");
    lock_cycles(&client, "first", 20).await;
    let on_leader = acquires_on(&c, leader).await;
    assert!(
        on_leader >= 19.0,
        "the leader answered {on_leader} of 20 acquires"
    );

    phase("the leader crashes; the client follows the new leader");
    c.crash(leader).await;
    let new_leader = c.wait_leader(10 * SEC).await;
    assert_ne!(new_leader, leader);
    let before = acquires_on(&c, new_leader).await;
    lock_cycles(&client, "second", 20).await;
    let on_new = acquires_on(&c, new_leader).await - before;
    assert!(
        on_new >= 19.0,
        "the new leader answered {on_new} of 20 acquires"
    );
    c.shutdown().await;
}

/// A node holds only so many waits at once (three quarters of its connections); a waiting
/// acquire it refuses for want of room goes on to another configured node and waits there,
/// instead of returning `TooManyWaiters` while the cluster has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_refused_by_a_full_node_waits_on_another() {
    use crate::api::support::{
        answer, assert_grant, lock_path, release, spawn_waiter, wait_waiters,
    };
    use serde_json::json;

    let c = TestCluster::start_adjusted(3, |cfg| cfg.limits.max_connections = 8).await;
    let leader = c.wait_leader(10 * SEC).await;
    let got = c.acquire(leader, "crowd:c", "holder", 30_000).await;
    let (lease, _) = assert_grant(&got, "crowd:c", 30_000);

    phase("six waits fill the leader's room for waits");
    let mut crowd = Vec::new();
    for i in 0..6 {
        crowd.push(spawn_waiter(
            &c,
            leader,
            "crowd:c",
            &format!("w-{i}"),
            20_000,
        ));
        wait_waiters(&c, leader, "crowd:c", i + 1).await;
    }

    phase("the client, leader first, is refused there and waits on a follower");
    let mut order = vec![leader];
    order.extend(c.followers(leader));
    let client =
        Client::new(order.iter().map(|id| format!("http://{}", c.addrs[id]))).expect("client");
    let waiting = tokio::spawn(async move {
        let opts = AcquireOptions::new(30 * SEC).wait_timeout(15 * SEC);
        client.acquire("crowd:c", opts).await
    });
    wait_waiters(&c, leader, "crowd:c", 7).await;

    phase("the crowd leaves and the holder releases: the client is granted the lock");
    for i in 0..6 {
        let (s, r) = c
            .post(
                leader,
                &lock_path("crowd:c", "cancel"),
                json!({ "request_id": format!("w-{i}") }),
            )
            .await;
        assert_eq!(s, 200, "{r}");
    }
    for h in crowd {
        assert_eq!(answer(h).await.0, 409);
    }
    let (s, _) = release(&c, leader, "crowd:c", &lease).await;
    assert_eq!(s, 200);
    let guard = tokio::time::timeout(20 * SEC, waiting)
        .await
        .expect("the client's wait ends")
        .expect("join")
        .expect("granted");
    assert!(guard.release().await.expect("release"));
    c.shutdown().await;
}
