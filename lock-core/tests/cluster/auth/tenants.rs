//! Tenant namespaces: a key of one tenant neither sees nor touches another tenant's locks,
//! whatever names it guesses; the same name in two tenants is two independent locks, and
//! fencing tokens stay globally monotonic across tenants.

use lock_core::node::TenantPolicy;
use lock_core::testkit::phase;
use lock_core::wire::{AcquireRequest, AcquireResponse, AuditTail, LockList, ResourceDetail};

use super::support::{two_tenants, As, ADMIN_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_neither_see_nor_touch_each_others_locks() {
    let (cluster, leader, a_key, b_key) = two_tenants(TenantPolicy::default()).await;
    let follower = cluster.followers(leader)[0];
    let admin = As::key(&cluster, ADMIN_TOKEN);
    let a = As::key(&cluster, &a_key.key);
    let b = As::key(&cluster, &b_key.key);

    phase("A takes orders/1; B does not see it, by name or by listing");
    let a_lease = a.granted(leader, "orders/1", "a1").await;
    assert_eq!(a_lease.resource, "orders/1", "callers see their own names");
    let seen_by_b = b.view(follower, "orders/1").await;
    assert!(!seen_by_b.held && seen_by_b.fencing_token.is_none() && seen_by_b.holder.is_none());
    assert!(b.list(follower, "").await.locks.is_empty());
    assert!(b.list(follower, "orders").await.locks.is_empty());

    phase("B's own orders/1 is another lock: granted, with a newer token (invariant 2)");
    let b_lease = b.granted(follower, "orders/1", "b1").await;
    assert!(b_lease.fencing_token > a_lease.fencing_token);
    let default_lease = admin.granted(leader, "orders/1", "d1").await;
    assert!(default_lease.fencing_token > b_lease.fencing_token);

    phase("B cannot renew or release A's lease, even holding its lease id (invariant 4)");
    b.renew(follower, "orders/1", &a_lease)
        .await
        .refused(409, "lease_lost");
    assert!(!b.release(follower, "orders/1", &a_lease).await);
    let mine = a.view(leader, "orders/1").await;
    assert!(mine.held);
    assert_eq!(mine.fencing_token, Some(a_lease.fencing_token));

    phase("names that would reach another namespace are refused");
    // Unencoded, `#` starts the URL's fragment: what is sent is a POST to the lock
    // `tenant-a`'s own path, which is read with GET (405).
    for forged in ["tenant-a%23orders/1", "tenant-a#orders/1"] {
        let r = b.acquire(follower, forged, "forge").await;
        assert!(
            matches!(r.status, 400 | 404 | 405),
            "{forged}: {} {}",
            r.status,
            r.text
        );
    }
    b.get(follower, "/v1/locks/tenant-a%23orders/1")
        .await
        .refused(400, "invalid_request");

    phase("listings show each tenant its own names only");
    let a_list = a.list(leader, "").await;
    let names: Vec<&str> = a_list.locks.iter().map(|l| l.resource.as_str()).collect();
    assert_eq!(names, ["orders/1"]);
    let default_list = admin.list(leader, "").await;
    let names: Vec<&str> = default_list
        .locks
        .iter()
        .map(|l| l.resource.as_str())
        .collect();
    assert_eq!(names, ["orders/1"], "the default tenant sees only its own");
    assert_eq!(
        default_list.locks[0].fencing_token,
        Some(default_lease.fencing_token)
    );

    phase("the audit trail names the key that made each call, not a name the client chose");
    let holder_body = AcquireRequest {
        request_id: "a2".into(),
        holder: Some("someone-else".into()),
        ..AcquireRequest::default()
    };
    let second: AcquireResponse = a
        .post(leader, "/v1/locks/orders/2/acquire", &holder_body)
        .await
        .ok();
    let tail: AuditTail = admin
        .get(leader, "/v1/admin/audit?resource=tenant-a%23orders/2")
        .await
        .ok();
    let line = tail.entries.last().expect("the acquire is audited");
    assert_eq!(line.caller, Some(format!("key:{}", a_key.id)));
    assert_eq!(line.holder.as_deref(), Some("someone-else"));
    assert_eq!(line.outcome, "granted");
    assert!(a.release(leader, "orders/2", &second).await);

    phase("an operator sees every tenant's resource by its stored name");
    let detail: ResourceDetail = admin
        .get(leader, "/v1/admin/resources/tenant-a%23orders/1")
        .await
        .ok();
    assert_eq!(
        detail.lease.map(|l| l.fencing_token),
        Some(a_lease.fencing_token)
    );

    phase("an operator lists every tenant's locks by stored name; a client key may not");
    let all: LockList = admin.get(follower, "/v1/admin/locks").await.ok();
    let stored: Vec<(&str, Option<u64>)> = all
        .locks
        .iter()
        .map(|l| (l.resource.as_str(), l.fencing_token))
        .collect();
    assert_eq!(
        stored,
        [
            ("orders/1", Some(default_lease.fencing_token)),
            ("tenant-a#orders/1", Some(a_lease.fencing_token)),
            ("tenant-b#orders/1", Some(b_lease.fencing_token)),
        ]
    );
    let one: LockList = admin
        .get(leader, "/v1/admin/locks?prefix=tenant-b%23&limit=5")
        .await
        .ok();
    assert_eq!(one.locks.len(), 1);
    assert_eq!(one.locks[0].resource, "tenant-b#orders/1");
    let first: LockList = admin.get(leader, "/v1/admin/locks?limit=1").await.ok();
    let after = first.next_after.expect("more than one page");
    let rest: LockList = admin
        .get(
            leader,
            &format!("/v1/admin/locks?after={}", after.replace('#', "%23")),
        )
        .await
        .ok();
    assert_eq!(rest.locks.len(), 2, "the pages cover the three locks once");
    admin
        .get(leader, "/v1/admin/locks?prefix=a%20b")
        .await
        .refused(400, "invalid_request");
    a.get(leader, "/v1/admin/locks")
        .await
        .refused(403, "forbidden");

    phase("A releases its own; B's and the default tenant's locks are untouched");
    assert!(a.release(leader, "orders/1", &a_lease).await);
    assert!(b.view(leader, "orders/1").await.held);
    assert!(admin.view(leader, "orders/1").await.held);
}
