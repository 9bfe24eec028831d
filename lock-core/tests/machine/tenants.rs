//! API keys and tenants in the pure machine: the key table (digests only, in snapshots), calls
//! made with a key applied only while the key exists, per-tenant lease and waiter bounds, and
//! per-tenant counts that stay in step with the state under random histories.

use lock_core::machine::{
    Acquire, ApiKeyRecord, Command, LeaseId, LockMachine, Response, TenantLimitHit, TenantLimits,
};
use lock_core::wire::{scoped_name, KeyRole};
use proptest::prelude::*;

use super::support::{acq, cancel, granted, release, restore, run, tick, T0};

fn key(id: &str, tenant: &str) -> ApiKeyRecord {
    ApiKeyRecord {
        id: id.to_string(),
        tenant: tenant.to_string(),
        role: KeyRole::Client,
        digest: format!("digest-of-{id}"),
        label: None,
        created_at_ms: 0,
    }
}

fn as_key(id: &str, cmd: Command) -> Command {
    Command::AsKey {
        key_id: id.to_string(),
        cmd: Box::new(cmd),
    }
}

fn bounded(
    resource: &str,
    request_id: &str,
    lease: u128,
    wait_ms: u64,
    limits: TenantLimits,
) -> Command {
    Command::Acquire(Acquire {
        wait_timeout_ms: wait_ms,
        tenant_limits: Some(limits),
        ..acq(resource, request_id, lease)
    })
}

#[test]
fn keys_are_created_once_revoked_once_and_kept_in_snapshots() {
    let mut m = LockMachine::new();
    assert_eq!(
        run(&mut m, T0, Command::KeyCreate(key("k1", "acme"))),
        Response::KeyCreated(true)
    );
    // A second creation with a taken id changes nothing.
    let mut clash = key("k1", "other");
    clash.role = KeyRole::Admin;
    assert_eq!(
        run(&mut m, T0 + 1, Command::KeyCreate(clash)),
        Response::KeyCreated(false)
    );
    let k = m.api_key("k1").expect("created");
    assert_eq!(
        (k.tenant.as_str(), k.role, k.created_at_ms),
        ("acme", KeyRole::Client, T0)
    );

    let back = restore(&m);
    assert_eq!(
        back.api_key("k1"),
        m.api_key("k1"),
        "keys survive a snapshot"
    );

    assert_eq!(
        run(&mut m, T0 + 2, Command::KeyRevoke { id: "k1".into() }),
        Response::KeyRevoked(true)
    );
    assert_eq!(
        run(&mut m, T0 + 3, Command::KeyRevoke { id: "k1".into() }),
        Response::KeyRevoked(false)
    );
    assert!(m.api_key("k1").is_none());
    assert!(restore(&m).api_key("k1").is_none());
}

#[test]
fn a_call_made_with_a_key_applies_only_while_the_key_exists() {
    let mut m = LockMachine::new();
    run(&mut m, T0, Command::KeyCreate(key("k1", "acme")));
    let r = scoped_name("acme", "orders/1");
    let g = granted(run(
        &mut m,
        T0,
        as_key("k1", super::support::try_once(&r, "q1", 1)),
    ));
    assert_eq!(g.fencing_token, 1);

    run(&mut m, T0 + 1, Command::KeyRevoke { id: "k1".into() });
    // Ordered after the revocation in the log: refused, and nothing changes — no token is
    // used, the lease is neither renewed nor released.
    let before = m.image();
    for cmd in [
        super::support::try_once(&scoped_name("acme", "orders/2"), "q2", 2),
        super::support::renew(&r, 1),
        release(&r, 1),
    ] {
        assert_eq!(run(&mut m, T0 + 1, as_key("k1", cmd)), Response::KeyRefused);
    }
    // Log time and the count of applied commands move on with every command, refused or not.
    let mut after = m.image();
    after.now_ms = before.now_ms;
    after.commands = before.commands;
    assert_eq!(after, before);
    assert_eq!(m.last_token(), 1);
}

#[test]
fn a_tenant_gets_no_lease_beyond_its_bound_and_other_tenants_are_not_counted() {
    let mut m = LockMachine::new();
    let limits = TenantLimits {
        max_leases: 2,
        max_waiters: 1,
    };
    let a = |n: &str| scoped_name("a", n);
    granted(run(&mut m, T0, bounded(&a("x1"), "r1", 1, 0, limits)));
    granted(run(&mut m, T0, bounded(&a("x2"), "r2", 2, 0, limits)));
    assert_eq!(
        run(&mut m, T0, bounded(&a("x3"), "r3", 3, 0, limits)),
        Response::TenantLimit(TenantLimitHit::Leases)
    );
    assert!(m.lease(&a("x3")).is_none());
    // Another tenant, and the default one, have their own counts.
    granted(run(
        &mut m,
        T0,
        bounded(&scoped_name("b", "x3"), "r4", 4, 0, limits),
    ));
    granted(run(&mut m, T0, bounded("x3", "r5", 5, 0, limits)));
    // A try-once acquire of a held resource adds nothing: it is answered as held.
    assert!(matches!(
        run(&mut m, T0, bounded(&a("x1"), "r6", 6, 0, limits)),
        Response::Held { .. }
    ));

    // One waiter is the bound; a second is refused, then admitted once the first is gone.
    assert!(matches!(
        run(&mut m, T0, bounded(&a("x1"), "w1", 7, 10_000, limits)),
        Response::Queued { .. }
    ));
    assert_eq!(
        run(&mut m, T0, bounded(&a("x2"), "w2", 8, 10_000, limits)),
        Response::TenantLimit(TenantLimitHit::Waiters)
    );
    run(&mut m, T0 + 1, cancel(&a("x1"), "w1"));
    assert!(matches!(
        run(&mut m, T0 + 1, bounded(&a("x2"), "w3", 9, 10_000, limits)),
        Response::Queued { .. }
    ));

    // Releasing frees a lease of the bound; the queued waiter is handed the lock meanwhile.
    run(&mut m, T0 + 2, release(&a("x2"), 2));
    assert_eq!(
        m.lease(&a("x2")).map(|l| l.lease_id),
        Some(LeaseId(9)),
        "handed to w3"
    );
    run(&mut m, T0 + 3, release(&a("x1"), 1));
    granted(run(&mut m, T0 + 3, bounded(&a("x3"), "r7", 10, 0, limits)));
    m.check_indexes().expect("indexes");
}

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        tenant: usize,
        res: usize,
        wait: bool,
    },
    Release {
        tenant: usize,
        res: usize,
    },
    Cancel {
        tenant: usize,
        res: usize,
        rid: u32,
    },
    Tick {
        advance: u64,
    },
    CreateKey {
        tenant: usize,
    },
    RevokeKey {
        key: usize,
    },
    WithKey {
        key: usize,
        res: usize,
    },
    Restore,
}

const TENANTS: [&str; 3] = ["default", "a", "b"];
const LIMITS: TenantLimits = TenantLimits {
    max_leases: 2,
    max_waiters: 2,
};

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..3usize, any::<bool>()).prop_map(|(tenant, res, wait)| Op::Acquire { tenant, res, wait }),
        2 => (0..3usize, 0..3usize).prop_map(|(tenant, res)| Op::Release { tenant, res }),
        1 => (0..3usize, 0..3usize, 0..40u32).prop_map(|(tenant, res, rid)| Op::Cancel { tenant, res, rid }),
        2 => (0..40_000u64).prop_map(|advance| Op::Tick { advance }),
        1 => (0..3usize).prop_map(|tenant| Op::CreateKey { tenant }),
        1 => (0..6usize).prop_map(|key| Op::RevokeKey { key }),
        2 => (0..6usize, 0..3usize).prop_map(|(key, res)| Op::WithKey { key, res }),
        1 => Just(Op::Restore),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After every step: the per-tenant counts agree with the state (`check_indexes` rebuilds
    /// them from scratch), no tenant has more waiters than its bound, no tenant holds more
    /// leases than its bound plus hand-offs to its admitted waiters, and a call made with a
    /// revoked or unknown key changes nothing.
    #[test]
    fn tenant_counts_and_key_checks_hold_over_random_histories(ops in proptest::collection::vec(op(), 1..80)) {
        let mut m = LockMachine::new();
        let mut now = T0;
        let mut next = 0u32;
        // Every lease granted so far: (stored resource, lease id), to release by.
        let mut leases: Vec<(String, u128)> = Vec::new();
        let mut keys: Vec<(String, usize)> = Vec::new();
        for op in ops {
            next += 1;
            let lease_id = u128::from(next);
            let name = |tenant: usize, res: usize| scoped_name(TENANTS[tenant], &format!("r{res}"));
            match op {
                Op::Acquire { tenant, res, wait } => {
                    let r = name(tenant, res);
                    let resp = run(&mut m, now, bounded(&r, &format!("q{next}"), lease_id, if wait { 5_000 } else { 0 }, LIMITS));
                    if let Response::Granted(g) = resp {
                        leases.push((r, g.lease_id.0));
                    } else if matches!(resp, Response::Queued { .. }) {
                        leases.push((r, lease_id));
                    }
                }
                Op::Release { tenant, res } => {
                    let r = name(tenant, res);
                    if let Some((_, id)) = leases.iter().rev().find(|(n, _)| *n == r) {
                        run(&mut m, now, release(&r, *id));
                    }
                }
                Op::Cancel { tenant, res, rid } => {
                    run(&mut m, now, cancel(&name(tenant, res), &format!("q{rid}")));
                }
                Op::Tick { advance } => {
                    now += advance;
                    run(&mut m, now, tick());
                }
                Op::CreateKey { tenant } => {
                    let id = format!("k{next}");
                    prop_assert_eq!(run(&mut m, now, Command::KeyCreate(key(&id, TENANTS[tenant]))), Response::KeyCreated(true));
                    keys.push((id, tenant));
                }
                Op::RevokeKey { key } => {
                    if let Some((id, _)) = keys.get(key) {
                        run(&mut m, now, Command::KeyRevoke { id: id.clone() });
                    }
                }
                Op::WithKey { key, res } => {
                    let Some((id, tenant)) = keys.get(key).cloned() else { continue };
                    let r = name(tenant, res);
                    let live = m.api_key(&id).is_some();
                    let before = m.image();
                    let resp = run(&mut m, now, as_key(&id, bounded(&r, &format!("q{next}"), lease_id, 0, LIMITS)));
                    if live {
                        prop_assert_ne!(&resp, &Response::KeyRefused);
                        if let Response::Granted(g) = resp {
                            leases.push((r, g.lease_id.0));
                        }
                    } else {
                        prop_assert_eq!(&resp, &Response::KeyRefused);
                        let mut after = m.image();
                        after.now_ms = before.now_ms;
                        after.commands = before.commands;
                        prop_assert_eq!(after, before);
                    }
                }
                Op::Restore => m = restore(&m),
            }
            prop_assert_eq!(m.check_indexes(), Ok(()));
            for tenant in TENANTS {
                let mut held = 0u32;
                let mut waiting = 0u32;
                for res in 0..3 {
                    let r = scoped_name(tenant, &format!("r{res}"));
                    if m.lease(&r).is_some_and(|l| l.expires_at_ms > m.now_ms()) || m.lease(&r).is_some() {
                        held += 1;
                    }
                    waiting += m.resource(&r).map_or(0, |s| s.waiters.len() as u32);
                }
                prop_assert!(waiting <= LIMITS.max_waiters, "{tenant}: {waiting} waiters");
                prop_assert!(held <= LIMITS.max_leases + LIMITS.max_waiters, "{tenant}: {held} leases");
            }
        }
    }
}
