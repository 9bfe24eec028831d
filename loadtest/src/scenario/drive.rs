//! What every scenario shares: the open-loop engine started at `t0` with its recorder and
//! ledger, the server poller, the progress bar, and the end of the run (arrivals stopped,
//! holds drained, samples collected).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinHandle;

use super::system::SystemUnderTest;
use crate::backend::Backend;
use crate::cluster::process::process_cpu_s;
use crate::config::{RunArgs, Workload};
use crate::ledger::Ledger;
use crate::poller::{Poller, Sample};
use crate::stats::{Recorder, Window};
use crate::workload::Engine;

/// A workload running against the system under test.
pub struct Drive {
    pub engine: Engine,
    pub rec: Arc<Recorder>,
    pub ledger: Arc<Ledger>,
    /// When the first arrival was scheduled.
    pub t0: Instant,
    pub warmup: Duration,
    pub measured: Duration,
    /// `--max-total-s` after `t0`: nothing runs past it.
    pub hard_stop: Instant,
    /// How long the operations of a window may still take after it ends: every retry of
    /// the slowest call, and a little more.
    pub settle: Duration,
    /// `--max-total-s` ended the measured part before its planned end.
    cut_short: AtomicBool,
    cpu_start: f64,
    arrivals: JoinHandle<()>,
    poller: Poller,
    progress: Progress,
}

/// How a run ended.
pub struct Driven {
    /// Operations of the main window still unanswered after it settled.
    pub unfinished_ops: u64,
    /// CPU the harness used during the run, in cores.
    pub client_cpu_cores: f64,
    pub dropped_arrivals: u64,
    /// Some lock cycles were still running a minute after the end.
    pub drain_timed_out: bool,
    pub samples: Vec<Sample>,
}

impl Drive {
    /// Starts the engine (first arrival 200 ms from now) and the poller. `expected` is the
    /// run's length after warm-up, for the progress bar; `events` happened before the start.
    pub fn start(
        args: &RunArgs,
        w: &Workload,
        backend: Backend,
        sut: &SystemUnderTest,
        expected: Duration,
        events: Vec<String>,
    ) -> Drive {
        let cpu_start = process_cpu_s();
        let t0 = Instant::now() + Duration::from_millis(200);
        let rec = Arc::new(Recorder::new(t0));
        for e in events {
            rec.event(e);
        }
        let ledger = Arc::new(Ledger::default());
        let engine = Engine::new(backend, rec.clone(), ledger.clone(), w.clone());
        let poller = Poller::start(
            sut.system,
            sut.bases.clone(),
            sut.pids.clone(),
            rec.clone(),
            Duration::from_secs(args.poll_s.max(1)),
        );
        let warmup = Duration::from_secs(w.warmup_s);
        let progress = Progress::start(&engine, t0, warmup + expected);
        let max_arrivals = (w.rate.max(args.ramp_max_rate) * args.max_total_s as f64) as u64;
        let arrivals = engine.start(t0, max_arrivals);
        Drive {
            engine,
            rec,
            ledger,
            t0,
            warmup,
            measured: Duration::from_secs(w.duration_s),
            hard_stop: t0 + Duration::from_secs(args.max_total_s),
            settle: w.request_timeout() * (w.retries + 1) + Duration::from_secs(2),
            cut_short: AtomicBool::new(false),
            cpu_start,
            arrivals,
            poller,
            progress,
        }
    }

    /// The measured window: from the end of the warm-up for `measured`.
    pub fn measured_window(&self) -> usize {
        self.rec
            .add_window(Window::new(self.warmup, self.warmup + self.measured))
    }

    /// Waits for the end of the measured window `window` (or the hard stop), then stops
    /// arrivals. Stopped by `--max-total-s`, the window ends there: its rates are over the
    /// time it measured, and the run is [`Drive::cut_short`].
    pub async fn run_to_end(&self, window: usize) {
        let planned = self.t0 + self.warmup + self.measured;
        let end = planned.min(self.hard_stop);
        tokio::time::sleep_until(end.into()).await;
        self.engine.stop_arrivals();
        if end < planned {
            self.rec
                .set_window_end(window, end.saturating_duration_since(self.t0));
            self.mark_cut_short();
        }
    }

    /// `--max-total-s` stopped the run before its planned end.
    pub fn mark_cut_short(&self) {
        self.cut_short.store(true, Ordering::Relaxed);
        self.rec.event("stopped by --max-total-s");
    }

    pub fn cut_short(&self) -> bool {
        self.cut_short.load(Ordering::Relaxed)
    }

    /// Waits until every operation started in window `idx` has finished, at most `settle`.
    pub async fn settle(&self, idx: usize) {
        let deadline = Instant::now() + self.settle;
        while self.rec.in_flight(idx) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends the run: arrivals stop, every hold ends, the poller takes its last sample.
    pub async fn finish(self, main_window: usize) -> Driven {
        let unfinished_ops = self.rec.in_flight(main_window);
        let client_cpu_cores =
            (process_cpu_s() - self.cpu_start) / self.t0.elapsed().as_secs_f64().max(1e-3);
        self.engine.stop_arrivals();
        let _ = self.arrivals.await;
        let drained = self.engine.drain(Duration::from_secs(60)).await;
        self.progress.finish();
        let samples = self.poller.finish().await;
        Driven {
            unfinished_ops,
            client_cpu_cores,
            dropped_arrivals: self.engine.counters().dropped.load(Ordering::Relaxed),
            drain_timed_out: !drained,
            samples,
        }
    }
}

/// The progress bar: seconds elapsed of those expected, and the engine's counters.
struct Progress {
    bar: ProgressBar,
    task: JoinHandle<()>,
}

impl Progress {
    fn start(engine: &Engine, t0: Instant, expected: Duration) -> Self {
        let bar = ProgressBar::new(expected.as_secs().max(1));
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {elapsed_precise} [{bar:30}] {pos}/{len}s {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let task = {
            let bar = bar.clone();
            let engine = engine.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let c = engine.counters();
                    bar.set_position(t0.elapsed().as_secs());
                    bar.set_message(format!(
                        "{:.0}/s offered · {} active · {} ok · {} failed",
                        engine.rate(),
                        c.cycles_active.load(Ordering::Relaxed),
                        c.ops_ok.load(Ordering::Relaxed),
                        c.ops_failed.load(Ordering::Relaxed)
                    ));
                }
            })
        };
        Progress { bar, task }
    }

    fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}
