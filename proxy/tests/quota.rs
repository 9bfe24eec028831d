//! Global rate limits end to end: a real 3-node cluster, one proxy per node, the demo store's
//! `/limited/{key}` behind them under one quota (see `common/`).
//!
//! Invariant checked: per tenant, the rate shares of unexpired leases sum to at most R and the
//! burst shares to at most B, so the proxies together admit at most R·t + B over any window of
//! length t (strict policy) — under shifting load, an isolated proxy and a leader kill.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, phase, FenceClient, FenceHarness, Write, EVENT};
use fencegate_proxy::config::DEV_QUOTA;
use lock_core::machine::{LeaseId, QuotaPolicy, QuotaSpec};
use reqwest::Method;

const R: u64 = 40;
const B: u64 = 20;
const LEASE_MS: u64 = 1_000;

#[derive(Clone, Copy, Debug)]
struct Sample {
    proxy: u64,
    sent: Instant,
    recv: Instant,
    status: u16,
    /// A 429's `retry_after_ms`.
    retry_after_ms: Option<u64>,
}

/// Open-loop load on one proxy: one request every `interval_ms` (0 pauses it), each in its own
/// task so a slow answer does not slow the offered rate.
struct Load {
    intervals: Vec<Arc<AtomicU64>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(client: &FenceClient, proxies: &[u64], tenant: &str) -> Load {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let mut intervals = Vec::new();
        let mut tasks = Vec::new();
        for &proxy in proxies {
            let interval = Arc::new(AtomicU64::new(0));
            intervals.push(interval.clone());
            let (client, samples) = (client.clone(), samples.clone());
            let w = Write::new(Method::GET, &format!("/limited/{proxy}"), "")
                .header("X-Tenant", tenant);
            tasks.push(tokio::spawn(async move {
                loop {
                    let every = interval.load(Ordering::SeqCst);
                    if every == 0 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    let (client, samples, w) = (client.clone(), samples.clone(), w.clone());
                    tokio::spawn(async move {
                        let sent = Instant::now();
                        if let Ok(r) = client.try_send(proxy, &w).await {
                            let s = Sample {
                                proxy,
                                sent,
                                recv: r.at,
                                status: r.status,
                                retry_after_ms: r.body["retry_after_ms"].as_u64(),
                            };
                            samples.lock().unwrap_or_else(|e| e.into_inner()).push(s);
                        }
                    });
                    tokio::time::sleep(Duration::from_millis(every)).await;
                }
            }));
        }
        Load {
            intervals,
            samples,
            tasks,
        }
    }

    /// Sets proxy number `i`'s (in the order given to `start`) offered rate per second.
    fn offer(&self, i: usize, per_s: u64) {
        let every = 1_000u64.checked_div(per_s).map_or(0, |ms| ms.max(1));
        self.intervals[i].store(every, Ordering::SeqCst);
    }

    fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Over every window, admissions ≤ R·t + B. A request was admitted somewhere between its send
/// and its answer, so the requests sent at or after `s` and answered by `e` were admitted
/// inside `[s, e]`.
#[track_caller]
fn assert_within_rate_and_burst(samples: &[Sample]) {
    let mut ok: Vec<&Sample> = samples.iter().filter(|s| s.status == 200).collect();
    ok.sort_by_key(|s| s.sent);
    assert!(!ok.is_empty(), "nothing was admitted");
    for i in 0..ok.len() {
        let mut last = ok[i].recv;
        for (n, s) in ok[i..].iter().enumerate() {
            last = last.max(s.recv);
            let t = last.duration_since(ok[i].sent).as_secs_f64();
            let bound = (R as f64 * t).floor() as usize + B as usize;
            assert!(
                n < bound,
                "{} admitted within {t:.3} s, more than R·t + B = {bound}",
                n + 1
            );
        }
    }
}

/// Admissions of `proxy` (all proxies with `None`) answered in `[from, to)`.
fn admitted(samples: &[Sample], proxy: Option<u64>, from: Instant, to: Instant) -> usize {
    samples
        .iter()
        .filter(|s| s.status == 200 && proxy.is_none_or(|p| s.proxy == p))
        .filter(|s| s.recv >= from && s.recv < to)
        .count()
}

async fn harness(policy: QuotaPolicy) -> FenceHarness {
    harness_of(R, B, policy).await
}

async fn harness_of(rate_per_s: u64, burst: u64, policy: QuotaPolicy) -> FenceHarness {
    FenceHarness::start_with(|c| {
        c.quotas = vec![QuotaSpec {
            name: DEV_QUOTA.into(),
            rate_per_s,
            burst,
            lease_ms: LEASE_MS,
            policy,
        }];
    })
    .await
}

/// A follower's proxy under 50/s of load, once it admits.
async fn loaded_follower(h: &FenceHarness) -> (u64, Load) {
    let leader = h.leader().await;
    let follower = h.cluster.followers(leader)[0];
    let load = Load::start(&h.client, &[follower], "acme");
    load.offer(0, 50);
    eventually(EVENT, "the follower's proxy admits", async || {
        load.samples()
            .iter()
            .any(|s| s.proxy == follower && s.status == 200)
    })
    .await;
    (follower, load)
}

/// Rejections are 429 `rate_limited`; a `Retry-After` comes only with a known time.
async fn probe_rejection(c: &FenceClient, proxy: u64, tenant: &str) -> (u16, String) {
    let w = Write::new(Method::GET, "/limited/probe", "").header("X-Tenant", tenant);
    let r = c.send(proxy, &w).await;
    (r.status, r.code().to_string())
}

/// Three proxies with shifting load: at most R·t + B over every window, and the capacity
/// follows the demand to the proxy that became hot. Prints the measured convergence time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_shifting_load_stays_within_rate_and_burst_and_converges() {
    let h = harness(QuotaPolicy::Strict).await;
    h.leader().await;
    let load = Load::start(&h.client, &[1, 2, 3], "acme");

    phase("proxy 1 hot (100/s offered), proxies 2 and 3 light (5/s)");
    load.offer(0, 100);
    load.offer(1, 5);
    load.offer(2, 5);
    eventually(EVENT, "proxy 1 gets most of the rate", async || {
        let now = Instant::now();
        let from = now - Duration::from_secs(1);
        admitted(&load.samples(), Some(1), from, now) as u64 >= R * 6 / 10
    })
    .await;
    // Load for a few lease durations, so renewals happen under it.
    tokio::time::sleep(Duration::from_millis(3 * LEASE_MS)).await;

    phase("the demand moves: proxy 3 hot, proxy 1 light");
    let shift = Instant::now();
    load.offer(0, 5);
    load.offer(2, 100);
    eventually(EVENT, "proxy 3 gets most of the rate", async || {
        let now = Instant::now();
        let from = now - Duration::from_secs(1);
        admitted(&load.samples(), Some(3), from.max(shift), now) as u64 >= R * 6 / 10
    })
    .await;
    let converged = shift.elapsed();
    println!(
        "quota convergence after a demand shift: {} ms (lease {LEASE_MS} ms, R {R}/s)",
        converged.as_millis()
    );

    tokio::time::sleep(Duration::from_millis(3 * LEASE_MS)).await;

    phase("a rejection is a 429 rate_limited");
    let (status, code) = probe_rejection(&h.client, 3, "acme").await;
    if status != 200 {
        assert_eq!((status, code.as_str()), (429, "rate_limited"));
    }

    let samples = load.samples();
    load.stop();
    phase("every window: admitted ≤ R·t + B");
    let first = samples.iter().map(|s| s.sent).min().expect("samples");
    let last = samples.iter().map(|s| s.recv).max().expect("samples");
    let total = admitted(&samples, None, first, last + Duration::from_millis(1));
    let t = (last - first).as_secs_f64();
    println!(
        "admitted {total} in {t:.2} s: {:.0}% of R·t + B",
        100.0 * total as f64 / (R as f64 * t + B as f64)
    );
    assert_within_rate_and_burst(&samples);
    for id in h.cluster.running() {
        h.cluster
            .node(id)
            .node
            .machine
            .read(|m| m.quotas().check_conservation(m.now_ms()))
            .expect("ledger conserves rate and burst");
    }
    h.shutdown().await;
}

/// Strict policy: a proxy whose node is cut off from the cluster cannot renew and stops
/// admitting once its leases run out (at most two lease durations: the current lease and one
/// successor granted just before the cut); the others go on within the global bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_isolated_proxy_stops_at_lease_expiry() {
    let h = harness(QuotaPolicy::Strict).await;
    let (isolated, load) = loaded_follower(&h).await;

    phase("isolate the follower's node");
    h.cluster.isolate(isolated);
    let cut = Instant::now();
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS + 200)).await;
    let after = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let samples = load.samples();
    let late: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.sent >= after && s.status == 200)
        .collect();
    assert!(
        late.is_empty(),
        "admitted after its leases ran out: {late:?}"
    );
    assert!(
        samples.iter().any(|s| s.sent >= after && s.status == 429),
        "requests after the expiry were answered 429"
    );
    println!(
        "isolated proxy's last admission {} ms after the cut",
        samples
            .iter()
            .filter(|s| s.status == 200)
            .map(|s| s.recv.saturating_duration_since(cut).as_millis())
            .max()
            .unwrap_or(0)
    );
    load.stop();
    h.cluster.heal();
    assert_within_rate_and_burst(&samples);
    h.shutdown().await;
}

/// A leader kill invalidates no lease: every lease on the surviving nodes' ledger before the
/// kill is still there afterwards, never shorter, conservation holds on the new leader, and
/// the proxies stay within R·t + B across the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_leader_kill_keeps_every_lease_counted() {
    let mut h = harness(QuotaPolicy::Strict).await;
    let leader = h.leader().await;
    let survivors: Vec<u64> = h
        .cluster
        .running()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    let load = Load::start(&h.client, &survivors, "acme");
    load.offer(0, 60);
    load.offer(1, 60);
    let observer = survivors[0];
    eventually(EVENT, "both surviving proxies hold leases", async || {
        h.cluster.node(observer).node.machine.read(|m| {
            survivors
                .iter()
                .all(|p| m.quotas().leases().any(|l| l.proxy == *p))
        })
    })
    .await;

    phase("kill the leader");
    let before: Vec<(LeaseId, u64)> = h.cluster.node(observer).node.machine.read(|m| {
        m.quotas()
            .leases()
            .filter(|l| l.expires_at_ms > m.now_ms())
            .map(|l| (l.lease_id, l.expires_at_ms))
            .collect()
    });
    h.crash(leader).await;
    let new_leader = h.leader().await;
    assert_ne!(new_leader, leader);

    phase("the new leader's ledger still counts every lease, none shortened");
    // The first command of the new term (a lease renewal) applies the failover shift.
    eventually(EVENT, "a renewal commits in the new term", async || {
        h.cluster.node(new_leader).node.machine.read(|m| {
            m.quotas()
                .leases()
                .any(|l| !before.iter().any(|b| b.0 == l.lease_id))
        })
    })
    .await;
    h.cluster.node(new_leader).node.machine.read(|m| {
        for (id, exp) in &before {
            if let Some(l) = m.quotas().leases().find(|l| l.lease_id == *id) {
                assert!(l.expires_at_ms >= *exp, "lease shortened: {l:?}");
            } else {
                // Gone only by expiring: the log time has passed its (unshifted) end.
                assert!(m.now_ms() >= *exp, "lease {id} vanished before its expiry");
            }
        }
        m.quotas()
            .check_conservation(m.now_ms())
            .expect("conserved after failover");
    });
    tokio::time::sleep(Duration::from_millis(LEASE_MS)).await;
    let samples = load.samples();
    load.stop();
    assert_within_rate_and_burst(&samples);
    let start = samples.iter().map(|s| s.sent).min().expect("samples");
    assert!(admitted(&samples, None, start, Instant::now()) > 0);
    h.shutdown().await;
}

/// Emergency policy: a proxy cut off from the cluster keeps admitting after its leases end, but
/// at most its allowance E per disconnection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_isolated_proxy_admits_at_most_its_emergency_allowance() {
    const E: u64 = 15;
    let h = harness(QuotaPolicy::Emergency { allowance: E }).await;
    let (isolated, load) = loaded_follower(&h).await;

    phase("isolate the follower's node; its leases run out within two lease durations");
    h.cluster.isolate(isolated);
    let expired = Instant::now() + Duration::from_millis(2 * LEASE_MS);
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS + 2_000)).await;
    let samples = load.samples();
    load.stop();
    let after_expiry = samples
        .iter()
        .filter(|s| s.sent >= expired && s.status == 200)
        .count() as u64;
    println!("admitted after the leases ran out: {after_expiry} (allowance {E})");
    assert!(
        after_expiry <= E,
        "{after_expiry} admitted after expiry, allowance {E}"
    );
    assert!(
        samples.iter().any(|s| s.sent >= expired && s.status == 429),
        "the allowance ran out and later requests were refused"
    );
    h.cluster.heal();
    h.shutdown().await;
}

/// A tenant's first request at a proxy waits for that proxy's first share (one commit)
/// instead of being refused while it is leased; so does every proxy's first for a new tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_a_new_tenants_first_request_is_admitted() {
    let h = harness(QuotaPolicy::Strict).await;
    for (i, proxy) in h.cluster.running().into_iter().enumerate() {
        let tenant = format!("fresh-{i}");
        let w = Write::new(Method::GET, "/limited/first", "").header("X-Tenant", &tenant);
        let r = h.client.send(proxy, &w).await;
        assert_eq!(r.status, 200, "proxy {proxy}, tenant {tenant}: {}", r.body);
    }
    h.shutdown().await;
}

/// Proxy 1 is hot (100/s of R = 40/s) when proxy 2 joins with 10/s. Proxy 2's demand, reported
/// over a meaningful window, earns it a demand-proportional share within a few lease
/// durations while proxy 1 stays hot (it could starve for as long as proxy 1's load lasted);
/// meanwhile it asks at a bounded rate (it asked every 10 ms, a raft command each), and its
/// 429s tell clients when the share may have come (they said 0 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_a_joining_proxy_gets_its_share_while_another_is_hot() {
    let h = harness(QuotaPolicy::Strict).await;
    h.leader().await;
    let observer = h.cluster.running()[0];
    let load = Load::start(&h.client, &[1, 2], "join");

    phase("proxy 1 hot alone");
    load.offer(0, 100);
    eventually(EVENT, "proxy 1 gets most of the rate", async || {
        let now = Instant::now();
        admitted(&load.samples(), Some(1), now - Duration::from_secs(1), now) as u64 >= R * 6 / 10
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS)).await;

    phase("proxy 2 joins with 10/s");
    let applied = || h.cluster.node(observer).node.machine.last_applied_index();
    let (joined, index_at_join) = (Instant::now(), applied());
    load.offer(1, 10);
    tokio::time::sleep(Duration::from_millis(3 * LEASE_MS)).await;
    let entries = applied() - index_at_join;
    println!("log entries in the 3 s after proxy 2 joined: {entries}");
    // Proxy 1 renews about once per lease; proxy 2, short of its target, asks at most every
    // quarter lease: a handful per second, far from one every 10 ms.
    assert!(entries <= 45, "{entries} log entries in 3 s for one pool");

    // The documented 2–4 lease durations, with room for a loaded machine.
    let deadline = joined + Duration::from_millis(10 * LEASE_MS);
    loop {
        let got = admitted(&load.samples(), Some(2), joined, Instant::now());
        if got >= 5 {
            println!(
                "proxy 2 admitted 5 after {} ms",
                joined.elapsed().as_millis()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "proxy 2 admitted {got} in {} ms while proxy 1 was hot",
            joined.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    phase("proxy 2's reported demand stands for its 10/s");
    let mut reports = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(LEASE_MS / 10)).await;
        let d = h.cluster.node(observer).node.machine.read(|m| {
            m.quotas()
                .demand()
                .find(|d| d.proxy == 2 && d.tenant == "join")
                .map(|d| d.demand_milli)
        });
        reports.extend(d);
    }
    assert!(
        reports.iter().all(|d| (3_000..=30_000).contains(d)),
        "demand reports (milli/s) for 10/s offered: {reports:?}"
    );

    phase("proxy 2's 429s while it held nothing said when to come back");
    let samples = load.samples();
    let first = samples
        .iter()
        .filter(|s| s.proxy == 2 && s.status == 200)
        .map(|s| s.recv)
        .min()
        .expect("proxy 2 admitted");
    let waiting: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.proxy == 2 && s.status == 429 && s.recv < first)
        .collect();
    println!(
        "proxy 2's hints while waiting (ms): {:?}",
        waiting.iter().map(|s| s.retry_after_ms).collect::<Vec<_>>()
    );
    // The hint counts down to when the share is expected plus its first refill (at most
    // 40/s here: 25 ms); it said 0–10 ms every time, sending clients back long before a share
    // could have come. A countdown passes small values near its end, so most hints, not all,
    // must be longer than that.
    let long = waiting
        .iter()
        .filter(|s| s.retry_after_ms.is_some_and(|ms| ms >= 20))
        .count();
    assert!(
        long * 2 >= waiting.len(),
        "hints of a few ms while waiting for a share"
    );
    let hints: Vec<u64> = samples.iter().filter_map(|s| s.retry_after_ms).collect();
    assert!(
        hints.iter().all(|ms| *ms <= LEASE_MS),
        "a share is leased again within a lease: no hint sends a client away for longer: \
         {hints:?}"
    );
    load.stop();
    assert_within_rate_and_burst(&samples);
    h.shutdown().await;
}

/// A tenant's first request at one proxy does not lease it the whole pool: the first requests
/// at the second and third proxies are admitted at once too — with a small quota and with the
/// largest one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_cold_starts_at_several_proxies_share_capacity() {
    use lock_core::wire::{MAX_QUOTA_BURST, MAX_QUOTA_RATE_PER_S};
    for (rate, burst) in [(R, B), (MAX_QUOTA_RATE_PER_S, MAX_QUOTA_BURST)] {
        phase(&format!(
            "R = {rate}, B = {burst}: one first request per proxy"
        ));
        let h = harness_of(rate, burst, QuotaPolicy::Strict).await;
        h.leader().await;
        for proxy in h.cluster.running() {
            let w = Write::new(Method::GET, "/limited/cold", "").header("X-Tenant", "cold");
            let r = h.client.send(proxy, &w).await;
            assert_eq!(r.status, 200, "proxy {proxy}: {}", r.body);
        }
        h.shutdown().await;
    }
}

/// `PUT /v1/admin/quotas/{name}` on a follower answers the definition it set (the follower
/// waits to apply its own change), and R and B beyond what the shares' arithmetic holds are
/// refused with a 400 naming the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t80_quota_changes_on_a_follower_answer_the_new_definition() {
    use lock_core::wire::{QuotaView, SetQuotaRequest, MAX_QUOTA_RATE_PER_S};
    const ADMIN: &str = "quota-admin-token-0123456789abcdef";
    let h = FenceHarness::start_with_auth(ADMIN, |_| {}).await;
    let leader = h.leader().await;
    let follower = h.cluster.followers(leader)[0];
    let http = reqwest::Client::new();
    let url = h
        .cluster
        .url(follower, &format!("/v1/admin/quotas/{DEV_QUOTA}"));
    let put = async |body: &SetQuotaRequest| {
        let r = http
            .put(&url)
            .bearer_auth(ADMIN)
            .json(body)
            .send()
            .await
            .expect("put");
        (r.status().as_u16(), r.text().await.expect("body"))
    };

    phase("twenty changes on a follower, each answered with itself");
    for i in 0..20u64 {
        let change = SetQuotaRequest {
            operator: "dora".into(),
            rate_per_s: 10 + i,
            burst: 20 + i,
            lease_ms: 1_000,
            policy: None,
            allowance: None,
        };
        let (status, body) = put(&change).await;
        assert_eq!(status, 200, "{body}");
        let view: QuotaView = serde_json::from_str(&body).expect("a quota view");
        assert_eq!(
            (view.definition.rate_per_s, view.definition.burst),
            (10 + i, 20 + i),
            "change {i} answered {body}"
        );
    }

    phase("u64::MAX is refused, naming the bound");
    let huge = SetQuotaRequest {
        operator: "dora".into(),
        rate_per_s: u64::MAX,
        burst: u64::MAX,
        lease_ms: 1_000,
        policy: None,
        allowance: None,
    };
    let (status, body) = put(&huge).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains(&MAX_QUOTA_RATE_PER_S.to_string()), "{body}");
    h.shutdown().await;
}
