//! Random histories: hundreds of commands with retries, stale ids, proxy admissions, clock
//! jumps, leader changes and snapshot restores, each checked against the reference model and
//! the invariants.

use lock_core::machine::LockMachine;
use proptest::prelude::*;

use crate::support::RETAIN;
use crate::world::{Op, Pick, TokenPick, World, REQUEST_IDS, RESOURCE_NAMES};

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        5 => Just(Pick::Current),
        3 => any::<usize>().prop_map(Pick::Stale),
        1 => any::<u64>().prop_map(Pick::Foreign),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let res = 0..RESOURCE_NAMES.len();
    prop_oneof![
        8 => (
            res.clone(),
            0..REQUEST_IDS,
            prop_oneof![Just(1_000u64), 1_000u64..60_000],
            prop_oneof![2 => Just(0u64), 2 => 1u64..40_000, 1 => 40_000u64..200_000],
            prop_oneof![Just(30_000u64), Just(RETAIN)],
        )
            .prop_map(|(res, rid, ttl_ms, wait_ms, retain_ms)| Op::Acquire {
                res,
                rid,
                ttl_ms,
                wait_ms,
                retain_ms
            }),
        4 => (res.clone(), pick()).prop_map(|(res, pick)| Op::Renew { res, pick }),
        3 => (res.clone(), pick()).prop_map(|(res, pick)| Op::Release { res, pick }),
        2 => (res.clone(), 0..REQUEST_IDS).prop_map(|(res, rid)| Op::Cancel { res, rid }),
        1 => res.clone().prop_map(|res| Op::ForceRelease { res }),
        3 => (
            res.clone(),
            prop_oneof![3 => Just(TokenPick::Current), 1 => any::<u64>().prop_map(TokenPick::Any)],
            0u64..3,
            1u64..20_000,
        )
            .prop_map(|(res, token, proxy, grant_ms)| Op::Admit {
                res,
                token,
                proxy,
                grant_ms
            }),
        2 => (
            res.clone(),
            prop_oneof![3 => Just(TokenPick::Current), 1 => any::<u64>().prop_map(TokenPick::Any)],
            0u64..3,
        )
            .prop_map(|(res, token, proxy)| Op::RevokeAck { res, token, proxy }),
        2 => prop_oneof![Just(1u32), Just(3), Just(10_000)]
            .prop_map(|max_items| Op::Tick { max_items }),
        6 => prop_oneof![
            8 => 0u64..5_000,
            2 => 5_000u64..120_000,
            1 => 500_000u64..800_000,
        ]
        .prop_map(|ms| Op::Advance { ms }),
        1 => (
            prop_oneof![3 => 0u64..3_000, 1 => 20_000u64..150_000],
            -20_000i64..20_000,
            0u64..10_000,
        )
            .prop_map(|(election_ms, offset_ms, grace_ms)| Op::LeaderChange {
                election_ms,
                offset_ms,
                grace_ms
            }),
        1 => Just(Op::Restore),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// One lease at a time, tokens that only grow, only the current lease id renews or
    /// releases, retries return the original result, and a leader change never shortens a
    /// lease: checked against a reference model over hundreds of random commands with retries,
    /// stale ids, clock jumps, leader changes and snapshot restores.
    #[test]
    fn random_histories_match_the_model_and_keep_the_invariants(
        ops in prop::collection::vec(op(), 100..400),
        // Dedup records are frozen in chunks (tens of thousands in a node); a few records per
        // chunk puts the histories' records across chunk boundaries.
        dedup_chunk_len in prop_oneof![Just(None), (1usize..5).prop_map(Some)],
    ) {
        let mut w = match dedup_chunk_len {
            Some(n) => World::with_machine(LockMachine::with_dedup_chunk_len(n)),
            None => World::new(),
        };
        for op in &ops {
            w.step(op)?;
        }
    }
}
