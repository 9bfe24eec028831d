//! Reads: `GET /v1/locks/{resource}` and the list show the state, never a lease id (a bearer
//! capability).

use std::time::Duration;

use lock_core::testkit::{phase, TestCluster};
use serde_json::json;

use super::support::{assert_error, assert_grant, keys, lock_path, release, set};

/// Reads are linearizable on every node and never show a lease id, which is a bearer
/// capability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_list_show_state_but_never_lease_ids() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let f = c.followers(leader);
    let view_fields = set(&[
        "resource",
        "held",
        "holder",
        "fencing_token",
        "expires_at_ms",
        "waiters",
    ]);

    phase("GET of a never-used resource: not held, no token");
    let (s, v) = c.get(f[0], "/v1/locks/list:none").await;
    assert_eq!(s, 200);
    assert_eq!(keys(&v), view_fields, "{v}");
    assert_eq!(
        v,
        json!({ "resource": "list:none", "held": false, "holder": null,
                "fencing_token": null, "expires_at_ms": null, "waiters": 0 })
    );

    phase("acquire list:a (with holder), list:b, list:c, other:x");
    let mut leases = Vec::new();
    for (i, res) in ["list:c", "list:a", "other:x", "list:b"]
        .into_iter()
        .enumerate()
    {
        let got = c
            .post(
                f[i % 2],
                &lock_path(res, "acquire"),
                json!({ "request_id": format!("l-{i}"), "holder": format!("svc-{res}"), "ttl_ms": 30_000 }),
            )
            .await;
        leases.push((res, assert_grant(&got, res, 30_000)));
    }

    phase("GET on every node: exact fields, holder and token, never the lease_id");
    let (_, (lease_a, token_a)) = leases.iter().find(|(r, _)| *r == "list:a").unwrap().clone();
    for node in [leader, f[0], f[1]] {
        let (s, v) = c.get(node, "/v1/locks/list:a").await;
        assert_eq!(s, 200);
        assert_eq!(keys(&v), view_fields, "{v}");
        assert_eq!(v["resource"], "list:a");
        assert_eq!(v["held"], true);
        assert_eq!(v["holder"], "svc-list:a");
        assert_eq!(v["fencing_token"].as_u64(), Some(token_a));
        assert!(v["expires_at_ms"].as_u64().is_some());
        assert_eq!(v["waiters"], 0);
        assert!(!v.to_string().contains(&lease_a), "lease id leaked: {v}");
    }

    phase("release list:b; it drops out of the list");
    let (_, (lease_b, _)) = leases.iter().find(|(r, _)| *r == "list:b").unwrap().clone();
    let (s, _) = release(&c, leader, "list:b", &lease_b).await;
    assert_eq!(s, 200);

    phase("list: only held resources matching the prefix, in name order, without lease ids");
    let (s, v) = c.get(f[1], "/v1/locks?prefix=list:&limit=10").await;
    assert_eq!(s, 200, "{v}");
    // `now_ms` is the log time read at; `next_after` appears only when more pages follow.
    assert_eq!(keys(&v), set(&["locks", "now_ms"]));
    let locks = v["locks"].as_array().expect("locks");
    let names: Vec<&str> = locks
        .iter()
        .map(|l| l["resource"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["list:a", "list:c"]);
    for l in locks {
        assert_eq!(keys(l), view_fields, "{l}");
        assert_eq!(l["held"], true);
    }
    for (_, (lease, _)) in &leases {
        assert!(
            !v.to_string().contains(lease.as_str()),
            "lease id leaked: {v}"
        );
    }

    phase("list: limit cuts the ordered result; no prefix lists everything held");
    let (s, v) = c.get(leader, "/v1/locks?prefix=list:&limit=1").await;
    assert_eq!(s, 200);
    assert_eq!(v["locks"].as_array().unwrap().len(), 1);
    assert_eq!(v["locks"][0]["resource"], "list:a");
    let (s, v) = c.get(f[0], "/v1/locks").await;
    assert_eq!(s, 200);
    let names: Vec<&str> = v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["resource"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["list:a", "list:c", "other:x"]);
    let (s, v) = c.get(f[0], "/v1/locks?prefix=nothing-here").await;
    assert_eq!((s, &v["locks"]), (200, &json!([])), "{v}");

    phase("list: bad limits, unknown parameters and impossible prefixes are 400");
    for q in [
        "limit=0",
        "limit=5000",
        "prefix=list:&limit=0",
        "limit=ten",
        "prefix=list:&bogus=1",
        "prefix=a%20b",
        "prefix=%zz",
    ] {
        let got = c.get(f[1], &format!("/v1/locks?{q}")).await;
        eprintln!("  {q}: {}", got.1);
        assert_error(&got, 400, "invalid_request", &[]);
        let message = got.1["message"].as_str().unwrap_or_default();
        assert!(!message.contains("deserialize"), "{q}: {message}");
    }
    let got = c.get(f[1], "/v1/locks?limit=ten").await;
    let message = got.1["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("limit") && message.contains("takes"),
        "{message}"
    );
    c.shutdown().await;
}

/// Linearizable reads that arrive together share one read index (one leadership
/// confirmation, one message from a follower to the leader), and each still sees every write
/// that was acknowledged before it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_share_read_indexes_and_see_every_earlier_write() {
    const CLIENTS: usize = 48;
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(5)).await;
    let follower = c.followers(leader)[0];
    let http = reqwest::Client::new();

    phase("each client acquires its own resource on the leader, then reads it on a follower");
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let http = http.clone();
        let resource = format!("rr:{i}");
        let acquire = c.url(leader, &lock_path(&resource, "acquire"));
        let read = c.url(follower, &format!("/v1/locks/{resource}"));
        clients.push(tokio::spawn(async move {
            let granted: serde_json::Value = http
                .post(&acquire)
                .json(&json!({ "request_id": format!("rr-{i}"), "ttl_ms": 30_000 }))
                .send()
                .await
                .expect("acquire sent")
                .json()
                .await
                .expect("acquire answer");
            let view: serde_json::Value = http
                .get(&read)
                .send()
                .await
                .expect("read sent")
                .json()
                .await
                .expect("read answer");
            (granted["fencing_token"].as_u64(), view)
        }));
    }
    for client in clients {
        let (token, view) = client.await.expect("client task");
        assert!(token.is_some(), "acquire failed: {view}");
        assert_eq!(
            view["held"], true,
            "a read missed an acknowledged write: {view}"
        );
        assert_eq!(view["fencing_token"].as_u64(), token, "{view}");
    }

    phase("the follower asked the leader fewer times than it served reads");
    let per_round = &c.node(follower).node.metrics.read_index_reads;
    let (rounds, reads) = (per_round.get_sample_count(), per_round.get_sample_sum());
    eprintln!("  {reads} reads in {rounds} rounds");
    assert!(reads >= CLIENTS as f64, "{reads} reads counted");
    assert!(
        (rounds as f64) < reads,
        "every read took a round of its own ({rounds} rounds)"
    );
    c.shutdown().await;
}
