//! Listing: server-side paging of the lock list (`GET /v1/locks?prefix=&limit=&after=`), by the state
//! machine's outputs: every live resource under the prefix appears exactly once across the
//! pages, in name order; ended leases and other prefixes never do; the last page has no cursor.

use lock_core::machine::{Acquire, Command, LeaseId, LockMachine, Proposal};

const T0: u64 = 1_700_000_000_000;

fn acquire(m: &mut LockMachine, now_ms: u64, resource: &str, ttl_ms: u64, lease: u128) {
    let cmd = Command::Acquire(Acquire {
        resource: resource.to_string(),
        request_id: format!("r-{lease}"),
        holder: None,
        ttl_ms,
        wait_timeout_ms: 0,
        lease_id: LeaseId(lease),
        retain_ms: 600_000,
        max_waiters: 8,
        max_total_waiters: 1_000,
        tenant_limits: None,
    });
    m.apply(
        &Proposal {
            now_ms,
            failover_grace_ms: 0,
            cmd,
        },
        1,
    );
}

#[test]
fn pages_cover_every_live_resource_once_in_order() {
    let mut m = LockMachine::new();
    for i in 0..1_000u128 {
        // Every tenth lease is short and will have run out when the list is read.
        let ttl = if i % 10 == 0 { 1_000 } else { 60_000 };
        acquire(&mut m, T0, &format!("page:{i:04}"), ttl, i + 1);
    }
    acquire(&mut m, T0, "other:1", 60_000, 5_000);
    acquire(&mut m, T0, "pagf", 60_000, 5_001);
    let now = T0 + 2_000;

    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let (page, next) = m.list_after("page:", after.as_deref(), 100, now);
        pages += 1;
        assert!(page.len() <= 100);
        seen.extend(page.iter().map(|v| v.resource.clone()));
        match next {
            Some(cursor) => {
                assert_eq!(
                    Some(&cursor),
                    seen.last(),
                    "the cursor is the page's last name"
                );
                after = Some(cursor);
            }
            None => break,
        }
        assert!(pages < 20, "paging does not end");
    }
    let want: Vec<String> = (0..1_000)
        .filter(|i| i % 10 != 0)
        .map(|i| format!("page:{i:04}"))
        .collect();
    assert_eq!(seen, want);
    assert_eq!(
        pages, 9,
        "900 live resources, 100 a page, no empty last page"
    );

    // A cursor before the prefix starts at the prefix; one past it yields nothing.
    let (page, _) = m.list_after("page:", Some("a"), 3, now);
    assert_eq!(page[0].resource, "page:0001");
    let (page, next) = m.list_after("page:", Some("page:9999"), 3, now);
    assert!(page.is_empty() && next.is_none());
}

/// Among many idle records (every resource used in the retry window keeps one) the live
/// resources are few and far apart; the pages must still hold exactly them, in order, whether
/// a page is found by walking the names or through the lease and waiter indexes.
#[test]
fn pages_among_idle_records_hold_exactly_the_live_resources() {
    use crate::support::{acquire_with, release, run, try_once, wait};

    let mut m = LockMachine::new();
    let name = |i: u32| format!("page:{i:05}");
    for i in 0..20_000u32 {
        let id = u128::from(i) + 1;
        run(&mut m, T0, try_once(&name(i), &format!("idle-{i}"), id));
        run(&mut m, T0, release(&name(i), id));
    }
    let mut want = Vec::new();
    for i in (0..20_000u32).step_by(997) {
        let id = 100_000 + u128::from(i);
        run(
            &mut m,
            T0,
            acquire_with(&name(i), &format!("held-{i}"), id, 60_000, 0),
        );
        want.push(name(i));
    }
    // Run out by the time the list is read, but not yet expired by a command: not live.
    for i in (500..20_000u32).step_by(1_999) {
        let id = 200_000 + u128::from(i);
        run(
            &mut m,
            T0,
            acquire_with(&name(i), &format!("short-{i}"), id, 1_000, 0),
        );
    }
    // A lease that ran out with a waiter behind it: live through its queue.
    let queued = name(12_345);
    run(
        &mut m,
        T0,
        acquire_with(&queued, "short-q", 300_000, 1_000, 0),
    );
    run(&mut m, T0, wait(&queued, "waiter-q", 300_001, 60_000));
    want.push(queued.clone());
    want.sort();
    run(&mut m, T0, try_once("other:1", "other", 400_000));
    let now = T0 + 2_000;

    // The reference: every resource's own view.
    let reference: Vec<String> = (0..20_000)
        .map(name)
        .filter(|n| {
            let v = m.view(n, now);
            v.held || v.waiters > 0
        })
        .collect();
    assert_eq!(reference, want, "the fixture has the live set it means to");

    for limit in [1, 7, 100] {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (page, next) = m.list_after("page:", after.as_deref(), limit, now);
            assert!(page.len() <= limit);
            seen.extend(page.iter().map(|v| v.resource.clone()));
            match next {
                Some(cursor) => after = Some(cursor),
                None => break,
            }
            assert!(seen.len() <= want.len(), "paging does not end");
        }
        assert_eq!(seen, want, "pages of {limit}");
    }
    let (page, next) = m.list_after("page:1", None, 100, now);
    let in_prefix: Vec<&String> = want.iter().filter(|n| n.starts_with("page:1")).collect();
    assert_eq!(
        page.iter().map(|v| &v.resource).collect::<Vec<_>>(),
        in_prefix
    );
    assert!(next.is_none());

    assert_eq!(m.deepest_queues(10), vec![(queued, 1)]);
}
