//! Idempotency records of the fencing proxy: what a retried `Idempotency-Key` request gets.
//!
//! One record per (tenant, route, key). Unlike the lock state these records do not live in
//! memory: a day of keys at a thousand new keys a second is tens of millions of records, so the
//! storage layer keeps them in a fjall keyspace and calls [`IdempotencyMachine::decide`] with the
//! record it read. This file is the whole decision: pure, no IO, no clock (time is the stamped log
//! time), so every replica applying the same command to the same record writes the same result.
//!
//! States and transitions (the proxy's view, `docs/idempotency.md` has the full table):
//!
//! ```text
//!   (none) --Claim--> Processing{owner, attempt, lease}
//!   Processing --Complete(final)--> Succeeded / Failed   (the stored answer, replayed)
//!   Processing --Complete(not run)--> (none)             (nothing reached the upstream)
//!   Processing --Complete(unknown) or lease over--> Unknown
//!   Unknown --Reconcile(ran)--> Succeeded                (the upstream's lookup said so)
//!   Unknown --Reconcile(never ran)--> Processing          (one new attempt)
//!   Unknown --Resolve(ran)--> Succeeded                  (an operator's answer)
//!   Unknown --Resolve(never ran)--> (none)               (an operator frees the key)
//!   any --retention over--> expired (refused) --tombstone over--> (none)
//! ```
//!
//! Unknown is a state, not a guess: a processing record whose owner's lease ended is never
//! handed to another request to run again; only proof from the upstream, or an operator's
//! audited word, moves it on.

use serde::{Deserialize, Serialize};

/// Which record a command is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct IdemScope {
    pub tenant: String,
    /// The route's path pattern (stable across config reloads that keep the route).
    pub route: String,
    pub key: String,
}

/// An upstream answer as the proxy stores and replays it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredAnswer {
    pub status: u16,
    /// The response headers worth replaying (content type, location, ...), in order.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    pub body: StoredBody,
    /// The answer was learnt from the route's reconciliation lookup, not from the original
    /// request's response.
    #[serde(default)]
    pub reconciled: bool,
}

/// A stored response body: inline up to the proxy's cap, else only its digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredBody {
    /// The body, base64.
    Inline(String),
    /// The body was larger than the cap: its length and BLAKE2b-256 digest (hex).
    Digest { len: u64, blake2b: String },
}

/// Where a record stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdemState {
    /// `owner` (a node id) forwards attempt `attempt`; its claim lasts until `lease_until_ms`.
    Processing {
        owner: u64,
        attempt: u64,
        lease_until_ms: u64,
    },
    /// A final 2xx (or other non-error) answer.
    Succeeded(StoredAnswer),
    /// A final 4xx answer: the request was refused by the upstream, replayed as such.
    Failed(StoredAnswer),
    /// The answer of attempt `attempt` is lost: the upstream may or may not have acted.
    Unknown { attempt: u64 },
}

/// One stored record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemRecord {
    /// The request fingerprint (method, path, body hash, listed headers), opaque here.
    pub fingerprint: String,
    pub state: IdemState,
    pub created_ms: u64,
    /// After this the key is refused as expired (the tombstone window) ...
    pub expires_at_ms: u64,
    /// ... and after this the record is forgotten and the key is new again.
    pub purge_at_ms: u64,
}

/// A command on one record, proposed by a proxy and committed through raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdemCommand {
    /// A request arrived: claim the key for `owner`'s attempt, or learn why not.
    Claim {
        scope: IdemScope,
        fingerprint: String,
        owner: u64,
        /// Chosen at random by the proposer, unique per claim.
        attempt: u64,
        lease_ms: u64,
        retain_ms: u64,
        tombstone_ms: u64,
    },
    /// The owner of `attempt` reports how its forward ended.
    Complete {
        scope: IdemScope,
        attempt: u64,
        outcome: Completion,
    },
    /// The answer of `attempt` was lost and the route's lookup was asked what happened.
    Reconcile {
        scope: IdemScope,
        fingerprint: String,
        /// The attempt whose answer was lost (from the `Unknown` outcome).
        lost_attempt: u64,
        finding: Finding,
        /// For `Finding::NeverRan`: the new attempt the proposer will forward.
        owner: u64,
        attempt: u64,
        lease_ms: u64,
    },
    /// An operator settles the `Unknown` record of `attempt` (the attempt the operator was
    /// shown, so a record that moved on meanwhile is left alone).
    Resolve {
        scope: IdemScope,
        attempt: u64,
        /// `Ran`: the record becomes `Succeeded` with this answer. `NeverRan`: the record is
        /// dropped and the key is free for one new attempt.
        finding: Finding,
        operator: String,
    },
}

impl IdemCommand {
    pub fn scope(&self) -> &IdemScope {
        match self {
            IdemCommand::Claim { scope, .. }
            | IdemCommand::Complete { scope, .. }
            | IdemCommand::Reconcile { scope, .. }
            | IdemCommand::Resolve { scope, .. } => scope,
        }
    }
}

/// How a forwarded attempt ended, as the proxy classified it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Completion {
    /// A final answer (2xx/3xx: `Succeeded`; 4xx: `Failed`).
    Final(StoredAnswer),
    /// Proof that nothing reached the upstream (the connection was never made, or the upstream
    /// said "not processed, try again"): the key is released for a new attempt.
    NotRun,
    /// 5xx or no answer: the upstream may or may not have acted.
    Unknown,
}

/// What the route's reconciliation lookup said about a lost attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Finding {
    /// The upstream has the effect; this is what it answered.
    Ran(StoredAnswer),
    /// The upstream proves the request never ran.
    NeverRan,
}

/// The answer to the proposing proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdemOutcome {
    /// The proposer owns the key: forward the request (attempt `attempt`).
    Claimed { attempt: u64 },
    /// The request already finished: replay this answer, forward nothing.
    Replay(StoredAnswer),
    /// Another attempt is in flight; ask again after `retry_after_ms`.
    InFlight { retry_after_ms: u64 },
    /// The key was used with another request fingerprint.
    Mismatch,
    /// The answer of `attempt` is lost; only reconciliation can move the key on.
    Unknown { attempt: u64 },
    /// The key's record has expired; it is refused until `until_ms`.
    Expired { until_ms: u64 },
    /// A `Complete` (or an operator's `Resolve`) was recorded.
    Completed,
    /// A `Complete` for an attempt that no longer owns the record (it was completed, reconciled
    /// or forgotten meanwhile); nothing changed.
    NotOwner,
}

/// What the storage layer must do with the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordWrite {
    Keep,
    Put(IdemRecord),
    Delete,
}

/// The pure decision function over one record.
pub struct IdempotencyMachine;

impl IdempotencyMachine {
    /// Applies `cmd` at log time `now_ms` to the record `prev` (as stored; `None` if absent).
    pub fn decide(
        prev: Option<&IdemRecord>,
        cmd: &IdemCommand,
        now_ms: u64,
    ) -> (RecordWrite, IdemOutcome) {
        // A record past its tombstone window is as good as absent.
        let prev = prev.filter(|r| now_ms < r.purge_at_ms);
        match cmd {
            IdemCommand::Claim {
                fingerprint,
                owner,
                attempt,
                lease_ms,
                retain_ms,
                tombstone_ms,
                ..
            } => match prev {
                None => {
                    let expires_at_ms = now_ms.saturating_add(*retain_ms);
                    let record = IdemRecord {
                        fingerprint: fingerprint.clone(),
                        state: IdemState::Processing {
                            owner: *owner,
                            attempt: *attempt,
                            lease_until_ms: now_ms.saturating_add(*lease_ms),
                        },
                        created_ms: now_ms,
                        expires_at_ms,
                        purge_at_ms: expires_at_ms.saturating_add(*tombstone_ms),
                    };
                    (
                        RecordWrite::Put(record),
                        IdemOutcome::Claimed { attempt: *attempt },
                    )
                }
                Some(rec) => Self::existing(rec, fingerprint, now_ms),
            },
            IdemCommand::Complete {
                attempt, outcome, ..
            } => {
                let Some(rec) = prev else {
                    return (RecordWrite::Keep, IdemOutcome::NotOwner);
                };
                // A late completion of the lost attempt still counts: a real answer is better
                // knowledge than `Unknown`. Any other attempt's completion is ignored.
                let owns = match rec.state {
                    IdemState::Processing { attempt: a, .. }
                    | IdemState::Unknown { attempt: a } => a == *attempt,
                    IdemState::Succeeded(_) | IdemState::Failed(_) => false,
                };
                if !owns {
                    return (RecordWrite::Keep, IdemOutcome::NotOwner);
                }
                let state = match outcome {
                    Completion::NotRun => return (RecordWrite::Delete, IdemOutcome::Completed),
                    Completion::Unknown => IdemState::Unknown { attempt: *attempt },
                    Completion::Final(answer) if answer.status >= 400 => {
                        IdemState::Failed(answer.clone())
                    }
                    Completion::Final(answer) => IdemState::Succeeded(answer.clone()),
                };
                let mut next = rec.clone();
                next.state = state;
                (RecordWrite::Put(next), IdemOutcome::Completed)
            }
            IdemCommand::Reconcile {
                fingerprint,
                lost_attempt,
                finding,
                owner,
                attempt,
                lease_ms,
                ..
            } => {
                let Some(rec) = prev else {
                    // Forgotten meanwhile (tombstone over): the key is new.
                    return (RecordWrite::Keep, IdemOutcome::NotOwner);
                };
                let lost = match Self::effective(rec, now_ms) {
                    IdemState::Unknown { attempt } => attempt,
                    _ => return Self::existing(rec, fingerprint, now_ms),
                };
                if lost != *lost_attempt
                    || rec.fingerprint != *fingerprint
                    || now_ms >= rec.expires_at_ms
                {
                    return Self::existing(rec, fingerprint, now_ms);
                }
                let mut next = rec.clone();
                match finding {
                    Finding::Ran(answer) => {
                        next.state = IdemState::Succeeded(answer.clone());
                        (RecordWrite::Put(next), IdemOutcome::Replay(answer.clone()))
                    }
                    Finding::NeverRan => {
                        next.state = IdemState::Processing {
                            owner: *owner,
                            attempt: *attempt,
                            lease_until_ms: now_ms.saturating_add(*lease_ms),
                        };
                        (
                            RecordWrite::Put(next),
                            IdemOutcome::Claimed { attempt: *attempt },
                        )
                    }
                }
            }
            IdemCommand::Resolve {
                attempt, finding, ..
            } => match prev {
                None => (RecordWrite::Keep, IdemOutcome::NotOwner),
                Some(rec) => Self::resolve(rec, *attempt, finding, now_ms),
            },
        }
    }

    /// The state with the owner's lease taken into account: processing past its lease is
    /// unknown.
    pub fn effective(rec: &IdemRecord, now_ms: u64) -> IdemState {
        match rec.state {
            IdemState::Processing {
                attempt,
                lease_until_ms,
                ..
            } if now_ms >= lease_until_ms => IdemState::Unknown { attempt },
            ref s => s.clone(),
        }
    }

    /// An operator's resolution of an `Unknown` record; anything else is left as it is and
    /// answered like a request would be (in flight, replay, expired, another attempt unknown).
    fn resolve(
        rec: &IdemRecord,
        attempt: u64,
        finding: &Finding,
        now_ms: u64,
    ) -> (RecordWrite, IdemOutcome) {
        if now_ms >= rec.expires_at_ms {
            return (
                RecordWrite::Keep,
                IdemOutcome::Expired {
                    until_ms: rec.purge_at_ms,
                },
            );
        }
        match Self::effective(rec, now_ms) {
            IdemState::Unknown { attempt: lost } if lost == attempt => match finding {
                Finding::Ran(answer) => {
                    let mut next = rec.clone();
                    next.state = IdemState::Succeeded(answer.clone());
                    (RecordWrite::Put(next), IdemOutcome::Completed)
                }
                Finding::NeverRan => (RecordWrite::Delete, IdemOutcome::Completed),
            },
            // Same fingerprint: the answer a retry would get now.
            _ => Self::existing(rec, &rec.fingerprint, now_ms),
        }
    }

    /// A request meets an existing, not yet forgotten record.
    fn existing(rec: &IdemRecord, fingerprint: &str, now_ms: u64) -> (RecordWrite, IdemOutcome) {
        if now_ms >= rec.expires_at_ms {
            return (
                RecordWrite::Keep,
                IdemOutcome::Expired {
                    until_ms: rec.purge_at_ms,
                },
            );
        }
        if rec.fingerprint != fingerprint {
            return (RecordWrite::Keep, IdemOutcome::Mismatch);
        }
        match Self::effective(rec, now_ms) {
            IdemState::Processing { lease_until_ms, .. } => (
                RecordWrite::Keep,
                IdemOutcome::InFlight {
                    retry_after_ms: lease_until_ms.saturating_sub(now_ms),
                },
            ),
            IdemState::Succeeded(a) | IdemState::Failed(a) => {
                (RecordWrite::Keep, IdemOutcome::Replay(a))
            }
            IdemState::Unknown { attempt } => {
                // Make the lease's end a stored fact, so every later reader sees `Unknown`
                // without re-deriving it (and a late completion still finds its attempt).
                let write = if rec.state == (IdemState::Unknown { attempt }) {
                    RecordWrite::Keep
                } else {
                    let mut next = rec.clone();
                    next.state = IdemState::Unknown { attempt };
                    RecordWrite::Put(next)
                };
                (write, IdemOutcome::Unknown { attempt })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> IdemScope {
        IdemScope {
            tenant: "demo".into(),
            route: "/orders".into(),
            key: "k1".into(),
        }
    }

    fn claim(fp: &str, attempt: u64) -> IdemCommand {
        IdemCommand::Claim {
            scope: scope(),
            fingerprint: fp.into(),
            owner: 1,
            attempt,
            lease_ms: 1_000,
            retain_ms: 10_000,
            tombstone_ms: 5_000,
        }
    }

    fn answer(status: u16) -> StoredAnswer {
        StoredAnswer {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: StoredBody::Inline("e30=".into()),
            reconciled: false,
        }
    }

    fn complete(attempt: u64, outcome: Completion) -> IdemCommand {
        IdemCommand::Complete {
            scope: scope(),
            attempt,
            outcome,
        }
    }

    fn reconcile(lost: u64, finding: Finding, attempt: u64) -> IdemCommand {
        IdemCommand::Reconcile {
            scope: scope(),
            fingerprint: "fp".into(),
            lost_attempt: lost,
            finding,
            owner: 2,
            attempt,
            lease_ms: 1_000,
        }
    }

    /// Applies `cmd` to `rec` in place (as the store would) and returns the outcome.
    fn step(rec: &mut Option<IdemRecord>, cmd: &IdemCommand, now: u64) -> IdemOutcome {
        let (write, out) = IdempotencyMachine::decide(rec.as_ref(), cmd, now);
        match write {
            RecordWrite::Keep => {}
            RecordWrite::Put(r) => *rec = Some(r),
            RecordWrite::Delete => *rec = None,
        }
        out
    }

    #[test]
    fn first_claim_owns_then_replay_after_final_answer() {
        let mut rec = None;
        assert_eq!(
            step(&mut rec, &claim("fp", 7), 100),
            IdemOutcome::Claimed { attempt: 7 }
        );
        assert_eq!(
            step(&mut rec, &claim("fp", 8), 200),
            IdemOutcome::InFlight {
                retry_after_ms: 900
            }
        );
        assert_eq!(
            step(&mut rec, &claim("other", 8), 200),
            IdemOutcome::Mismatch
        );
        assert_eq!(
            step(&mut rec, &complete(7, Completion::Final(answer(201))), 300),
            IdemOutcome::Completed
        );
        assert_eq!(
            step(&mut rec, &claim("fp", 9), 400),
            IdemOutcome::Replay(answer(201))
        );
        assert!(matches!(rec.unwrap().state, IdemState::Succeeded(_)));
    }

    #[test]
    fn client_errors_are_final_and_replayed() {
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        step(&mut rec, &complete(1, Completion::Final(answer(409))), 10);
        assert!(matches!(rec.as_ref().unwrap().state, IdemState::Failed(_)));
        assert_eq!(
            step(&mut rec, &claim("fp", 2), 20),
            IdemOutcome::Replay(answer(409))
        );
    }

    #[test]
    fn lost_lease_becomes_unknown_and_is_never_claimed_again() {
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        // The owner dies; its lease (1 s) ends.
        assert_eq!(
            step(&mut rec, &claim("fp", 2), 1_000),
            IdemOutcome::Unknown { attempt: 1 }
        );
        assert_eq!(
            rec.as_ref().unwrap().state,
            IdemState::Unknown { attempt: 1 }
        );
        assert_eq!(
            step(&mut rec, &claim("fp", 3), 5_000),
            IdemOutcome::Unknown { attempt: 1 }
        );
        // Another attempt's completion changes nothing.
        assert_eq!(
            step(&mut rec, &complete(3, Completion::NotRun), 5_001),
            IdemOutcome::NotOwner
        );
        assert!(rec.is_some());
    }

    #[test]
    fn late_completion_of_the_lost_attempt_is_kept() {
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        step(&mut rec, &claim("fp", 2), 2_000);
        assert_eq!(
            step(
                &mut rec,
                &complete(1, Completion::Final(answer(201))),
                2_100
            ),
            IdemOutcome::Completed
        );
        assert_eq!(
            step(&mut rec, &claim("fp", 3), 2_200),
            IdemOutcome::Replay(answer(201))
        );
    }

    #[test]
    fn upstream_error_is_unknown_and_not_run_releases_the_key() {
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        step(&mut rec, &complete(1, Completion::Unknown), 10);
        assert_eq!(
            step(&mut rec, &claim("fp", 2), 20),
            IdemOutcome::Unknown { attempt: 1 }
        );

        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        step(&mut rec, &complete(1, Completion::NotRun), 10);
        assert_eq!(rec, None);
        assert_eq!(
            step(&mut rec, &claim("fp", 2), 20),
            IdemOutcome::Claimed { attempt: 2 }
        );
    }

    #[test]
    fn reconciliation_records_what_ran_or_allows_exactly_one_new_attempt() {
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        step(&mut rec, &complete(1, Completion::Unknown), 10);
        let mut learnt = answer(200);
        learnt.reconciled = true;
        assert_eq!(
            step(&mut rec, &reconcile(1, Finding::Ran(learnt.clone()), 5), 20),
            IdemOutcome::Replay(learnt.clone())
        );
        assert_eq!(
            step(&mut rec, &claim("fp", 6), 30),
            IdemOutcome::Replay(learnt)
        );

        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        // Unknown by lease end, without a stored transition: reconcile still applies.
        assert_eq!(
            step(&mut rec, &reconcile(1, Finding::NeverRan, 5), 1_500),
            IdemOutcome::Claimed { attempt: 5 }
        );
        // A second proxy that reconciled the same lost attempt concurrently loses the race.
        assert_eq!(
            step(&mut rec, &reconcile(1, Finding::NeverRan, 6), 1_600),
            IdemOutcome::InFlight {
                retry_after_ms: 900
            }
        );
    }

    fn resolve(attempt: u64, finding: Finding) -> IdemCommand {
        IdemCommand::Resolve {
            scope: scope(),
            attempt,
            finding,
            operator: "ops".into(),
        }
    }

    #[test]
    fn operators_resolve_only_the_unknown_attempt_they_were_shown() {
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        // Still in flight: an operator cannot settle it.
        assert_eq!(
            step(&mut rec, &resolve(1, Finding::NeverRan), 500),
            IdemOutcome::InFlight {
                retry_after_ms: 500
            }
        );
        // Past the owner's lease it is unknown (not yet stored as such): resolvable, but only
        // for the attempt that was lost.
        assert_eq!(
            step(&mut rec, &resolve(9, Finding::NeverRan), 1_500),
            IdemOutcome::Unknown { attempt: 1 }
        );
        let answer = answer(200);
        assert_eq!(
            step(&mut rec, &resolve(1, Finding::Ran(answer.clone())), 1_600),
            IdemOutcome::Completed
        );
        assert_eq!(
            step(&mut rec, &claim("fp", 2), 1_700),
            IdemOutcome::Replay(answer.clone())
        );
        // Settled: a second resolution changes nothing.
        assert_eq!(
            step(&mut rec, &resolve(1, Finding::NeverRan), 1_800),
            IdemOutcome::Replay(answer)
        );

        // "Never ran" frees the key for exactly one new attempt.
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        step(&mut rec, &complete(1, Completion::Unknown), 10);
        assert_eq!(
            step(&mut rec, &resolve(1, Finding::NeverRan), 20),
            IdemOutcome::Completed
        );
        assert_eq!(rec, None);
        assert_eq!(
            step(&mut rec, &claim("fp", 3), 30),
            IdemOutcome::Claimed { attempt: 3 }
        );
        assert_eq!(
            step(&mut rec, &resolve(1, Finding::NeverRan), 40),
            IdemOutcome::InFlight {
                retry_after_ms: 990
            }
        );
        // Expired records are not resolved, and a forgotten one is not there to resolve.
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        assert_eq!(
            step(&mut rec, &resolve(1, Finding::NeverRan), 10_000),
            IdemOutcome::Expired { until_ms: 15_000 }
        );
        assert_eq!(
            step(&mut rec, &resolve(1, Finding::NeverRan), 15_000),
            IdemOutcome::NotOwner
        );
    }

    #[test]
    fn expiry_refuses_for_the_tombstone_window_then_forgets() {
        let mut rec = None;
        step(&mut rec, &claim("fp", 1), 0);
        step(&mut rec, &complete(1, Completion::Final(answer(201))), 10);
        assert_eq!(
            step(&mut rec, &claim("fp", 2), 10_000),
            IdemOutcome::Expired { until_ms: 15_000 }
        );
        assert_eq!(
            step(&mut rec, &claim("other", 2), 14_999),
            IdemOutcome::Expired { until_ms: 15_000 }
        );
        assert_eq!(
            step(&mut rec, &claim("fp", 3), 15_000),
            IdemOutcome::Claimed { attempt: 3 }
        );
    }

    mod model {
        //! Random command sequences against a tiny reference: at most one attempt may ever be
        //! forwarded without proof that the earlier one never ran.
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Claim { fp: bool, attempt: u64 },
            Complete { attempt: u64, kind: u8 },
            Reconcile { lost: u64, ran: bool, attempt: u64 },
            Resolve { attempt: u64, ran: bool },
            Wait(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (any::<bool>(), 1..6u64).prop_map(|(fp, attempt)| Op::Claim { fp, attempt }),
                (1..6u64, 0..3u8).prop_map(|(attempt, kind)| Op::Complete { attempt, kind }),
                (1..6u64, any::<bool>(), 1..6u64)
                    .prop_map(|(lost, ran, attempt)| { Op::Reconcile { lost, ran, attempt } }),
                (1..6u64, any::<bool>()).prop_map(|(attempt, ran)| Op::Resolve { attempt, ran }),
                (0..3_000u64).prop_map(Op::Wait),
            ]
        }

        proptest! {
            #[test]
            fn a_forward_needs_a_free_key_or_proof(ops in proptest::collection::vec(op(), 1..60)) {
                let mut rec: Option<IdemRecord> = None;
                let mut now = 0u64;
                // Attempts that may have reached the upstream and were not proven never-run.
                let mut maybe_ran: Vec<u64> = Vec::new();
                for op in ops {
                    let (cmd, kind) = match op {
                        Op::Wait(ms) => { now += ms; continue; }
                        Op::Claim { fp, attempt } => {
                            (claim(if fp { "fp" } else { "other" }, attempt), None)
                        }
                        Op::Complete { attempt, kind } => {
                            let outcome = match kind {
                                0 => Completion::Final(answer(201)),
                                1 => Completion::NotRun,
                                _ => Completion::Unknown,
                            };
                            (complete(attempt, outcome), Some(kind))
                        }
                        Op::Reconcile { lost, ran, attempt } => {
                            let finding = if ran { Finding::Ran(answer(200)) } else { Finding::NeverRan };
                            (reconcile(lost, finding, attempt), None)
                        }
                        Op::Resolve { attempt, ran } => {
                            let finding = if ran { Finding::Ran(answer(200)) } else { Finding::NeverRan };
                            (resolve(attempt, finding), None)
                        }
                    };
                    let before = rec.clone();
                    let out = step(&mut rec, &cmd, now);
                    match (&cmd, &out) {
                        (IdemCommand::Complete { attempt, .. }, IdemOutcome::Completed) if kind == Some(1) => {
                            maybe_ran.retain(|a| a != attempt);
                        }
                        (IdemCommand::Reconcile { lost_attempt, .. }, IdemOutcome::Claimed { .. }) => {
                            maybe_ran.retain(|a| a != lost_attempt);
                        }
                        // An operator's "never ran" is the proof, given by a person.
                        (IdemCommand::Resolve { attempt, finding: Finding::NeverRan, .. }, IdemOutcome::Completed) => {
                            maybe_ran.retain(|a| a != attempt);
                        }
                        _ => {}
                    }
                    if let IdemOutcome::Claimed { attempt } = out {
                        // Invariant: a new forward only when no earlier attempt may have run,
                        // unless the record was forgotten after its retention and tombstone.
                        let forgotten = before.as_ref().is_none_or(|r| now >= r.purge_at_ms);
                        prop_assert!(maybe_ran.is_empty() || forgotten,
                            "attempt {attempt} claimed while {maybe_ran:?} may have run; before {before:?}");
                        if forgotten { maybe_ran.clear(); }
                        maybe_ran.push(attempt);
                    }
                    if let Some(r) = &rec {
                        prop_assert!(r.created_ms <= r.expires_at_ms && r.expires_at_ms <= r.purge_at_ms);
                    }
                }
            }
        }
    }
}
