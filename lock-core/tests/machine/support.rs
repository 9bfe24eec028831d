//! Building blocks shared by the rule tests, the admission tests and the random walk: commands
//! with fixed defaults, appliers that stamp them with a log time and a term, and views of the
//! machine's state.

use lock_core::machine::{
    Acquire, AdmitOutcome, Command, Effect, FenceGrant, Grant, LeaseId, LockMachine, MachineImage,
    Proposal, Response,
};

/// Log time of the first command.
pub const T0: u64 = 1_700_000_000_000;
/// Failover grace a leader change adds to every live deadline.
pub const GRACE: u64 = 5_000;
pub const TTL: u64 = 30_000;
/// How long a dedup record is kept (the retry window).
pub const RETAIN: u64 = 600_000;
/// How long a proxy's admission grant lasts.
pub const GRANT: u64 = 2_000;
/// Two fencing proxies.
pub const P1: u64 = 1;
pub const P2: u64 = 2;

// ---- commands ----------------------------------------------------------------------------

pub fn at(now_ms: u64, cmd: Command) -> Proposal {
    Proposal {
        now_ms,
        failover_grace_ms: GRACE,
        cmd,
    }
}

pub fn lease(n: u128) -> LeaseId {
    LeaseId(n)
}

/// A try-once acquire with the default TTL, retry window and queue bounds.
pub fn acq(resource: &str, request_id: &str, lease_id: u128) -> Acquire {
    Acquire {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
        holder: Some(format!("holder-{request_id}")),
        ttl_ms: TTL,
        wait_timeout_ms: 0,
        lease_id: lease(lease_id),
        retain_ms: RETAIN,
        max_waiters: 64,
        max_total_waiters: 1024,
        tenant_limits: None,
    }
}

pub fn try_once(resource: &str, request_id: &str, lease_id: u128) -> Command {
    Command::Acquire(acq(resource, request_id, lease_id))
}

pub fn wait(resource: &str, request_id: &str, lease_id: u128, wait_timeout_ms: u64) -> Command {
    Command::Acquire(Acquire {
        wait_timeout_ms,
        ..acq(resource, request_id, lease_id)
    })
}

/// An acquire with its own TTL and wait.
pub fn acquire_with(
    resource: &str,
    request_id: &str,
    lease_id: u128,
    ttl_ms: u64,
    wait_timeout_ms: u64,
) -> Command {
    Command::Acquire(Acquire {
        ttl_ms,
        wait_timeout_ms,
        ..acq(resource, request_id, lease_id)
    })
}

pub fn renew(resource: &str, lease_id: u128) -> Command {
    Command::Renew {
        resource: resource.to_string(),
        lease_id: lease(lease_id),
    }
}

pub fn release(resource: &str, lease_id: u128) -> Command {
    Command::Release {
        resource: resource.to_string(),
        lease_id: lease(lease_id),
    }
}

pub fn cancel(resource: &str, request_id: &str) -> Command {
    Command::Cancel {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
    }
}

/// A proxy asks to forward writes for `resource` with `token`, for `GRANT` ms.
pub fn admit(resource: &str, token: u64, proxy: u64) -> Command {
    Command::Admit {
        resource: resource.to_string(),
        fencing_token: token,
        proxy,
        grant_ms: GRANT,
    }
}

pub fn tick() -> Command {
    Command::Tick { max_items: 10_000 }
}

// ---- applying ----------------------------------------------------------------------------

/// Applies in term 1 and returns the response only.
pub fn run(m: &mut LockMachine, now_ms: u64, cmd: Command) -> Response {
    m.apply(&at(now_ms, cmd), 1).0
}

/// Applies in term 2 (after a leader change) and returns the response only.
pub fn run2(m: &mut LockMachine, now_ms: u64, cmd: Command) -> Response {
    m.apply(&at(now_ms, cmd), 2).0
}

/// Applies an admission in term 1 and returns its outcome.
#[track_caller]
pub fn admit_at(
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
pub fn granted(resp: Response) -> Grant {
    match resp {
        Response::Granted(g) => g,
        other => panic!("expected Granted, got {other:?}"),
    }
}

/// Snapshot round trip through the serialized form a snapshot file would hold.
pub fn restore(m: &LockMachine) -> LockMachine {
    let bytes = serde_json::to_vec(&m.image()).expect("image serializes");
    let image: MachineImage = serde_json::from_slice(&bytes).expect("image deserializes");
    LockMachine::from_image(image)
}

// ---- views -------------------------------------------------------------------------------

pub fn holder_of(m: &LockMachine, resource: &str) -> Option<(LeaseId, u64)> {
    m.lease(resource).map(|l| (l.lease_id, l.fencing_token))
}

/// Request ids queued on `resource`, head first.
pub fn waiting(m: &LockMachine, resource: &str) -> Vec<String> {
    m.resource(resource)
        .map(|r| r.waiters.iter().map(|w| w.request_id.clone()).collect())
        .unwrap_or_default()
}

/// The proxies' admission grants recorded on `resource`.
pub fn grants(m: &LockMachine, resource: &str) -> Vec<FenceGrant> {
    m.resource(resource)
        .map(|r| r.grants.to_vec())
        .unwrap_or_default()
}

/// When a deferred resource may issue its next token.
pub fn reissue_at(m: &LockMachine, resource: &str) -> Option<u64> {
    m.resource(resource).and_then(|r| r.reissue_at_ms)
}

/// (request id, token) of each hand-off among `fx`.
pub fn handed_off(fx: &[Effect]) -> Vec<(String, u64)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::HandedOff { request_id, grant } => {
                Some((request_id.clone(), grant.fencing_token))
            }
            _ => None,
        })
        .collect()
}
