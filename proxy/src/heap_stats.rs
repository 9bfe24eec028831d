//! A diagnostics build's live-heap counter (`--features heap-stats`): the global allocator is
//! wrapped so that every allocation and free adjusts one counter, and a thread logs the live
//! heap and its peak since the last line every ten seconds (target `fencegate::heap`, at info;
//! `FENCEGATE_HEAP_STATS_MS` sets another interval, e.g. 250 to follow a snapshot install).
//!
//! It answers one question a resident-set figure cannot: how much of a node's memory is live
//! data and how much the allocator holds without using it. It costs two atomic additions per
//! allocation, so releases leave it out.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

/// Bytes allocated and not yet freed.
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// The largest `LIVE` seen since the reporter last reset it.
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Counts bytes through to the allocator `A`.
pub struct Counting<A>(pub A);

impl<A> Counting<A> {
    fn grew(delta: usize) {
        let live = LIVE.fetch_add(delta as isize, Ordering::Relaxed) + delta as isize;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }

    fn shrank(delta: usize) {
        LIVE.fetch_sub(delta as isize, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to `A` unchanged; only the counters are added.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            Self::grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            Self::grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.0.dealloc(ptr, layout) };
        Self::shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                Self::grew(new_size - layout.size());
            } else {
                Self::shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// How often the heap is logged unless `FENCEGATE_HEAP_STATS_MS` says otherwise.
const EVERY: Duration = Duration::from_secs(10);

/// Starts the thread that logs the live heap every [`EVERY`] (or `FENCEGATE_HEAP_STATS_MS`).
pub fn report() {
    let every = match std::env::var("FENCEGATE_HEAP_STATS_MS").map(|v| v.parse::<u64>()) {
        Ok(Ok(ms)) if ms > 0 => Duration::from_millis(ms),
        Ok(_) => {
            tracing::warn!(
                target: "fencegate::heap",
                "FENCEGATE_HEAP_STATS_MS is not a positive number of milliseconds; logging every {} s",
                EVERY.as_secs()
            );
            EVERY
        }
        Err(_) => EVERY,
    };
    let spawned = std::thread::Builder::new()
        .name("heap-stats".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let live = LIVE.load(Ordering::Relaxed);
            let peak = PEAK.swap(live, Ordering::Relaxed);
            tracing::info!(
                target: "fencegate::heap",
                live_mib = format!("{:.1}", mib(live)),
                peak_mib = format!("{:.1}", mib(peak)),
                "heap"
            );
        });
    if let Err(e) = spawned {
        tracing::warn!(target: "fencegate::heap", "heap statistics not reported: {e}");
    }
}

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
