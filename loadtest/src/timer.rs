//! Waking at a scheduled instant without tokio's millisecond of lateness.
//!
//! Every latency the open loop reports counts from the operation's scheduled start, so
//! whatever delays the send is in the sample. tokio's timer works in whole milliseconds: a
//! `sleep_until(t)` is filed under the first millisecond tick at or after `t`, and the runtime
//! parks in `epoll_wait`, whose timeout is in milliseconds too. Measured with
//! `fencegate-loadtest timer-lateness` (2,000 sends/s, debug build, the 2-core machine at load
//! ~1), requests went out p50 0.96–1.37 ms / p99 1.9–2.5 ms after their slot: up to a
//! millisecond in every sample of both systems, a tenth of a fencegate lock call's p50.
//!
//! [`sleep_until`] leaves all but the last [`COARSE_LEAD`] to tokio's timer (cheap, and
//! cancelled with the future), then hands the deadline to one thread that keeps the near
//! deadlines in a heap and sleeps on a condition variable with the kernel's high-resolution
//! timeout (its timer slack set to 1 µs on Linux), waking each task at its instant. Nothing
//! spins. Measured the same way: p50 0.10–0.14 ms / p99 0.5–0.9 ms, for 40–100 µs more CPU per
//! send in the debug build (a wake-up per deadline rather than per tick). A task that cannot
//! run on time because the harness lacks CPU is still late, and that lateness stays in its
//! latency: only the timer's rounding is gone. (A `timerfd` per sleep in tokio's own epoll set
//! was tried too: the same lateness, no less CPU.)

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long before a deadline the precise thread takes over from tokio's timer: tokio wakes
/// up to a millisecond after its tick, so two keep the hand-over ahead of the deadline.
const COARSE_LEAD: Duration = Duration::from_millis(2);

/// Set (to anything) to leave every sleep to tokio's timer, as before this module.
pub const COARSE_ENV: &str = "FENCEGATE_LOADTEST_COARSE_TIMER";

/// Sleeps until `at` (returns at once if it has passed).
pub async fn sleep_until(at: Instant) {
    let now = Instant::now();
    if at <= now {
        return;
    }
    if at - now > COARSE_LEAD {
        tokio::time::sleep_until((at - COARSE_LEAD).into()).await;
        if at <= Instant::now() {
            return;
        }
    }
    match timer() {
        Some(t) => {
            let (tx, rx) = oneshot::channel();
            t.add(at, tx);
            // The timer thread never drops a sender before its instant.
            let _ = rx.await;
        }
        None => tokio::time::sleep_until(at.into()).await,
    }
}

/// The deadlines the thread wakes: the earliest first, ties in the order they came.
struct Entry {
    at: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap, and the earliest deadline must be on top.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Timer {
    due: Mutex<(BinaryHeap<Entry>, u64)>,
    changed: Condvar,
}

/// The timer thread, started on first use; `None` if no thread could be started (tokio's
/// timer is used then).
fn timer() -> Option<&'static Timer> {
    static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();
    *TIMER.get_or_init(|| {
        // For comparisons: the harness's CPU against its lateness.
        if std::env::var_os(COARSE_ENV).is_some() {
            return None;
        }
        let t: &'static Timer = Box::leak(Box::new(Timer {
            due: Mutex::new((BinaryHeap::new(), 0)),
            changed: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("precise-timer".into())
            .spawn(move || t.run())
            .ok()
            .map(|_| t)
    })
}

impl Timer {
    fn add(&self, at: Instant, wake: oneshot::Sender<()>) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = due.0.peek().is_none_or(|e| at < e.at);
        let seq = due.1;
        due.1 += 1;
        due.0.push(Entry { at, seq, wake });
        drop(due);
        // Only a new earliest deadline changes how long the thread must sleep.
        if earliest {
            self.changed.notify_one();
        }
    }

    fn run(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: prctl with PR_SET_TIMERSLACK only changes this thread's timer slack (the
        // default 50 µs would be most of what is left to gain).
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
        let mut fired = Vec::new();
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            while due.0.peek().is_some_and(|e| e.at <= now) {
                if let Some(e) = due.0.pop() {
                    fired.push(e.wake);
                }
            }
            if !fired.is_empty() {
                // Woken outside the lock: a wake-up may cost a system call (the runtime's
                // thread parked in epoll), and `add` must not wait for it.
                drop(due);
                for wake in fired.drain(..) {
                    // A dropped receiver: that sleep was cancelled.
                    let _ = wake.send(());
                }
                due = self.due.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            due = match due.0.peek().map(|e| e.at) {
                None => self.changed.wait(due).unwrap_or_else(|e| e.into_inner()),
                Some(at) => {
                    self.changed
                        .wait_timeout(due, at.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deadlines registered out of order, some near (the precise thread only) and some far
    /// (tokio first): each sleep ends, and none before its instant.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_sleep_ends_before_its_instant() {
        let start = Instant::now() + Duration::from_millis(5);
        let offsets_us = [
            4_000u64, 0, 1_500, 250, 9_000, 250, 3_100, 12_000, 700, 2_050,
        ];
        let tasks: Vec<_> = offsets_us
            .iter()
            .map(|us| {
                let at = start + Duration::from_micros(*us);
                tokio::spawn(async move {
                    sleep_until(at).await;
                    Instant::now() >= at
                })
            })
            .collect();
        for t in tasks {
            assert!(t.await.expect("sleep task"), "a sleep ended early");
        }
    }

    /// A cancelled sleep (its future dropped while its deadline is in the thread's heap)
    /// leaves the thread waking the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_sleep_does_not_stop_the_others() {
        let at = Instant::now() + Duration::from_millis(1);
        tokio::select! {
            biased;
            _ = sleep_until(at) => panic!("the sleep should have been cancelled"),
            _ = std::future::ready(()) => {}
        }
        let later = Instant::now() + Duration::from_millis(3);
        sleep_until(later).await;
        assert!(Instant::now() >= later);
    }

    #[test]
    fn the_earliest_deadline_is_on_top() {
        let t0 = Instant::now();
        let mut heap = BinaryHeap::new();
        for (i, ms) in [5u64, 1, 3, 1].iter().enumerate() {
            let (wake, _) = oneshot::channel();
            heap.push(Entry {
                at: t0 + Duration::from_millis(*ms),
                seq: i as u64,
                wake,
            });
        }
        let order: Vec<(u64, u64)> = std::iter::from_fn(|| heap.pop())
            .map(|e| ((e.at - t0).as_millis() as u64, e.seq))
            .collect();
        assert_eq!(order, vec![(1, 1), (1, 3), (3, 2), (5, 0)]);
    }
}
