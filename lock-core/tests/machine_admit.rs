//! `Command::Admit`, the fencing proxy's admission, tested by the state machine's outputs
//! (STYLE.md §3). One test per rule; each cites the SPEC rule it serves: §3.3 (never forward a
//! token below the highest issued or admitted, nor one not issued for the resource) and §5's
//! epoch barrier (no newer token while a grant for an older one lives).
//!
//! The random-sequence model in `machine_model.rs` also drives Admit; these are the readable,
//! hand-picked cases.

use lock_core::machine::{
    Acquire, AdmitOutcome, Command, Effect, FenceGrant, Grant, LeaseId, LockMachine, MachineImage,
    Proposal, Response, DEFAULT_IDLE_RETAIN_MS,
};

const T0: u64 = 1_700_000_000_000;
const GRACE: u64 = 5_000;
const TTL: u64 = 30_000;
const GRANT: u64 = 2_000;
const P1: u64 = 1;
const P2: u64 = 2;

// ---- helpers ---------------------------------------------------------------------------

fn at(now_ms: u64, cmd: Command) -> Proposal {
    Proposal {
        now_ms,
        failover_grace_ms: GRACE,
        cmd,
    }
}

fn acq(resource: &str, request_id: &str, lease_id: u128, ttl_ms: u64, wait_ms: u64) -> Command {
    Command::Acquire(Acquire {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
        holder: Some(request_id.to_string()),
        ttl_ms,
        wait_timeout_ms: wait_ms,
        lease_id: LeaseId(lease_id),
        retain_ms: 600_000,
        max_waiters: 64,
        max_total_waiters: 1024,
    })
}

fn try_once(resource: &str, request_id: &str, lease_id: u128) -> Command {
    acq(resource, request_id, lease_id, TTL, 0)
}

fn release(resource: &str, lease_id: u128) -> Command {
    Command::Release {
        resource: resource.to_string(),
        lease_id: LeaseId(lease_id),
    }
}

fn renew(resource: &str, lease_id: u128) -> Command {
    Command::Renew {
        resource: resource.to_string(),
        lease_id: LeaseId(lease_id),
    }
}

fn admit(resource: &str, token: u64, proxy: u64) -> Command {
    Command::Admit {
        resource: resource.to_string(),
        fencing_token: token,
        proxy,
        grant_ms: GRANT,
    }
}

fn tick() -> Command {
    Command::Tick { max_items: 10_000 }
}

/// Applies in term 1 and returns the response only.
fn run(m: &mut LockMachine, now_ms: u64, cmd: Command) -> Response {
    m.apply(&at(now_ms, cmd), 1).0
}

/// Applies in term 1 and returns the admission outcome.
#[track_caller]
fn admit_at(
    m: &mut LockMachine,
    now_ms: u64,
    resource: &str,
    token: u64,
    proxy: u64,
) -> AdmitOutcome {
    match run(m, now_ms, admit(resource, token, proxy)) {
        Response::Admit(o) => o,
        other => panic!("expected an admission outcome, got {other:?}"),
    }
}

#[track_caller]
fn granted(resp: Response) -> Grant {
    match resp {
        Response::Granted(g) => g,
        other => panic!("expected Granted, got {other:?}"),
    }
}

fn grants(m: &LockMachine, resource: &str) -> Vec<FenceGrant> {
    m.resource(resource)
        .map(|r| r.grants.clone())
        .unwrap_or_default()
}

fn reissue_at(m: &LockMachine, resource: &str) -> Option<u64> {
    m.resource(resource).and_then(|r| r.reissue_at_ms)
}

fn handed_off(fx: &[Effect]) -> Vec<(String, u64)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::HandedOff { request_id, grant } => {
                Some((request_id.clone(), grant.fencing_token))
            }
            _ => None,
        })
        .collect()
}

/// Snapshot round trip through the serialized form a snapshot file would hold.
fn restore(m: &LockMachine) -> LockMachine {
    let bytes = serde_json::to_vec(&m.image()).expect("image serializes");
    let image: MachineImage = serde_json::from_slice(&bytes).expect("image deserializes");
    LockMachine::from_image(image)
}

// ---- what is admitted ----------------------------------------------------------------------

/// SPEC §3.3: only the resource's current token, while its lease is live, is admitted; the
/// grant lasts `grant_ms` and is recorded per proxy.
#[test]
fn admits_only_the_current_live_token() {
    let mut m = LockMachine::new();
    let a = granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(a.fencing_token, 1);

    assert_eq!(
        admit_at(&mut m, T0 + 10, "a", 1, P1),
        AdmitOutcome::Admitted { grant_ms: GRANT }
    );
    assert_eq!(
        grants(&m, "a"),
        vec![FenceGrant {
            proxy: P1,
            fencing_token: 1,
            until_ms: T0 + 10 + GRANT
        }]
    );
    assert_eq!(m.resource("a").map(|r| r.admitted), Some(1));

    // A second proxy gets its own grant; the first proxy asking again extends its own entry
    // instead of adding one.
    assert_eq!(
        admit_at(&mut m, T0 + 20, "a", 1, P2),
        AdmitOutcome::Admitted { grant_ms: GRANT }
    );
    assert_eq!(
        admit_at(&mut m, T0 + 500, "a", 1, P1),
        AdmitOutcome::Admitted { grant_ms: GRANT }
    );
    let mut g = grants(&m, "a");
    g.sort_by_key(|g| g.proxy);
    assert_eq!(
        g,
        vec![
            FenceGrant {
                proxy: P1,
                fencing_token: 1,
                until_ms: T0 + 500 + GRANT
            },
            FenceGrant {
                proxy: P2,
                fencing_token: 1,
                until_ms: T0 + 20 + GRANT
            },
        ]
    );
    // Admission issues no token and changes no lease.
    assert_eq!(m.last_token(), 1);
    assert_eq!(m.lease("a").map(|l| l.expires_at_ms), Some(T0 + TTL));
    m.check_indexes().expect("indexes");
}

/// SPEC §3.3: a token above anything issued for the resource was never issued for it:
/// `Unknown`, whether or not the resource has a record, and no grant is recorded.
#[test]
fn never_issued_tokens_are_unknown() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(admit_at(&mut m, T0 + 1, "a", 2, P1), AdmitOutcome::Unknown);
    assert_eq!(
        admit_at(&mut m, T0 + 1, "a", 999, P1),
        AdmitOutcome::Unknown
    );
    // A resource nobody ever locked: no record, nothing below the gc floor.
    assert_eq!(
        admit_at(&mut m, T0 + 1, "never", 1, P1),
        AdmitOutcome::Unknown
    );
    assert!(m.resource("never").is_none(), "admission created a record");
    assert!(grants(&m, "a").is_empty());
    assert_eq!(m.resource("a").map(|r| r.admitted), Some(0));
}

/// SPEC §3.3 "nor a token that was not issued for R": another resource's token is refused.
/// Which code it gets depends only on its value relative to R's own last token — above it,
/// `Unknown`; below it, `Stale` (it is below R's highest, which is just as fatal). It is never
/// admitted either way.
#[test]
fn another_resources_token_is_never_admitted() {
    let mut m = LockMachine::new();
    let a = granted(run(&mut m, T0, try_once("a", "ra", 1))).fencing_token; // 1
    let b = granted(run(&mut m, T0, try_once("b", "rb", 2))).fencing_token; // 2
    assert_eq!((a, b), (1, 2));
    // b's token on a: larger than anything issued for a.
    assert_eq!(admit_at(&mut m, T0 + 1, "a", b, P1), AdmitOutcome::Unknown);
    // a's token on b: smaller than b's current token.
    assert_eq!(
        admit_at(&mut m, T0 + 1, "b", a, P1),
        AdmitOutcome::Stale { highest: b }
    );
    assert!(grants(&m, "a").is_empty() && grants(&m, "b").is_empty());
}

/// SPEC §3.3 / §9 (the zombie): once a newer token was issued, the old one is `Stale` and the
/// answer names the newer one.
#[test]
fn an_older_token_is_stale_and_names_the_highest() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, acq("a", "A", 1, 3_000, 0)));
    assert!(matches!(
        admit_at(&mut m, T0, "a", 1, P1),
        AdmitOutcome::Admitted { .. }
    ));
    // A pauses past its lease; B takes the lock.
    let b = granted(run(&mut m, T0 + 3_000, try_once("a", "B", 2)));
    assert_eq!(b.fencing_token, 2);
    assert_eq!(
        admit_at(&mut m, T0 + 3_001, "a", 1, P1),
        AdmitOutcome::Stale { highest: 2 }
    );
    assert_eq!(
        admit_at(&mut m, T0 + 3_001, "a", 2, P2),
        AdmitOutcome::Admitted { grant_ms: GRANT }
    );
    assert_eq!(m.resource("a").map(|r| r.admitted), Some(2));
}

/// SPEC §3.3 (stricter than classic fencing, docs/fencing.md): the resource's latest token
/// whose lease has ended — by release or by expiry, even before any command expired it — is
/// `Ended`, not admitted.
#[test]
fn the_latest_token_of_an_ended_lease_is_ended() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "r1", 1)));
    assert_eq!(
        run(&mut m, T0 + 10, release("a", 1)),
        Response::Released(true)
    );
    assert_eq!(admit_at(&mut m, T0 + 20, "a", 1, P1), AdmitOutcome::Ended);

    granted(run(&mut m, T0 + 30, acq("b", "r2", 2, 1_000, 0)));
    // Exactly at its expiry, with no tick in between: the admission itself settles it.
    let (resp, fx) = m.apply(&at(T0 + 1_030, admit("b", 2, P1)), 1);
    assert_eq!(resp, Response::Admit(AdmitOutcome::Ended));
    assert_eq!(
        fx,
        vec![Effect::Expired {
            resource: "b".into(),
            fencing_token: 2
        }]
    );
    assert!(grants(&m, "a").is_empty() && grants(&m, "b").is_empty());
}

/// Epoch barrier (SPEC §5): a grant never outlives the lease, so an expiring lease never
/// delays the next holder.
#[test]
fn a_grant_is_capped_at_the_lease_expiry() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, acq("a", "r1", 1, 1_500, 0)));
    assert_eq!(
        admit_at(&mut m, T0 + 500, "a", 1, P1),
        AdmitOutcome::Admitted { grant_ms: 1_000 }
    );
    assert_eq!(grants(&m, "a")[0].until_ms, T0 + 1_500);
    // A renewal extends the lease (to T0 + 2100); the next admission is capped at the new
    // expiry, and the proxy's grant is extended to it.
    run(&mut m, T0 + 600, renew("a", 1));
    assert_eq!(
        admit_at(&mut m, T0 + 700, "a", 1, P1),
        AdmitOutcome::Admitted { grant_ms: 1_400 }
    );
    assert_eq!(grants(&m, "a").len(), 1);
    assert_eq!(grants(&m, "a")[0].until_ms, T0 + 2_100);
}

// ---- the epoch barrier: release defers, expiry does not ------------------------------------

/// Epoch barrier (SPEC §5): releasing while a grant lives defers the next token until the
/// grant ends. A try-once acquire gets `Held` with the grant's end as `retry_after_ms`; a
/// waiter is handed the lock only by a Tick at or after the grant's end.
#[test]
fn release_with_a_live_grant_defers_the_next_token_until_the_grant_ends() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    assert!(matches!(
        admit_at(&mut m, T0 + 100, "a", 1, P1),
        AdmitOutcome::Admitted { .. }
    ));
    let grant_end = T0 + 100 + GRANT;

    assert_eq!(
        run(&mut m, T0 + 200, release("a", 1)),
        Response::Released(true)
    );
    assert_eq!(m.lease("a"), None);
    assert_eq!(reissue_at(&m, "a"), Some(grant_end));
    assert_eq!(m.next_deadline(), Some(grant_end));
    // The released token is not admitted any more, even though its grant is still recorded.
    assert_eq!(admit_at(&mut m, T0 + 250, "a", 1, P2), AdmitOutcome::Ended);

    assert_eq!(
        run(&mut m, T0 + 300, try_once("a", "C", 3)),
        Response::Held {
            retry_after_ms: grant_end - (T0 + 300)
        }
    );
    assert_eq!(
        run(&mut m, T0 + 400, acq("a", "B", 2, TTL, 10_000)),
        Response::Queued { position: 1 }
    );
    assert_eq!(m.last_token(), 1, "no token while the grant lives");

    // One ms before the grant ends nothing happens.
    let (_, fx) = m.apply(&at(grant_end - 1, tick()), 1);
    assert!(handed_off(&fx).is_empty(), "{fx:?}");
    assert_eq!(m.lease("a"), None);

    let (resp, fx) = m.apply(&at(grant_end, tick()), 1);
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
    assert!(
        matches!(resp, Response::Ticked { handed_off: 1, .. }),
        "{resp:?}"
    );
    assert_eq!(reissue_at(&m, "a"), None);
    let l = m.lease("a").expect("B holds");
    assert_eq!((l.fencing_token, l.granted_at_ms), (2, grant_end));
    assert_eq!(
        admit_at(&mut m, grant_end + 1, "a", 1, P1),
        AdmitOutcome::Stale { highest: 2 }
    );
    m.check_indexes().expect("indexes");
}

/// Epoch barrier: with no waiter, the deferral is also resolved lazily by the next command
/// that touches the resource at or after the grant's end (no Tick needed), and the resource
/// becomes idle only then.
#[test]
fn a_deferred_resource_is_granted_by_the_first_acquire_after_the_grant() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1);
    run(&mut m, T0 + 1, release("a", 1));
    assert_eq!(m.resource("a").and_then(|r| r.idle_until_ms), None);
    let g = granted(run(&mut m, T0 + GRANT, try_once("a", "B", 2)));
    assert_eq!(g.fencing_token, 2);
    assert_eq!(reissue_at(&m, "a"), None);
    m.check_indexes().expect("indexes");
}

/// The deferral lasts until the *last* live grant ends, over all proxies; grants that already
/// ended do not defer at all.
#[test]
fn release_waits_for_the_latest_grant_and_ignores_ended_ones() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1);
    admit_at(&mut m, T0 + 700, "a", 1, P2);
    run(&mut m, T0 + 800, release("a", 1));
    assert_eq!(reissue_at(&m, "a"), Some(T0 + 700 + GRANT));

    // A lease whose grants all ran out is released without deferral.
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("b", "A", 11)));
    admit_at(&mut m, T0, "b", 1, P1);
    run(&mut m, T0 + GRANT, release("b", 11));
    assert_eq!(reissue_at(&m, "b"), None);
    assert_eq!(
        granted(run(&mut m, T0 + GRANT, try_once("b", "B", 12))).fencing_token,
        2
    );
}

/// Epoch barrier: expiry never defers, because grants end with the lease. A waiter is handed
/// the lock in the same Tick that expires the old lease.
#[test]
fn expiry_hands_off_at_once() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, acq("a", "A", 1, 1_500, 0)));
    admit_at(&mut m, T0 + 100, "a", 1, P1);
    admit_at(&mut m, T0 + 200, "a", 1, P2);
    assert_eq!(
        run(&mut m, T0 + 300, acq("a", "B", 2, TTL, 10_000)),
        Response::Queued { position: 1 }
    );
    let (_, fx) = m.apply(&at(T0 + 1_500, tick()), 1);
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
    assert_eq!(reissue_at(&m, "a"), None);

    // Same for a try-once acquire arriving exactly at the expiry.
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, acq("c", "A", 3, 1_500, 0)));
    admit_at(&mut m, T0 + 100, "c", 1, P1);
    let g = granted(run(&mut m, T0 + 1_500, try_once("c", "C", 4)));
    assert_eq!(g.fencing_token, 2);
}

// ---- durability and failover ---------------------------------------------------------------

/// SPEC §5 "durable and replicated": grants, the admitted token and a pending deferral are
/// part of the snapshot image; a restored machine defers and hands off exactly like the
/// original.
#[test]
fn grants_and_deferrals_survive_a_snapshot_round_trip() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0 + 100, "a", 1, P1);
    let restored = restore(&m);
    assert_eq!(restored.resource("a"), m.resource("a"));
    restored.check_indexes().expect("indexes after restore");

    // Release on the restored machine defers just the same.
    let mut m = restored;
    run(&mut m, T0 + 200, release("a", 1));
    run(&mut m, T0 + 300, acq("a", "B", 2, TTL, 10_000));
    let mut m = restore(&m);
    assert_eq!(reissue_at(&m, "a"), Some(T0 + 100 + GRANT));
    assert_eq!(m.next_deadline(), Some(T0 + 100 + GRANT));
    m.check_indexes().expect("indexes after restore");
    let (_, fx) = m.apply(&at(T0 + 100 + GRANT - 1, tick()), 1);
    assert!(handed_off(&fx).is_empty());
    let (_, fx) = m.apply(&at(T0 + 100 + GRANT, tick()), 1);
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
}

/// SPEC §3.7 applied to grants: a leader change shifts every live grant (and a pending
/// deferral) like a lease — by the time since the last stamp plus the grace — so a new leader
/// never lets a newer token exist while an old grant may still be in use. Ended grants stay.
#[test]
fn a_term_change_shifts_live_grants_and_deferrals_like_leases() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1); // until T0 + 2000
    granted(run(&mut m, T0, try_once("b", "A", 2)));
    admit_at(&mut m, T0, "b", 2, P1); // until T0 + 2000
    granted(run(&mut m, T0, acq("c", "A", 3, 1_000, 0)));
    admit_at(&mut m, T0 + 100, "c", 3, P1); // until T0 + 1000 (capped at the lease)
    run(&mut m, T0 + 500, release("b", 2)); // deferred until T0 + 2000
    assert_eq!(reissue_at(&m, "b"), Some(T0 + GRANT));

    // Log time stands at T0 + 500. The new leader's first stamp is T0 + 1500: shift by
    // 1000 + GRACE for everything still live at T0 + 500.
    let shift = 1_000 + GRACE;
    m.apply(&at(T0 + 1_500, tick()), 2);
    assert_eq!(grants(&m, "a")[0].until_ms, T0 + GRANT + shift);
    assert_eq!(
        m.lease("a").map(|l| l.expires_at_ms),
        Some(T0 + TTL + shift)
    );
    assert_eq!(reissue_at(&m, "b"), Some(T0 + GRANT + shift));
    // c's grant and lease were live at T0 + 500 too: both shifted, still equal.
    assert_eq!(grants(&m, "c")[0].until_ms, T0 + 1_000 + shift);
    assert_eq!(
        m.lease("c").map(|l| l.expires_at_ms),
        Some(T0 + 1_000 + shift)
    );
    m.check_indexes().expect("indexes");

    // A release of a in the new term defers until the shifted grant end.
    run2(&mut m, T0 + 1_600, release("a", 1));
    assert_eq!(reissue_at(&m, "a"), Some(T0 + GRANT + shift));
    assert!(matches!(
        run2(&mut m, T0 + GRANT + 1, try_once("a", "B", 4)),
        Response::Held { .. }
    ));
    assert_eq!(
        granted(run2(&mut m, T0 + GRANT + shift, try_once("a", "B2", 5))).fencing_token,
        4
    );
}

/// Applies in term 2.
fn run2(m: &mut LockMachine, now_ms: u64, cmd: Command) -> Response {
    m.apply(&at(now_ms, cmd), 2).0
}

/// A grant that had ended before the failover is not revived by the shift.
#[test]
fn a_term_change_does_not_revive_ended_grants() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1); // until T0 + 2000
    run(&mut m, T0 + 3_000, tick());
    m.apply(&at(T0 + 4_000, tick()), 2);
    assert_eq!(grants(&m, "a")[0].until_ms, T0 + GRANT);
    run2(&mut m, T0 + 4_001, release("a", 1));
    assert_eq!(reissue_at(&m, "a"), None);
}

// ---- garbage collection ---------------------------------------------------------------------

/// SPEC §3.2–3.3 after gc: when an idle record is dropped, its tokens stay `Stale` through the
/// global `gc_floor`, and a token above the floor is still `Unknown`.
#[test]
fn dropped_idle_records_keep_old_tokens_stale_via_the_gc_floor() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    admit_at(&mut m, T0, "a", 1, P1);
    run(&mut m, T0 + 10, release("a", 1)); // deferred until T0 + 2000
                                           // The record cannot be dropped while deferred; it becomes idle when the deferral ends.
    run(&mut m, T0 + GRANT, tick());
    let idle_until = m
        .resource("a")
        .and_then(|r| r.idle_until_ms)
        .expect("idle after the deferral");
    assert_eq!(idle_until, T0 + GRANT + DEFAULT_IDLE_RETAIN_MS);
    run(&mut m, idle_until, tick());
    assert!(m.resource("a").is_none(), "idle record dropped");

    assert_eq!(
        admit_at(&mut m, idle_until + 1, "a", 1, P1),
        AdmitOutcome::Stale { highest: 1 }
    );
    assert_eq!(
        admit_at(&mut m, idle_until + 1, "a", 2, P1),
        AdmitOutcome::Unknown
    );
    // The next lease on the resource still gets a larger token (SPEC §3.2).
    let g = granted(run(&mut m, idle_until + 2, try_once("a", "B", 2)));
    assert_eq!(g.fencing_token, 2);
    assert_eq!(
        admit_at(&mut m, idle_until + 3, "a", 1, P1),
        AdmitOutcome::Stale { highest: 2 }
    );
}

// ---- an operator's forced release ----------------------------------------------------------

fn force_release(resource: &str) -> Command {
    Command::ForceRelease {
        resource: resource.to_string(),
        operator: "alice".to_string(),
    }
}

/// A forced release ends the live lease whoever holds it and has a release's fencing
/// consequences: the ended token is never admitted again, and while a proxy grant for it lives
/// no newer token is issued (the waiter gets the lock, with a newer token, only at the grant's
/// end).
#[test]
fn forced_release_fences_like_a_release_by_the_holder() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    assert!(matches!(
        admit_at(&mut m, T0 + 100, "a", 1, P1),
        AdmitOutcome::Admitted { .. }
    ));
    let grant_end = T0 + 100 + GRANT;
    assert_eq!(
        run(&mut m, T0 + 150, acq("a", "B", 2, TTL, 10_000)),
        Response::Queued { position: 1 }
    );

    assert_eq!(
        run(&mut m, T0 + 200, force_release("a")),
        Response::ForceReleased {
            fencing_token: Some(1)
        }
    );
    assert_eq!(m.lease("a"), None);
    assert_eq!(reissue_at(&m, "a"), Some(grant_end));
    assert_eq!(admit_at(&mut m, T0 + 250, "a", 1, P2), AdmitOutcome::Ended);
    // The old holder can neither renew nor release any more.
    assert_eq!(run(&mut m, T0 + 260, renew("a", 1)), Response::LeaseLost);
    assert_eq!(
        run(&mut m, T0 + 270, release("a", 1)),
        Response::Released(false)
    );
    assert_eq!(m.last_token(), 1, "no token while the grant lives");

    let (_, fx) = m.apply(&at(grant_end, tick()), 1);
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);
    assert_eq!(
        admit_at(&mut m, grant_end + 1, "a", 1, P1),
        AdmitOutcome::Stale { highest: 2 }
    );
    m.check_indexes().expect("indexes");
}

/// Without a proxy grant the lock passes to the head waiter in the same command, with a
/// newer token; forcing a free resource changes nothing and says so.
#[test]
fn forced_release_hands_off_at_once_without_grants_and_is_a_noop_when_free() {
    let mut m = LockMachine::new();
    granted(run(&mut m, T0, try_once("a", "A", 1)));
    run(&mut m, T0 + 10, acq("a", "B", 2, TTL, 10_000));
    let (resp, fx) = m.apply(&at(T0 + 20, force_release("a")), 1);
    assert_eq!(
        resp,
        Response::ForceReleased {
            fencing_token: Some(1)
        }
    );
    assert_eq!(handed_off(&fx), vec![("B".to_string(), 2)]);

    let mut idle = LockMachine::new();
    assert_eq!(
        run(&mut idle, T0, force_release("nothing")),
        Response::ForceReleased {
            fencing_token: None
        }
    );
    assert_eq!(idle.last_token(), 0);
    assert!(idle.resource("nothing").is_none(), "no record is created");
    idle.check_indexes().expect("indexes");
}
