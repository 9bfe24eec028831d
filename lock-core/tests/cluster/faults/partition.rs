//! Partitions: an isolated minority — a follower, then the leader — refuses in bounded time and
//! never grants.

use std::time::{Duration, Instant};

use lock_core::testkit::{eventually, phase, TestCluster};
use serde_json::{json, Value};

use super::{acquire_answered, recorded_lease, Granted, EVENT};
use crate::api::support::{lock_path, metrics, release, sample, spawn_post, wait_waiters};

async fn timed<F: std::future::Future>(f: F) -> (F::Output, Duration) {
    let started = Instant::now();
    let out = f.await;
    (out, started.elapsed())
}

/// An isolated node must refuse within a bounded time (a liveness bound, not a benchmark).
fn assert_no_quorum(what: &str, ((s, v), took): ((u16, Value), Duration), bound: Duration) {
    assert_eq!(s, 503, "{what} must be refused, got {s} {v}");
    assert_eq!(v["error"], "no_quorum", "{what}: {v}");
    assert!(
        took < bound,
        "{what} answered after {took:?} (bound {bound:?})"
    );
}

/// No lease without a quorum commit: a minority never grants or renews; it answers 503
/// `no_quorum` in bounded time, while the majority keeps serving. After healing, the minority
/// catches up and the majority's decision stands: no second lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_isolated_minority_answers_503() {
    let c = TestCluster::start(3).await;
    let bound = Duration::from_millis(c.policy.write_timeout_ms) + Duration::from_secs(3);
    let leader = c.wait_leader(EVENT).await;
    let f = c.followers(leader)[0];
    let other = c.followers(leader)[1];

    phase("take a lease everyone can see (to renew later)");
    let (s, v) = c
        .acquire(leader, "part:renew", "req-part-renew", 120_000)
        .await;
    assert_eq!(s, 200, "{v}");
    let held = Granted::parse(&v);
    let renew_body = json!({ "lease_id": held.lease_id });

    phase("isolate a follower: its acquire and renew are refused with no_quorum");
    c.isolate(f);
    let (acq, ren) = tokio::join!(
        timed(c.acquire(f, "part:minority", "req-minority", 30_000)),
        timed(c.post(f, "/v1/locks/part:renew/renew", renew_body.clone())),
    );
    assert_no_quorum("acquire on the isolated follower", acq, bound);
    assert_no_quorum("renew on the isolated follower", ren, bound);
    // The refusals are in the follower's audit trail: a call refused for want of a quorum is
    // a call the node answered.
    let (s, tail) = c.get(f, "/v1/admin/audit?outcome=no_quorum").await;
    assert_eq!(s, 200, "{tail}");
    let audited: Vec<(&str, &str)> = tail["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| (e["op"].as_str().unwrap(), e["resource"].as_str().unwrap()))
        .collect();
    assert!(
        audited.contains(&("acquire", "part:minority"))
            && audited.contains(&("renew", "part:renew")),
        "{tail}"
    );

    phase("the majority keeps serving");
    let (s, v) = c
        .acquire(other, "part:majority", "req-majority", 120_000)
        .await;
    assert_eq!(s, 200, "{v}");
    let majority = Granted::parse(&v);
    let (s, v) = c
        .post(other, "/v1/locks/part:renew/renew", renew_body.clone())
        .await;
    assert_eq!(s, 200, "{v}");

    phase("heal: the follower catches up and reads show the majority's writes");
    c.heal();
    c.wait_caught_up(f, EVENT).await;
    let (lease, token, _) = recorded_lease(&c, f, "part:majority").expect("caught up");
    assert_eq!((lease, token), (majority.lease_id.clone(), majority.token));
    let (s, g) = c.get(f, "/v1/locks/part:majority").await;
    assert_eq!(
        (s, g["fencing_token"].as_u64()),
        (200, Some(majority.token)),
        "{g}"
    );
    let (s, g) = c.get(f, "/v1/locks/part:minority").await;
    assert_eq!((s, &g["held"]), (200, &json!(false)), "never granted: {g}");

    phase("isolate the leader: it refuses while the other two elect a new leader");
    let old = c.wait_leader(EVENT).await;
    let majority_nodes = c.followers(old);
    c.isolate(old);
    let isolated = async {
        tokio::join!(
            timed(c.acquire(old, "part:split", "req-split-old", 30_000)),
            timed(c.post(old, "/v1/locks/part:renew/renew", renew_body.clone())),
            timed(c.get(old, "/v1/locks/part:renew")),
        )
    };
    let majority_side = async {
        let mut new = 0;
        eventually(EVENT, "the majority elects a new leader", async || {
            let views: Vec<Option<u64>> = majority_nodes
                .iter()
                .map(|id| c.node(*id).node.current_leader())
                .collect();
            match views[..] {
                [Some(a), Some(b)] if a == b && a != old => {
                    new = a;
                    true
                }
                _ => false,
            }
        })
        .await;
        let (s, v) = acquire_answered(&c, new, "part:split", "req-split-new", 120_000).await;
        assert_eq!(s, 200, "majority acquire: {v}");
        let split = Granted::parse(&v);
        let (s, v) = c
            .post(new, "/v1/locks/part:renew/renew", renew_body.clone())
            .await;
        assert_eq!(s, 200, "majority renew: {v}");
        split
    };
    let ((acq, ren, get), split) = tokio::join!(isolated, majority_side);
    // Raft keeps the cut-off leader's role; the gauge operators alert on must not.
    eventually(
        EVENT,
        "the cut-off leader stops counting as leader",
        async || {
            let node = &c.node(old).node;
            node.refresh_gauges();
            node.metrics.is_leader.get() == 0
        },
    )
    .await;
    assert_no_quorum("acquire on the isolated old leader", acq, bound);
    assert_no_quorum("renew on the isolated old leader", ren, bound);
    assert_no_quorum("linearizable GET on the isolated old leader", get, bound);

    phase("heal: the old leader catches up; its unreplicated acquire never took effect");
    c.heal();
    for id in c.running() {
        c.wait_caught_up(id, EVENT).await;
        let (lease, token, _) = recorded_lease(&c, id, "part:split").expect("split lease");
        assert_eq!(
            (lease, token),
            (split.lease_id.clone(), split.token),
            "node {id}"
        );
        let last = c
            .node(id)
            .node
            .machine
            .read(|m| m.resource("part:split").map(|r| r.last_token));
        assert_eq!(
            last,
            Some(split.token),
            "node {id}: a second token was issued"
        );
    }
    let (s, v) = acquire_answered(&c, old, "part:split", "req-split-old", 30_000).await;
    assert_eq!(
        s, 409,
        "the old leader's request must not own a second lease: {v}"
    );
    let (s, g) = c.get(old, "/v1/locks/part:split").await;
    assert_eq!(
        (s, g["fencing_token"].as_u64()),
        (200, Some(split.token)),
        "{g}"
    );
    c.shutdown().await;
}

/// A waiting acquire whose node is cut off from the leader ends there with 503 instead of
/// sitting out its wait: the leader may hand it the lock while the node cannot hear of it. The
/// wait keeps its place, so the caller's retry with the same request_id on another node
/// collects the hand-off: one lease, not two, and no grant left unclaimed until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_node_cut_off_ends_and_a_retry_elsewhere_collects_the_grant() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let [f, other] = c.followers(leader)[..] else {
        panic!("three nodes");
    };
    let path = lock_path("part:wait", "acquire");
    let wait = json!({ "request_id": "req-waiter", "ttl_ms": 60_000, "wait_timeout_ms": 120_000 });

    phase("a lease on the leader, and a waiter queued behind it through a follower");
    let (s, v) = c.acquire(leader, "part:wait", "req-holder", 120_000).await;
    assert_eq!(s, 200, "{v}");
    let held = Granted::parse(&v);
    let waiter = spawn_post(c.url(f, &path), wait.clone(), Duration::from_secs(180));
    wait_waiters(&c, leader, "part:wait", 1).await;

    phase("cut the follower off, then release: the leader hands the lock to the waiter");
    c.isolate(f);
    let (s, v) = release(&c, leader, "part:wait", &held.lease_id).await;
    assert_eq!((s, &v["released"]), (200, &json!(true)), "{v}");

    phase("the cut-off node ends the wait with 503, long before its 120 s wait_timeout_ms");
    let (s, v) = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the wait on the cut-off node is still open after 60 s")
        .expect("waiter task")
        .expect("waiter request");
    assert_eq!((s, &v["error"]), (503, &json!("no_quorum")), "{v}");

    phase("the retry with the same request_id on a node in touch collects the hand-off");
    let (s, v) = c.post(other, &path, wait).await;
    assert_eq!(s, 200, "{v}");
    let got = Granted::parse(&v);
    assert!(got.token > held.token, "{v}");
    assert_eq!(
        recorded_lease(&c, leader, "part:wait").map(|(lease, token, _)| (lease, token)),
        Some((got.lease_id, got.token)),
        "the retry must get the lease the leader handed to the wait"
    );
    c.heal();
    c.shutdown().await;
}

/// A member that is cut off asks the others before it campaigns, so its term stays where it
/// was however long the partition lasts; when it is heard again it follows the leader it finds
/// instead of deposing it with a higher term (an election, and a pause, for nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_follower_returns_without_forcing_an_election() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let f = c.followers(leader)[0];
    let (s, v) = c.acquire(leader, "calm:before", "req-calm-1", 60_000).await;
    assert_eq!(s, 200, "{v}");
    let term = c.cluster_status(leader).await.term;
    let pre_votes = |id: u64| {
        let metrics = &c.node(id).node.metrics.pre_votes;
        metrics.with_label_values(&["lost"]).get()
    };
    let lost_before = pre_votes(f);

    phase("cut a follower off for several election timeouts");
    c.isolate(f);
    // Long enough for at least three campaigns: each waits the lease and a timeout (≤ 1.6 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let isolated_term = c.node(f).node.raft.metrics().borrow().current_term;
    assert_eq!(isolated_term, term, "the isolated follower raised its term");
    assert!(
        pre_votes(f) > lost_before,
        "the isolated follower never tried to campaign"
    );
    let scraped = c.node(f).node.metrics.render();
    assert!(
        scraped
            .lines()
            .any(|l| l.starts_with("fencegate_raft_pre_votes_total{")
                && l.contains("outcome=\"lost\"")),
        "the pre-votes are not in /metrics"
    );

    phase("heal: the same leader in the same term serves the returning follower");
    c.heal();
    c.wait_caught_up(f, EVENT).await;
    let (s, v) = c.acquire(f, "calm:after", "req-calm-2", 60_000).await;
    assert_eq!(s, 200, "{v}");
    for id in c.running() {
        let status = c.cluster_status(id).await;
        assert_eq!(
            (status.leader_id, status.term),
            (Some(leader), term),
            "node {id} after healing"
        );
    }
    c.shutdown().await;
}

/// `/readyz` says whether a node can serve, not only whether it once knew a leader: a follower
/// cut off from the others, and a leader cut off from its followers, turn unready within a few
/// election timeouts (raft's own view keeps naming the old leader), and ready again on healing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_on_a_node_cut_off_and_200_when_healed() {
    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let f = c.followers(leader)[0];
    for id in c.running() {
        eventually(EVENT, &format!("node {id} ready"), async || {
            c.get(id, "/readyz").await.0 == 200
        })
        .await;
    }

    for cut in [f, leader] {
        phase(&format!("cut node {cut} off"));
        c.isolate(cut);
        eventually(EVENT, &format!("node {cut} unready"), async || {
            let (s, v) = c.get(cut, "/readyz").await;
            s == 503 && v["error"] == "no_leader"
        })
        .await;
        let ready = async |id: u64| sample(&metrics(&c, id).await, "fencegate_ready", &[]);
        assert_eq!(ready(cut).await, 0.0, "fencegate_ready of node {cut}");
        c.heal();
        eventually(EVENT, &format!("node {cut} ready again"), async || {
            c.get(cut, "/readyz").await.0 == 200
        })
        .await;
        eventually(EVENT, "fencegate_ready says so too", async || {
            ready(cut).await == 1.0
        })
        .await;
    }
    c.shutdown().await;
}

/// An operator's drain hands leadership over while one voter is down: the stepping-aside
/// leader's vote is the one its successor needs (it refused pre-votes as a leader, so the drain
/// failed after 10 s without writes, and a lease renewed meanwhile was lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_with_one_voter_down_hands_leadership_over() {
    let mut c = TestCluster::start_with_auth(
        3,
        "drain-admin-token",
        lock_core::node::TenantPolicy::default(),
    )
    .await;
    let leader = c.wait_leader(EVENT).await;
    let f = c.followers(leader);
    let (s, v) = c.acquire(f[0], "drain:held", "drain-held", 30_000).await;
    assert_eq!(s, 200, "{v}");
    let held = Granted::parse(&v);

    phase("one voter down, the leader drains: the other voter takes over");
    c.crash(f[1]).await;
    let (s, v) = c
        .post(leader, "/v1/admin/drain", json!({ "operator": "test" }))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["new_leader"].as_u64(), Some(f[0]), "{v}");

    phase("writes go on, and the lease held through the drain renews");
    let (s, v) = c
        .post(
            leader,
            "/v1/locks/drain:held/renew",
            json!({ "lease_id": held.lease_id }),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = c
        .acquire(leader, "drain:after", "drain-after", 30_000)
        .await;
    assert_eq!(s, 200, "{v}");
    c.shutdown().await;
}

/// A deposed leader records how long the election that replaced it took, like the others, not
/// its whole time as leader (it heard from no other leader meanwhile: before, the silence was
/// counted from the last append it received as a follower, before it led).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_leader_records_the_elections_length_not_its_time_as_leader() {
    let c = TestCluster::start_with_auth(
        3,
        "drain-admin-token",
        lock_core::node::TenantPolicy::default(),
    )
    .await;
    let drain = async |id: u64| {
        let (s, v) = c
            .post(id, "/v1/admin/drain", json!({ "operator": "test" }))
            .await;
        assert_eq!(s, 200, "{v}");
        v["new_leader"].as_u64().expect("new_leader")
    };
    let first = c.wait_leader(EVENT).await;

    phase("a first drain: the next leader was a follower of the first");
    let second = drain(first).await;
    let led_since = Instant::now();

    phase("it leads for a while, then drains in turn");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let third = drain(second).await;
    eventually(
        EVENT,
        "the drained leader records the election",
        async || {
            let elections = c.node(second).node.ops.elections();
            elections.last().is_some_and(|e| e.leader_id == third)
        },
    )
    .await;
    let led = led_since.elapsed();
    let recorded = c.node(second).node.ops.elections().last().cloned();
    let recorded = recorded.expect("one").duration_ms;
    assert!(
        u128::from(recorded) < led.as_millis() / 2,
        "{recorded} ms without a leader, recorded by a node that led for {led:?} of that"
    );
    c.shutdown().await;
}

/// A drain hands leadership to one chosen follower at once: with an election timeout so long
/// that the followers' own timers could not fire within the drain's 10 s, the drain still
/// succeeds, in a single election (the term goes up by one), and the other follower never
/// campaigns. Before, a drain waited for both followers' leases to run out together, and on a
/// busy machine the second one's election could follow the first's and depose it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_hands_over_to_one_follower_in_one_election() {
    use lock_core::timing::{RaftTiming, HEARTBEAT_MS};
    // The followers' timers need the lease (8 s) plus 4–8 s: past the drain's 10 s.
    const TIMING: RaftTiming = RaftTiming {
        heartbeat_ms: HEARTBEAT_MS,
        election_timeout_ms: 4_000,
    };
    let c = TestCluster::start_adjusted(3, |n| n.raft = TIMING).await;
    let leader = c.wait_leader(Duration::from_secs(40)).await;
    let (s, v) = c.acquire(leader, "handover:held", "held", 60_000).await;
    assert_eq!(s, 200, "{v}");
    let held = Granted::parse(&v);
    let term = c.cluster_status(leader).await.term;
    let rounds = |id: u64| {
        let m = &c.node(id).node.metrics.pre_votes;
        m.with_label_values(&["won"]).get() + m.with_label_values(&["lost"]).get()
    };
    let before: Vec<u64> = [1, 2, 3].into_iter().map(rounds).collect();

    phase("raft refuses votes within a lease of an election: wait that out, then drain");
    tokio::time::sleep(Duration::from_millis(
        TIMING.election_timeout_max_ms() + 500,
    ))
    .await;
    let (s, v) = c
        .post(leader, "/v1/admin/drain", json!({ "operator": "test" }))
        .await;
    assert_eq!(s, 200, "{v}");
    let successor = v["new_leader"].as_u64().expect("new_leader");
    assert_ne!(successor, leader, "{v}");
    assert_eq!(v["term"].as_u64(), Some(term + 1), "one election: {v}");

    phase("one pre-vote round, by the successor; the other follower never campaigned");
    let other = c
        .followers(leader)
        .into_iter()
        .find(|f| *f != successor)
        .expect("a third node");
    assert_eq!(rounds(successor), before[successor as usize - 1] + 1);
    assert_eq!(rounds(other), before[other as usize - 1]);
    assert_eq!(rounds(leader), before[leader as usize - 1]);
    for id in [1, 2, 3] {
        eventually(
            EVENT,
            &format!("node {id} follows the successor"),
            async || {
                let st = c.cluster_status(id).await;
                (st.term, st.leader_id) == (term + 1, Some(successor))
            },
        )
        .await;
    }

    phase("the lease held through the drain renews, and writes go on");
    let (s, v) = c
        .post(
            successor,
            "/v1/locks/handover:held/renew",
            json!({ "lease_id": held.lease_id }),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = c.acquire(leader, "handover:after", "after", 30_000).await;
    assert_eq!(s, 200, "{v}");
    c.shutdown().await;
}

/// A drain picks the follower that has lately answered appends fastest, not just the first that
/// holds the whole log: one behind a slow link would make a poor leader. An operator may name
/// the successor instead (`to`); a name that is not another voter is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_picks_the_follower_that_keeps_up_best_or_the_one_named() {
    use lock_core::timing::RaftTiming;
    use lock_core::wire::FaultRule;

    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let mut f = c.followers(leader);
    f.sort();
    // The lowest id is the one a plain "first caught up" rule would pick: make it the slow one.
    let (slow, fast) = (f[0], f[1]);

    phase("appends to one follower take 40 ms longer; the leader drains");
    c.node(leader).node.faults().set_rule(
        slow,
        FaultRule {
            delay_ms: 40,
            ..FaultRule::default()
        },
    );
    // Raft refuses votes within a lease of an election; the appends meanwhile measure the links.
    let lease = RaftTiming::default().election_timeout_max_ms();
    tokio::time::sleep(Duration::from_millis(lease + 500)).await;
    let term = c.cluster_status(leader).await.term;
    let drain = async |at: u64, body: Value| c.post(at, "/v1/admin/drain", body).await;
    let (s, v) = drain(leader, json!({ "operator": "test" })).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["new_leader"].as_u64(), Some(fast), "{v}");
    assert_eq!(v["term"].as_u64(), Some(term + 1), "{v}");
    c.node(leader).node.faults().heal();

    phase("a name that is not another voter is refused");
    for (to, says) in [(fast, "is the leader"), (99, "not a voter")] {
        let (s, v) = drain(fast, json!({ "operator": "test", "to": to })).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (400, Some("invalid_request")),
            "{v}"
        );
        assert!(v["message"].as_str().unwrap_or("").contains(says), "{v}");
    }

    phase("named, the slow follower takes over (asked through another member)");
    tokio::time::sleep(Duration::from_millis(lease + 500)).await;
    let (s, v) = drain(leader, json!({ "operator": "test", "to": slow })).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["new_leader"].as_u64(), Some(slow), "{v}");
    assert_eq!(v["term"].as_u64(), Some(term + 2), "{v}");
    c.shutdown().await;
}

/// Under a steady stream of writes the hand-over still takes one election: no write starts
/// while the leader drains, and the successor is asked only once the leader's log has stopped
/// growing (an entry appended after that made the leader refuse its successor's vote, and then
/// the old leader won back its leadership, and a third election followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_under_load_takes_one_election() {
    let c = std::sync::Arc::new(TestCluster::start(3).await);
    let leader = c.wait_leader(EVENT).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..24u64 {
        let (c, stop) = (c.clone(), stop.clone());
        let at = [1, 2, 3][w as usize % 3];
        writers.push(tokio::spawn(async move {
            let mut granted = 0u32;
            for i in 0..5_000u64 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let resource = format!("load:{w}-{i}");
                let (s, _) = c
                    .acquire(at, &resource, &format!("r-{w}-{i}"), 30_000)
                    .await;
                granted += u32::from(s == 200);
            }
            granted
        }));
    }
    let lease = lock_core::timing::RaftTiming::default().election_timeout_max_ms();
    tokio::time::sleep(Duration::from_millis(lease + 1_000)).await;

    phase("three drains in turn, each while 24 writers keep the leader busy");
    let mut at = leader;
    for _ in 0..3 {
        let term = c.cluster_status(at).await.term;
        let (s, v) = c
            .post(at, "/v1/admin/drain", json!({ "operator": "test" }))
            .await;
        assert_eq!(s, 200, "{v}");
        let next = v["new_leader"].as_u64().expect("new_leader");
        assert_eq!(v["term"].as_u64(), Some(term + 1), "one election: {v}");
        tokio::time::sleep(Duration::from_millis(lease + 500)).await;
        let st = c.cluster_status(next).await;
        assert_eq!(
            (st.term, st.leader_id),
            (term + 1, Some(next)),
            "no election after"
        );
        at = next;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut granted = 0;
    for w in writers {
        granted += w.await.expect("writer");
    }
    assert!(granted > 0, "the writers wrote");
    match std::sync::Arc::try_unwrap(c) {
        Ok(c) => c.shutdown().await,
        Err(_) => panic!("the writers are done"),
    }
}
