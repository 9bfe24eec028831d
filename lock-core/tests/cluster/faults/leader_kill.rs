//! Leader kills: a committed acquire whose answer died with the leader, and a stream of
//! acquires across a crash.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::testkit::{eventually, phase, TestCluster};

use super::{acquire_answered, machine_last_token, recorded_lease, stream_acquire, Granted, EVENT};

/// A retried acquire returns the original result, also across a failover: an acquire that was
/// committed but whose answer was lost with the leader is retried with the same request_id on
/// a survivor and gets the original lease and token; no second lease is ever created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_dedup_across_leader_kill() {
    let mut c = TestCluster::start(3).await;
    let old = c.wait_leader(EVENT).await;

    phase("acquire directly through the leader: committed, answer in hand");
    let (s, v) = c.acquire(old, "dedup:job", "req-dedup", 20_000).await;
    assert_eq!(s, 200, "{v}");
    let original = Granted::parse(&v);

    phase("crash the leader before the client used the answer");
    c.crash(old).await;
    let new = c.wait_leader(EVENT).await;
    assert_ne!(new, old);
    let survivor = c.followers(new)[0];

    phase("the survivors record the election with the time they heard from no leader");
    let timeout = c.config(new).raft.election_timeout_ms;
    for id in [new, survivor] {
        eventually(
            EVENT,
            &format!("node {id} records the election"),
            async || {
                let elections = c.node(id).node.ops.elections();
                elections.last().is_some_and(|e| e.leader_id == new)
            },
        )
        .await;
        let recorded = c
            .node(id)
            .node
            .ops
            .elections()
            .last()
            .cloned()
            .expect("one");
        assert!(
            recorded.duration_ms >= timeout,
            "node {id}: {} ms without a leader, though none can be elected within {timeout} ms",
            recorded.duration_ms
        );
    }

    phase("retry the same request_id on the surviving follower and on the new leader");
    for id in [survivor, new] {
        let (s, v) = acquire_answered(&c, id, "dedup:job", "req-dedup", 20_000).await;
        assert_eq!(s, 200, "retry on node {id}: {v}");
        let retry = Granted::parse(&v);
        assert_eq!(retry.lease_id, original.lease_id, "retry on node {id}");
        assert_eq!(retry.token, original.token, "retry on node {id}");
        assert!(
            retry.expires_at_ms >= original.expires_at_ms,
            "a leader change never shortens a lease, also on retry: {v}"
        );
    }

    phase("GET and list show exactly one holder, with the original token");
    let (s, g) = c.get(survivor, "/v1/locks/dedup:job").await;
    assert_eq!(s, 200, "{g}");
    assert_eq!(g["held"], true, "{g}");
    assert_eq!(g["fencing_token"].as_u64(), Some(original.token), "{g}");
    let (s, l) = c.get(new, "/v1/locks?prefix=dedup:").await;
    assert_eq!(s, 200, "{l}");
    assert_eq!(l["locks"].as_array().map(Vec::len), Some(1), "{l}");
    for id in c.running() {
        c.wait_caught_up(id, EVENT).await;
        let (lease, token, _) = recorded_lease(&c, id, "dedup:job").expect("lease recorded");
        assert_eq!((lease, token), (original.lease_id.clone(), original.token));
        // Only one grant ever happened, so no token beyond the original was consumed.
        assert_eq!(machine_last_token(&c, id), original.token, "node {id}");
    }

    phase("restart the old leader: once caught up it agrees");
    c.restart(old).await;
    c.wait_caught_up(old, EVENT).await;
    let (lease, token, _) = recorded_lease(&c, old, "dedup:job").expect("lease on old leader");
    assert_eq!((lease, token), (original.lease_id.clone(), original.token));
    assert_eq!(machine_last_token(&c, old), original.token);
    let (s, v) = acquire_answered(&c, old, "dedup:job", "req-dedup", 20_000).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(Granted::parse(&v).lease_id, original.lease_id);
    let (s, g) = c.get(old, "/v1/locks/dedup:job").await;
    assert_eq!(
        (s, g["fencing_token"].as_u64()),
        (200, Some(original.token)),
        "{g}"
    );
    c.shutdown().await;
}

fn shared_grants(seen: &Mutex<Vec<Granted>>) -> usize {
    let seen = seen.lock().expect("seen");
    seen.iter()
        .filter(|g| g.resource.starts_with("stream:shared:"))
        .count()
}

/// One lease at a time, and tokens only grow: clients keep acquiring distinct and shared
/// resources while the leader is killed. Every lease any client was granted is checked
/// afterwards: one valid lease per resource at a time, unique tokens, tokens rising in grant
/// order, and a global counter on every node at least as high as every token seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_leader_killed_mid_stream() {
    const TASKS: u64 = 4;
    const SHARED: usize = 3;
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let api = c.api_client();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<Granted>>> = Arc::default();

    phase("start 4 clients: own resources (ttl 5 s) and 3 shared ones (ttl 1 s)");
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (api, stop, answered) = (api.clone(), stop.clone(), answered.clone());
        let seen = seen.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let own = i.is_multiple_of(2);
                let (resource, ttl) = if own {
                    (format!("stream:own:{t}:{i}"), 5_000)
                } else {
                    (
                        format!("stream:shared:{}", (i / 2) as usize % SHARED),
                        1_000,
                    )
                };
                let rid = format!("stream-{t}-{i}");
                let (s, v) = stream_acquire(&api, 1 + (t + i) % 3, &resource, &rid, ttl).await;
                if own {
                    assert_eq!(s, 200, "own resource {resource} must be granted: {v}");
                }
                if s == 200 {
                    seen.lock().expect("seen").push(Granted::parse(&v));
                }
                answered.fetch_add(1, Ordering::SeqCst);
                i += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }
    // Shared leases (ttl 1 s) must change hands several times before and after the crash, or
    // the overlap check below has little to look at.
    eventually(EVENT, "20 answers and 6 shared grants", async || {
        answered.load(Ordering::SeqCst) >= 20 && shared_grants(&seen) >= 2 * SHARED
    })
    .await;

    phase("crash the leader mid-stream");
    c.crash(leader).await;
    let at_crash = answered.load(Ordering::SeqCst);
    let shared_at_crash = shared_grants(&seen);
    let new = c.wait_leader(EVENT).await;
    eventually(
        EVENT,
        "40 answers and 6 shared grants after the crash",
        async || {
            answered.load(Ordering::SeqCst) >= at_crash + 40
                && shared_grants(&seen) >= shared_at_crash + 2 * SHARED
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("client task");
    }
    let seen = std::mem::take(&mut *seen.lock().expect("seen"));
    eprintln!(
        "{} answers, {} grants; leader {leader} crashed after {at_crash}, new leader {new}",
        answered.load(Ordering::SeqCst),
        seen.len()
    );

    phase("every lease id maps to one resource and one token; tokens are unique");
    let mut leases: BTreeMap<String, Vec<Granted>> = BTreeMap::new();
    for g in &seen {
        leases
            .entry(g.lease_id.clone())
            .or_default()
            .push(g.clone());
    }
    let mut tokens = BTreeSet::new();
    for (lease, views) in &leases {
        let first = &views[0];
        for v in views {
            assert_eq!(
                (&v.resource, v.token),
                (&first.resource, first.token),
                "{lease}"
            );
        }
        assert!(
            tokens.insert(first.token),
            "token {} issued twice",
            first.token
        );
    }

    phase("per resource: leases do not overlap and tokens rise in grant order");
    // Per lease: the earliest grant time and the latest expiry any answer showed.
    let mut by_resource: BTreeMap<String, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for views in leases.values() {
        let granted_at = views.iter().map(Granted::granted_at_ms).min().unwrap_or(0);
        let expires = views.iter().map(|v| v.expires_at_ms).max().unwrap_or(0);
        by_resource
            .entry(views[0].resource.clone())
            .or_default()
            .push((views[0].token, granted_at, expires));
    }
    let mut shared_regrants = 0;
    for (resource, list) in &mut by_resource {
        list.sort();
        for pair in list.windows(2) {
            let ((t1, _, exp1), (t2, at2, _)) = (pair[0], pair[1]);
            assert!(
                exp1 <= at2,
                "{resource}: token {t2} granted at {at2} while token {t1} was valid until {exp1}"
            );
        }
        if resource.starts_with("stream:shared:") {
            shared_regrants += list.len() - 1;
        }
    }
    assert!(
        shared_regrants > 0,
        "no shared resource was granted twice; the overlap check saw nothing"
    );

    phase("restart the old leader; every node's last_token covers every token seen");
    let max_token = *tokens.last().expect("some grants");
    c.restart(leader).await;
    for id in c.running() {
        eventually(
            EVENT,
            &format!("node {id} last_token >= {max_token}"),
            async || c.cluster_status(id).await.locks.last_token >= max_token,
        )
        .await;
    }

    phase("the replicated state agrees: each recorded lease is the newest one a client saw");
    for id in c.running() {
        c.wait_caught_up(id, EVENT).await;
        for (resource, list) in &by_resource {
            if let Some((_, token, _)) = recorded_lease(&c, id, resource) {
                let newest = list.last().map(|l| l.0);
                assert_eq!(Some(token), newest, "node {id}, {resource}");
            }
        }
    }
    c.shutdown().await;
}
