//! Throughput of the pure lock state machine at the seed workload's sizes (100k resources,
//! 20k active leases, dedup records for the retry window).
//!
//! `apply` is what every replica runs for every committed entry, so it bounds the commit rate
//! no matter how fast the log is; `image`/`from_image` bound snapshot build and install;
//! `lease_of_100k_resources` is the lookup the API makes beside apply, under the same lock.
//! Proposals are built outside the timed section: on a node they arrive already decoded from
//! the log.
//!
//! ```text
//! cargo bench -p lock-core --bench apply -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use lock_core::machine::{Acquire, Command, LeaseId, LockMachine, Proposal, Response};

const RESOURCES: u64 = 100_000;
const ACTIVE: u64 = 20_000;
const TERM: u64 = 1;
const T0: u64 = 1_700_000_000_000;
const TTL_MS: u64 = 30_000;
const GRACE_MS: u64 = 5_000;

fn resource(i: u64) -> String {
    format!("bench:{i:06}")
}

fn at(now_ms: u64, cmd: Command) -> Proposal {
    Proposal {
        now_ms,
        failover_grace_ms: GRACE_MS,
        cmd,
    }
}

fn acquire(i: u64, seq: u64, retain_ms: u64) -> Command {
    Command::Acquire(Acquire {
        resource: resource(i),
        request_id: format!("req-{seq}"),
        holder: None,
        ttl_ms: TTL_MS,
        wait_timeout_ms: 0,
        lease_id: lease(seq),
        retain_ms,
        max_waiters: 64,
        max_total_waiters: 100_000,
        tenant_limits: None,
    })
}

fn lease(seq: u64) -> LeaseId {
    LeaseId((1u128 << 100) | u128::from(seq))
}

fn apply_all(m: &mut LockMachine, batch: &[Proposal]) {
    for p in batch {
        black_box(m.apply(p, TERM));
    }
}

/// A leader's steady stream of acquire+release pairs over 100k resources, one cycle per ms,
/// with the sweeper's `Tick` every `CYCLES` cycles. Dedup records are kept 60 s, so about 60k
/// of them are live at any time and the ticks keep retiring them.
struct CycleStream {
    seq: u64,
    now: u64,
}

impl CycleStream {
    const CYCLES: u64 = 128;
    const RETAIN_MS: u64 = 60_000;
    /// Commands per batch: an acquire and a release per cycle, plus one tick.
    const COMMANDS: u64 = 2 * Self::CYCLES + 1;

    fn batch(&mut self) -> Vec<Proposal> {
        let mut out = Vec::with_capacity(Self::COMMANDS as usize);
        for _ in 0..Self::CYCLES {
            let i = self.seq % RESOURCES;
            out.push(at(self.now, acquire(i, self.seq, Self::RETAIN_MS)));
            out.push(at(
                self.now,
                Command::Release {
                    resource: resource(i),
                    lease_id: lease(self.seq),
                },
            ));
            self.seq += 1;
            self.now += 1;
        }
        out.push(at(self.now, Command::Tick { max_items: 512 }));
        out
    }
}

fn bench_acquire_release(c: &mut Criterion) {
    let mut m = LockMachine::new();
    let mut stream = CycleStream { seq: 0, now: T0 };
    // Touch every resource once (and run long enough for the first dedup records to be
    // swept), so the timed part sees the steady state: 100k resource records.
    while stream.seq < RESOURCES + 2 * CycleStream::RETAIN_MS {
        let batch = stream.batch();
        for p in &batch {
            let (resp, _) = m.apply(p, TERM);
            assert!(
                !matches!(resp, Response::Held { .. } | Response::LeaseLost),
                "warm-up cycle failed: {resp:?}"
            );
        }
    }
    let stats = m.stats();
    assert_eq!(stats.resources, RESOURCES);
    assert_eq!(stats.active_locks, 0);

    let mut g = c.benchmark_group("apply");
    g.throughput(Throughput::Elements(CycleStream::COMMANDS));
    g.bench_function("acquire_release_100k_resources", |b| {
        b.iter_batched(
            || stream.batch(),
            |batch| {
                apply_all(&mut m, &batch);
                batch
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// 20k leases, each renewed in turn, one renewal per ms: every lease is renewed every 20 s,
/// well inside its 30 s TTL, so none ever expires.
fn bench_renew(c: &mut Criterion) {
    const BATCH: u64 = 1_000;
    let mut m = LockMachine::new();
    for i in 0..ACTIVE {
        m.apply(&at(T0, acquire(i, i, 600_000)), TERM);
    }
    let mut seq = 0u64;
    let mut now = T0;
    let mut batch = move || {
        (0..BATCH)
            .map(|_| {
                let i = seq % ACTIVE;
                seq += 1;
                now += 1;
                at(
                    now,
                    Command::Renew {
                        resource: resource(i),
                        lease_id: lease(i),
                    },
                )
            })
            .collect::<Vec<_>>()
    };
    for p in batch() {
        let (resp, _) = m.apply(&p, TERM);
        assert!(matches!(resp, Response::Renewed(_)), "{resp:?}");
    }

    let mut g = c.benchmark_group("apply");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("renew_20k_leases", |b| {
        b.iter_batched(
            &mut batch,
            |batch| {
                apply_all(&mut m, &batch);
                batch
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// Snapshot build and install of the seed workload's state: 100k resource records of which 20k are
/// held, and 100k dedup records (one per acquire in the retry window). Throughput counts
/// records (resources + dedup entries).
fn bench_image(c: &mut Criterion) {
    let mut m = LockMachine::new();
    for i in 0..RESOURCES {
        m.apply(&at(T0, acquire(i, i, 600_000)), TERM);
    }
    for i in ACTIVE..RESOURCES {
        m.apply(
            &at(
                T0,
                Command::Release {
                    resource: resource(i),
                    lease_id: lease(i),
                },
            ),
            TERM,
        );
    }
    let stats = m.stats();
    assert_eq!(stats.resources, RESOURCES);
    assert_eq!(stats.active_locks, ACTIVE);
    assert_eq!(stats.dedup_records, RESOURCES);
    let records = stats.resources + stats.dedup_records;

    let mut g = c.benchmark_group("snapshot");
    // Each iteration is ~0.1 s; 20 samples keep the run short on a small machine.
    g.sample_size(20);
    g.throughput(Throughput::Elements(records));
    g.bench_function("image_20k_leases_100k_dedup", |b| {
        b.iter_with_large_drop(|| m.image())
    });
    let image = m.image();
    g.bench_function("from_image_20k_leases_100k_dedup", |b| {
        b.iter_batched(
            || image.clone(),
            LockMachine::from_image,
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Reads of one resource's lease, as the API makes them beside apply (a renewal's and a
/// release's audit line, a release waiting for its proxies): 100k records, names visited in a
/// scattered order so that the map's nodes are not all in cache.
fn bench_lease_read(c: &mut Criterion) {
    const READS: u64 = 4_096;
    let mut m = LockMachine::new();
    for i in 0..RESOURCES {
        m.apply(&at(T0, acquire(i, i, 600_000)), TERM);
    }
    // 7919 is prime and does not divide RESOURCES: every name, in a scattered order.
    let names: Vec<String> = (0..RESOURCES)
        .map(|i| resource(i * 7_919 % RESOURCES))
        .collect();
    let mut next = names.iter().cycle();
    let mut g = c.benchmark_group("reads");
    g.throughput(Throughput::Elements(READS));
    g.bench_function("lease_of_100k_resources", |b| {
        b.iter(|| {
            for name in next.by_ref().take(READS as usize) {
                black_box(m.lease(name));
            }
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_acquire_release,
    bench_renew,
    bench_image,
    bench_lease_read
);
criterion_main!(benches);
