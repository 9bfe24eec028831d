//! How much memory the replicated lock state takes at the seed workload, with the retry
//! window full: 100k resources, 2,000 acquires/s each held 10 s (so ~20k live leases), renewals
//! every 10 s, releases, and every acquire's dedup record kept for the 10-minute retry window.
//!
//! It drives the pure state machine with the commands a leader would commit (no raft, no disk)
//! for `--seconds` of log time and reports the heap bytes the machine holds, counted by a
//! global allocator, plus the size of its snapshot image. Like a node, it takes a snapshot
//! every `SNAPSHOT_EVERY_S` seconds: an image of the machine that stays alive while the
//! snapshot is written (`SNAPSHOT_WRITE_S`) and lets go of the resources once they are written,
//! so the peak includes what apply copies while a snapshot shares the machine's structure.
//!
//! ```sh
//! cargo run --release -p lock-core --example state_memory -- --seconds 660
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_core::machine::{Acquire, Batch, Command, LeaseId, LockMachine, Response, SnapshotImage};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: same layout, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: ptr was allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const RESOURCES: u64 = 100_000;
const RATE: u64 = 2_000;
const HOLD_S: u64 = 10;
const RETAIN_MS: u64 = 10 * 60 * 1000;
const TTL_MS: u64 = 30_000;
/// About how often a node snapshots at the seed workload, and how long writing one takes at
/// the full window (75 MB at the background write rate).
const SNAPSHOT_EVERY_S: u64 = 19;
const SNAPSHOT_WRITE_S: u64 = 3;

fn main() {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(660);
    let baseline = LIVE.load(Ordering::Relaxed);
    let mut machine = LockMachine::new();
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        // xorshift: deterministic, dependency-free.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let start_ms = 1_700_000_000_000u64;
    let mut held: VecDeque<(u64, String, LeaseId)> = VecDeque::new();
    let mut serial = 0u64;
    let started = std::time::Instant::now();
    let mut applying = std::time::Duration::ZERO;
    let mut applied = 0usize;
    let mut snapshot: Option<SnapshotImage> = None;
    for second in 0..seconds {
        match second % SNAPSHOT_EVERY_S {
            0 => snapshot = Some(machine.snapshot_image()),
            // The resources come first in the file and are let go of as they are written:
            // modelled as one second of apply while the image still holds all of them.
            1 => {
                if let Some(image) = &snapshot {
                    rmp_serde::encode::write_named(&mut std::io::sink(), image).expect("encode");
                }
            }
            SNAPSHOT_WRITE_S => snapshot = None,
            _ => {}
        }
        let now = start_ms + second * 1000;
        let mut cmds = Vec::new();
        // Release what was taken HOLD_S ago, renew what is half-way.
        while held
            .front()
            .is_some_and(|(at, _, _)| *at + HOLD_S <= second)
        {
            let (_, resource, lease_id) = held.pop_front().expect("checked");
            cmds.push(Command::Release { resource, lease_id });
        }
        for (at, resource, lease_id) in &held {
            if second == at + HOLD_S / 2 {
                cmds.push(Command::Renew {
                    resource: resource.clone(),
                    lease_id: *lease_id,
                });
            }
        }
        for _ in 0..RATE {
            serial += 1;
            cmds.push(Command::Acquire(Acquire {
                resource: format!("res-{}", next() % RESOURCES),
                request_id: format!("{:032x}", u128::from(next()) << 64 | u128::from(serial)),
                holder: Some(format!("worker-{}", serial % 64)),
                ttl_ms: TTL_MS,
                wait_timeout_ms: 0,
                lease_id: LeaseId(u128::from(next()) << 64 | u128::from(next())),
                retain_ms: RETAIN_MS,
                max_waiters: 1024,
                max_total_waiters: 100_000,
                tenant_limits: None,
            }));
        }
        cmds.push(Command::Tick { max_items: 100_000 });
        let batch = Batch::new(now, 0, cmds);
        let apply_started = std::time::Instant::now();
        let (responses, _) = machine.apply_batch(&batch, 1);
        applying += apply_started.elapsed();
        applied += responses.len();
        for resp in responses {
            if let Response::Granted(g) = resp {
                held.push_back((second, g.resource, g.lease_id));
            }
        }
    }
    let elapsed = started.elapsed();
    drop(held);
    drop(snapshot);
    let bytes = LIVE.load(Ordering::Relaxed) - baseline;
    let peak = PEAK.load(Ordering::Relaxed) - baseline;
    let stats = machine.stats();
    // What a snapshot costs, step by step: the image and its encoding on the node that builds
    // it; decoding (from the file, as it is read, the dedup records straight into the table, as
    // a node does) and rebuilding the machine on a follower that installs it, with the heap
    // that takes above what was live before.
    let timed = std::time::Instant::now();
    let image = machine.image();
    let imaging = timed.elapsed();
    let timed = std::time::Instant::now();
    let encoded = rmp_serde::to_vec_named(&image).expect("encode the image");
    let encoding = timed.elapsed();
    let image_bytes = encoded.len();
    drop(image);
    let file = std::env::temp_dir().join(format!("state_memory-{}.snap", std::process::id()));
    std::fs::write(&file, &encoded).expect("write the image to a file");
    drop(encoded);
    let before_install = LIVE.load(Ordering::Relaxed);
    PEAK.store(before_install, Ordering::Relaxed);
    let timed = std::time::Instant::now();
    let input = std::io::BufReader::with_capacity(
        1 << 16,
        std::fs::File::open(&file).expect("open the image file"),
    );
    let mut de = rmp_serde::Deserializer::new(input);
    let decoded: lock_core::machine::RestoredImage =
        serde::Deserialize::deserialize(&mut de).expect("decode the image");
    let decoding = timed.elapsed();
    let _ = std::fs::remove_file(&file);
    let timed = std::time::Instant::now();
    let restored = LockMachine::from_restored(decoded);
    let restoring = timed.elapsed();
    let install_peak = PEAK.load(Ordering::Relaxed) - before_install;
    assert_eq!(
        restored.stats(),
        stats,
        "the restored machine is the same state"
    );
    drop(restored);
    println!(
        "{seconds} s of log time at {RATE} acquires/s over {RESOURCES} resources in {:.1} s: \
         {applied} commands applied in {:.1} s ({:.0} commands/s)",
        elapsed.as_secs_f64(),
        applying.as_secs_f64(),
        applied as f64 / applying.as_secs_f64()
    );
    println!("{stats:?}");
    println!(
        "machine heap: {:.1} MiB (peak {:.1} MiB with a snapshot's image alive); \
         snapshot image (MessagePack): {:.1} MiB",
        bytes as f64 / (1 << 20) as f64,
        peak as f64 / (1 << 20) as f64,
        image_bytes as f64 / (1 << 20) as f64
    );
    println!(
        "installing it: heap peak {:.1} MiB above what was live before",
        install_peak as f64 / (1 << 20) as f64
    );
    println!(
        "snapshot steps: image {:.0} ms, encode {:.0} ms, decode {:.0} ms, rebuild {:.0} ms",
        imaging.as_secs_f64() * 1e3,
        encoding.as_secs_f64() * 1e3,
        decoding.as_secs_f64() * 1e3,
        restoring.as_secs_f64() * 1e3
    );
}
