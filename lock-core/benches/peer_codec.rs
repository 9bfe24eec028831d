//! Cost of the replication path's per-message work: encoding and decoding an append of full
//! command batches in the peer format (and in JSON, which it replaced), and applying one batch.
//!
//! ```text
//! cargo bench -p lock-core --bench peer_codec -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use lock_core::machine::{Acquire, Batch, Command, LeaseId, LockMachine};
use lock_core::net::codec;
use lock_core::raft::TypeConfig;
use openraft::raft::AppendEntriesRequest;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

const BATCH: u64 = 64;
const ENTRIES: u64 = 16;
const T0: u64 = 1_700_000_000_000;

fn acquire(i: u64) -> Command {
    Command::Acquire(Acquire {
        resource: format!("bench:{i:06}"),
        request_id: format!("req-{i:08}"),
        holder: Some("worker-7".to_string()),
        ttl_ms: 30_000,
        wait_timeout_ms: 0,
        lease_id: LeaseId(u128::from(i) << 64 | 0x5eed),
        retain_ms: 600_000,
        max_waiters: 1_024,
        max_total_waiters: 100_000,
        tenant_limits: None,
    })
}

fn batch(first: u64) -> Batch {
    Batch::new(
        T0 + first,
        1_000,
        (first..first + BATCH).map(acquire).collect(),
    )
}

fn append() -> AppendEntriesRequest<TypeConfig> {
    let leader = CommittedLeaderId::new(3, 1);
    AppendEntriesRequest {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(LogId::new(leader, 99)),
        entries: (0..ENTRIES)
            .map(|e| Entry {
                log_id: LogId::new(leader, 100 + e),
                payload: EntryPayload::Normal(batch(e * BATCH)),
            })
            .collect(),
        leader_commit: Some(LogId::new(leader, 99)),
    }
}

fn bench_codec(c: &mut Criterion) {
    let req = append();
    let peer = codec::encode(&req).expect("encode");
    let json = serde_json::to_vec(&req).expect("json");
    eprintln!(
        "append of {ENTRIES} entries x {BATCH} acquires: peer format {} bytes, JSON {} bytes",
        peer.len(),
        json.len()
    );
    let mut g = c.benchmark_group("append_of_batches");
    g.throughput(Throughput::Elements(ENTRIES * BATCH));
    g.bench_function("encode_peer", |b| b.iter(|| codec::encode(black_box(&req))));
    g.bench_function("decode_peer", |b| {
        b.iter(|| codec::decode::<AppendEntriesRequest<TypeConfig>>(black_box(&peer)))
    });
    g.bench_function("encode_json", |b| {
        b.iter(|| serde_json::to_vec(black_box(&req)))
    });
    g.bench_function("decode_json", |b| {
        b.iter(|| serde_json::from_slice::<AppendEntriesRequest<TypeConfig>>(black_box(&json)))
    });
    g.finish();
}

fn bench_apply_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("apply_batch");
    g.throughput(Throughput::Elements(BATCH));
    let mut next = 0;
    g.bench_function("64_acquires", |b| {
        b.iter_batched(
            || {
                next += BATCH;
                batch(next)
            },
            |batch| {
                let mut m = LockMachine::new();
                black_box(m.apply_batch(&batch, 1))
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench_codec, bench_apply_batch);
criterion_main!(benches);
