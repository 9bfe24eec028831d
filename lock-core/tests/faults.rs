//! SPEC §3 under faults, on real 3-node clusters: leader kills, partitions, clock skew, whole
//! cluster restarts and follower catch-up (log replay and snapshot install).
//!
//! Each test reads as linear phases (`phase` lines in the output) and names the invariant it
//! checks. Waits poll observable state with deadlines; the only sleeps are "until wall-clock
//! time T", where the passage of time itself is what a test is about (lease expiry).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_core::node::Policy;
use lock_core::testkit::{eventually, phase, ApiClient, TestCluster};
use serde_json::{json, Value};

/// Deadline for elections, catch-up and similar events (generous: CI machines are slow).
const EVENT: Duration = Duration::from_secs(15);

/// A granted lease as a client saw it in a 200 acquire answer.
#[derive(Clone, Debug)]
struct Granted {
    resource: String,
    lease_id: String,
    token: u64,
    ttl_ms: u64,
    expires_at_ms: u64,
}

impl Granted {
    fn parse(v: &Value) -> Self {
        let field = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
        Granted {
            resource: v["resource"].as_str().expect("resource").to_string(),
            lease_id: v["lease_id"].as_str().expect("lease_id").to_string(),
            token: field("fencing_token"),
            ttl_ms: field("ttl_ms"),
            expires_at_ms: field("expires_at_ms"),
        }
    }

    /// Log time at which the lease was granted: grants expire at `now + ttl`. A retried
    /// acquire reports the current (possibly failover-extended) expiry, which only moves this
    /// later, so checks built on it can miss an overlap but never invent one.
    fn granted_at_ms(&self) -> u64 {
        self.expires_at_ms - self.ttl_ms
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Sleeps until the wall clock reads `at_ms`. Used only where the passage of time is what is
/// being tested (a lease must still be held just before its original expiry).
async fn sleep_until_wall(at_ms: u64) {
    let now = wall_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

/// Acquires on node `id`, retrying with the *same* request id while the cluster answers 503
/// (election in progress). Returns the first definitive answer.
async fn acquire_answered(
    c: &TestCluster,
    id: u64,
    resource: &str,
    request_id: &str,
    ttl_ms: u64,
) -> (u16, Value) {
    let deadline = Instant::now() + EVENT;
    loop {
        let (s, v) = c.acquire(id, resource, request_id, ttl_ms).await;
        if s != 503 || Instant::now() > deadline {
            return (s, v);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A rival acquire (fresh request id) that must be refused because `resource` is held.
async fn assert_refused(c: &TestCluster, id: u64, resource: &str, rival: &str) -> u64 {
    let (s, v) = acquire_answered(c, id, resource, rival, 5_000).await;
    assert_eq!(s, 409, "rival acquire of {resource} on node {id}: {v}");
    assert_eq!(v["error"], "lock_held", "{v}");
    v["retry_after_ms"].as_u64().expect("retry_after_ms")
}

/// The lease node `id`'s replicated state records for `resource`: (lease_id, token, expiry).
fn recorded_lease(c: &TestCluster, id: u64, resource: &str) -> Option<(String, u64, u64)> {
    c.node(id).node.machine.read(|m| {
        m.lease(resource)
            .map(|l| (l.lease_id.to_string(), l.fencing_token, l.expires_at_ms))
    })
}

fn machine_last_token(c: &TestCluster, id: u64) -> u64 {
    c.node(id).node.machine.read(|m| m.last_token())
}

/// SPEC §3.6: an acquire that was committed but whose answer was lost with the leader is
/// retried with the same request_id on a survivor and gets the original lease and token;
/// no second lease is ever created.
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

    phase("retry the same request_id on the surviving follower and on the new leader");
    for id in [survivor, new] {
        let (s, v) = acquire_answered(&c, id, "dedup:job", "req-dedup", 20_000).await;
        assert_eq!(s, 200, "retry on node {id}: {v}");
        let retry = Granted::parse(&v);
        assert_eq!(retry.lease_id, original.lease_id, "retry on node {id}");
        assert_eq!(retry.token, original.token, "retry on node {id}");
        assert!(
            retry.expires_at_ms >= original.expires_at_ms,
            "§3.7 on retry: {v}"
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

/// One client's acquire, retried with the same request id on the next node while the answer
/// is a transport error (crashed node) or 503. Returns the definitive 200 or 409.
async fn stream_acquire(
    api: &ApiClient,
    first: u64,
    resource: &str,
    request_id: &str,
    ttl_ms: u64,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = json!({ "request_id": request_id, "ttl_ms": ttl_ms });
    let path = format!("/v1/locks/{resource}/acquire");
    let n = api.addrs.len() as u64;
    for attempt in 0.. {
        let id = (first - 1 + attempt) % n + 1;
        match api.post(id, &path, body.clone()).await {
            Ok((s @ (200 | 409), v)) => return (s, v),
            Ok((503, _)) | Err(_) => {}
            Ok((s, v)) => panic!("acquire {request_id} on node {id}: {s} {v}"),
        }
        assert!(
            Instant::now() < deadline,
            "acquire {request_id} got no answer within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!()
}

fn shared_grants(seen: &Mutex<Vec<Granted>>) -> usize {
    let seen = seen.lock().expect("seen");
    seen.iter()
        .filter(|g| g.resource.starts_with("stream:shared:"))
        .count()
}

/// SPEC §3.1 and §3.2: clients keep acquiring distinct and shared resources while the leader
/// is killed. Every lease any client was granted is checked afterwards: one valid lease per
/// resource at a time, unique tokens, tokens rising in grant order, and a global counter on
/// every node at least as high as every token seen.
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

    phase("per resource: leases do not overlap and tokens rise in grant order (§3.1, §3.2)");
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

/// SPEC §3.5: a minority never grants or renews; it answers 503 `no_quorum` in bounded time,
/// while the majority keeps serving. After healing, the minority catches up and the majority's
/// decision stands: no second lease.
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

/// SPEC §3.7: a leader change never shortens a lease. The new leader honours the remaining
/// time plus the failover grace, also when its clock runs 5 s ahead of the old leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_leader_change_does_not_shorten_lease() {
    // A grace well above election time, so the check below tells the grace apart from the
    // election time a failover also credits.
    let policy = Policy {
        failover_grace_ms: 3_000,
        ..Policy::default()
    };
    let mut c = TestCluster::start_with(3, policy).await;
    let grace = c.policy.failover_grace_ms;
    let l1 = c.wait_leader(EVENT).await;

    phase("acquire failover:a with ttl 10 s");
    let (s, v) = c.acquire(l1, "failover:a", "req-a", 10_000).await;
    assert_eq!(s, 200, "{v}");
    let a = Granted::parse(&v);

    phase("crash the leader; the new leader shows the same lease, expiring no earlier");
    c.crash(l1).await;
    let l2 = c.wait_leader(EVENT).await;
    let (s, g) = c.get(l2, "/v1/locks/failover:a").await;
    assert_eq!((s, &g["held"]), (200, &json!(true)), "{g}");
    assert_eq!(g["fencing_token"].as_u64(), Some(a.token));
    assert!(
        g["expires_at_ms"].as_u64().unwrap() >= a.expires_at_ms,
        "{g}"
    );

    phase("after a command of the new term, the expiry carries the failover grace");
    let (s, v) = acquire_answered(&c, l2, "failover:other-a", "req-other-a", 10_000).await;
    assert_eq!(s, 200, "{v}");
    let (s, g) = c.get(l2, "/v1/locks/failover:a").await;
    assert_eq!(s, 200, "{g}");
    let shifted = g["expires_at_ms"].as_u64().unwrap();
    assert!(
        shifted >= a.expires_at_ms + grace,
        "{shifted} < {} + {grace}",
        a.expires_at_ms
    );

    phase("a rival is refused and told to wait at least the original remaining time");
    let retry_after = assert_refused(&c, l2, "failover:a", "rival-a-1").await;
    assert!(
        retry_after + wall_ms() >= a.expires_at_ms,
        "retry_after {retry_after}"
    );

    phase("restart the old leader; every node but the current leader gets a +5 s clock");
    c.restart(l1).await;
    c.wait_caught_up(l1, EVENT).await;
    let l2 = c.wait_leader(EVENT).await;
    for id in c.followers(l2) {
        c.node(id).node.faults().set_clock_offset_ms(5_000);
    }

    phase("acquire failover:b with ttl 10 s, then crash the leader");
    let (s, v) = c.acquire(l2, "failover:b", "req-b", 10_000).await;
    assert_eq!(s, 200, "{v}");
    let b = Granted::parse(&v);
    c.crash(l2).await;
    let l3 = c.wait_leader(EVENT).await;
    assert_eq!(c.node(l3).node.faults().snapshot().clock_offset_ms, 5_000);

    phase("the skewed new leader honours both leases' remaining time plus grace");
    let (s, v) = acquire_answered(&c, l3, "failover:other-b", "req-other-b", 10_000).await;
    assert_eq!(s, 200, "{v}");
    for lease in [&a, &b] {
        let (s, g) = c.get(l3, &format!("/v1/locks/{}", lease.resource)).await;
        assert_eq!((s, &g["held"]), (200, &json!(true)), "{g}");
        assert_eq!(g["fencing_token"].as_u64(), Some(lease.token), "{g}");
        let exp = g["expires_at_ms"].as_u64().unwrap();
        assert!(
            exp >= lease.expires_at_ms + grace,
            "{}: {g}",
            lease.resource
        );
    }
    let retry_after = assert_refused(&c, l3, "failover:b", "rival-b-1").await;
    assert!(
        retry_after + wall_ms() >= b.expires_at_ms,
        "retry_after {retry_after}"
    );

    phase("just before each original expiry, the lease is still held (409)");
    let other = c.followers(l3)[0];
    sleep_until_wall(a.expires_at_ms - 500).await;
    assert_refused(&c, other, "failover:a", "rival-a-2").await;
    sleep_until_wall(b.expires_at_ms - 500).await;
    assert_refused(&c, other, "failover:b", "rival-b-2").await;

    phase("the lease does end: a waiting rival gets it, not before the original expiry");
    let (s, v) = c
        .post(
            other,
            "/v1/locks/failover:b/acquire",
            json!({ "request_id": "rival-b-wait", "ttl_ms": 5_000, "wait_timeout_ms": 10_000 }),
        )
        .await;
    let granted_wall = wall_ms();
    assert_eq!(
        s, 200,
        "the extension is bounded, so the waiter is served: {v}"
    );
    let next = Granted::parse(&v);
    assert!(next.token > b.token);
    assert!(
        granted_wall >= b.expires_at_ms,
        "lease b ended early, at {granted_wall}"
    );
    c.shutdown().await;
}

/// SPEC §3.2 and durability (STYLE §9): the whole cluster crashes and restarts; every lease
/// survives with its token and expiry, old lease ids still renew, and new tokens keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_all_nodes_restarted() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;

    phase("acquire five locks through different nodes");
    let mut held = Vec::new();
    for i in 0..5u64 {
        let id = i % 3 + 1;
        let (s, v) = c
            .acquire(id, &format!("durable:{i}"), &format!("req-d{i}"), 60_000)
            .await;
        assert_eq!(s, 200, "{v}");
        held.push(Granted::parse(&v));
    }
    let max_token = held.iter().map(|g| g.token).max().unwrap();

    phase("crash all three nodes");
    let mut order = vec![leader];
    order.extend(c.followers(leader));
    for id in order {
        c.crash(id).await;
    }
    assert!(c.running().is_empty());

    phase("restart all three and wait for a leader");
    for id in 1..=3 {
        c.restart(id).await;
    }
    let leader = c.wait_leader(EVENT).await;

    phase("every lease is still held with the same token, expiring no earlier");
    for g in &held {
        let (s, v) = c.get(leader, &format!("/v1/locks/{}", g.resource)).await;
        assert_eq!((s, &v["held"]), (200, &json!(true)), "{v}");
        assert_eq!(v["fencing_token"].as_u64(), Some(g.token), "{v}");
        assert!(
            v["expires_at_ms"].as_u64().unwrap() >= g.expires_at_ms,
            "{v}"
        );
    }

    phase("renew with the old lease ids succeeds and keeps the tokens");
    for g in &held {
        let body = json!({ "lease_id": g.lease_id });
        let (s, v) = c
            .post(
                leader % 3 + 1,
                &format!("/v1/locks/{}/renew", g.resource),
                body,
            )
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["fencing_token"].as_u64(), Some(g.token));
        assert!(v["expires_at_ms"].as_u64().unwrap() >= g.expires_at_ms);
    }

    phase("a retried request_id still gets its original lease (§3.6 across restarts)");
    let (s, v) = c.acquire(leader, "durable:0", "req-d0", 60_000).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(Granted::parse(&v).lease_id, held[0].lease_id);

    phase("a new acquire gets a token above every earlier one");
    let (s, v) = c.acquire(leader, "durable:new", "req-d-new", 60_000).await;
    assert_eq!(s, 200, "{v}");
    assert!(Granted::parse(&v).token > max_token, "{v}");
    c.shutdown().await;
}

/// Acquires `count` distinct resources `{prefix}{k}` through `id` with 8 concurrent clients
/// and returns the grants.
async fn write_many(c: &TestCluster, id: u64, prefix: &str, count: u64) -> Vec<Granted> {
    let api = c.api_client();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..8 {
        let (api, prefix) = (api.clone(), prefix.to_string());
        set.spawn(async move {
            let mut out = Vec::new();
            for k in (w..count).step_by(8) {
                let res = format!("{prefix}{k}");
                let (s, v) = stream_acquire(&api, id, &res, &format!("req-{res}"), 60_000).await;
                assert_eq!(s, 200, "{res}: {v}");
                out.push(Granted::parse(&v));
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.expect("writer task"));
    }
    all.sort_by_key(|g| g.token);
    all
}

/// A node that was down catches up: first by log replication, then — after the leader
/// compacted its log past the node's last entry — by installing a snapshot. The token counter
/// survives the snapshot install (SPEC §3.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_crashed_follower_catches_up() {
    let mut c = TestCluster::start(3).await;
    let leader = c.wait_leader(EVENT).await;
    let f = c.followers(leader)[0];

    phase("crash a follower, then make 220 writes (200 acquires, 20 releases)");
    c.crash(f).await;
    let grants = write_many(&c, leader, "catchup:", 200).await;
    for g in grants.iter().take(20) {
        let body = json!({ "lease_id": g.lease_id });
        let (s, v) = c
            .post(leader, &format!("/v1/locks/{}/release", g.resource), body)
            .await;
        assert_eq!((s, v["released"].as_bool()), (200, Some(true)), "{v}");
    }

    phase("restart it: it replays the log up to the leader's last_applied");
    c.restart(f).await;
    c.wait_caught_up(f, EVENT).await;
    for (i, g) in grants.iter().enumerate() {
        let rec = recorded_lease(&c, f, &g.resource);
        if i < 20 {
            assert_eq!(rec, None, "{} was released", g.resource);
        } else {
            let (lease, token, _) = rec.unwrap_or_else(|| panic!("{} missing", g.resource));
            assert_eq!((lease, token), (g.lease_id.clone(), g.token));
        }
    }
    assert_eq!(machine_last_token(&c, f), machine_last_token(&c, leader));

    phase("linearizable GETs on it show the latest state");
    let (last, released) = (grants.last().unwrap(), &grants[0]);
    let (s, g) = c.get(f, &format!("/v1/locks/{}", last.resource)).await;
    assert_eq!(
        (s, g["fencing_token"].as_u64()),
        (200, Some(last.token)),
        "{g}"
    );
    let (s, g) = c.get(f, &format!("/v1/locks/{}", released.resource)).await;
    assert_eq!((s, &g["held"]), (200, &json!(false)), "{g}");

    phase("crash it again, write more, then snapshot and purge the leader's log");
    let leader = c.wait_leader(EVENT).await;
    assert_ne!(leader, f);
    c.crash(f).await;
    let more = write_many(&c, leader, "compact:", 40).await;
    let raft = c.node(leader).node.raft.clone();
    let applied = c.node(leader).node.machine.last_applied_index();
    raft.trigger().snapshot().await.expect("trigger snapshot");
    let snapshot_index = raft
        .wait(Some(EVENT))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= applied),
            "snapshot built",
        )
        .await
        .expect("snapshot")
        .snapshot
        .map_or(0, |s| s.index);
    raft.trigger()
        .purge_log(snapshot_index)
        .await
        .expect("purge");
    raft.wait(Some(EVENT))
        .metrics(
            |m| m.purged.is_some_and(|p| p.index >= snapshot_index),
            "log purged",
        )
        .await
        .expect("purge done");
    let token_before = machine_last_token(&c, leader);
    assert!(token_before >= more.last().unwrap().token);

    phase("restart it: it must install the snapshot, and converges");
    c.restart(f).await;
    eventually(
        EVENT,
        "the follower installs the leader's snapshot",
        async || {
            c.cluster_status(f)
                .await
                .snapshot_index
                .is_some_and(|i| i >= snapshot_index)
        },
    )
    .await;
    c.wait_caught_up(f, EVENT).await;
    for g in grants.iter().skip(20).chain(&more) {
        let (lease, token, _) = recorded_lease(&c, f, &g.resource).expect("lease after install");
        assert_eq!(
            (lease, token),
            (g.lease_id.clone(), g.token),
            "{}",
            g.resource
        );
    }
    assert_eq!(
        machine_last_token(&c, f),
        token_before,
        "counter survives the install"
    );

    phase("a new acquire through it gets a token above everything before");
    let (s, v) = acquire_answered(&c, f, "compact:new", "req-compact-new", 60_000).await;
    assert_eq!(s, 200, "{v}");
    assert!(Granted::parse(&v).token > token_before, "{v}");
    let (s, g) = c.get(f, "/v1/locks/compact:new").await;
    assert_eq!((s, g["held"].as_bool()), (200, Some(true)), "{g}");
    c.shutdown().await;
}
