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
