//! `ramp`: the acquisition rate rises step by step (`--ramp-factor` per `--ramp-step-s`) until
//! a step's p99 passes `--ramp-bound-ms` or it can no longer be sustained; the report is the
//! highest rate sustained under the bound (and under the tighter `--ramp-tight-bound-ms`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::drive::Drive;
use crate::config::{Profile, RunArgs, Workload};
use crate::poller::{self, Sample};
use crate::report::{RampReport, RampStep, Summary};
use crate::stats::{Op, Window};

/// Steps the progress bar expects (the ramp stops when it must).
pub const EXPECTED_STEPS: u64 = 12;

/// Seconds per step.
pub fn step_s(args: &RunArgs) -> u64 {
    args.ramp_step_s.unwrap_or(match args.profile {
        Profile::Seed => 20,
        Profile::Smoke => 4,
    })
}

/// The first part of each step, left out of its numbers: the active-lock population adjusts
/// to the new rate.
fn adjusting(step: Duration) -> Duration {
    (step / 4).min(Duration::from_secs(5))
}

/// Runs the steps from `w.rate` on; returns the report and a window over every step.
pub async fn drive(d: &Drive, args: &RunArgs, w: &Workload) -> (RampReport, usize) {
    let (engine, rec) = (&d.engine, &d.rec);
    let step = Duration::from_secs(step_s(args));
    let skip = adjusting(step);
    let mut report = RampReport {
        bound_ms: args.ramp_bound_ms,
        tight_bound_ms: args.ramp_tight_bound_ms,
        ..Default::default()
    };
    let mut rate = w.rate;
    let mut start = d.warmup;
    // The end of the last step that ran.
    let mut ran_until = start;
    engine.set_rate(rate);
    let whole = rec.add_window(Window::new(d.warmup, Duration::from_secs(args.max_total_s)));
    loop {
        let end = d.t0 + start + step;
        if end > d.hard_stop {
            report.stopped_because = "hit --max-total-s".into();
            engine.stop_arrivals();
            d.mark_cut_short();
            break;
        }
        let idx = rec.add_window(Window::new(start + skip, start + step));
        rec.event(format!("{rate:.0}/s"));
        tokio::time::sleep_until(end.into()).await;
        let next = rate * args.ramp_factor;
        let last = next > args.ramp_max_rate;
        if !last {
            engine.set_rate(next);
        } else {
            engine.stop_arrivals();
        }
        d.settle(idx).await;
        ran_until = start + step;
        let st = rec.with_window(idx, |win| step_report(win, rate, args.ramp_bound_ms));
        let over = !st.sustained;
        let why = if st.all_p99_ms > args.ramp_bound_ms {
            format!(
                "p99 {:.1} ms > {} ms at {rate:.0}/s",
                st.all_p99_ms, args.ramp_bound_ms
            )
        } else {
            format!(
                "not sustained at {rate:.0}/s (achieved {:.0}/s, {} errors)",
                st.achieved_acquires_per_s, st.errors
            )
        };
        report.steps.push(st);
        if over {
            report.stopped_because = why;
            engine.stop_arrivals();
            break;
        }
        if last {
            report.stopped_because = "reached --ramp-max-rate".into();
            break;
        }
        rate = next;
        start += step;
    }
    rec.set_window_end(whole, ran_until);
    for st in &report.steps {
        if st.sustained {
            report.max_rate_under_bound = Some(st.target_rate);
        }
        if st.sustained && st.all_p99_ms <= args.ramp_tight_bound_ms {
            report.max_rate_under_tight_bound = Some(st.target_rate);
        }
    }
    (report, whole)
}

/// One step's numbers; sustained if it achieved 95 % of the offered rate with under 1 %
/// errors and p99 within the bound.
fn step_report(win: &Window, rate: f64, bound_ms: f64) -> RampStep {
    let secs = win.secs();
    let mut p99 = BTreeMap::new();
    let mut errors = 0;
    let mut ops = 0;
    for op in Op::LOCK_OPS {
        let s = win.op(op);
        if s.ok > 0 {
            p99.insert(
                op.name().to_string(),
                s.hist.value_at_quantile(0.99) as f64 / 1000.0,
            );
        }
        errors += s.failed;
        ops += s.ok;
    }
    let all_p99 = if win.all.is_empty() {
        0.0
    } else {
        win.all.value_at_quantile(0.99) as f64 / 1000.0
    };
    let achieved = win.op(Op::Acquire).ok as f64 / secs;
    RampStep {
        target_rate: rate,
        achieved_acquires_per_s: achieved,
        lock_ops_per_s: ops as f64 / secs,
        commits_per_s: 0.0,
        p99_ms: p99,
        all_p99_ms: all_p99,
        errors,
        sustained: achieved >= 0.95 * rate
            && (errors as f64) < 0.01 * ops.max(1) as f64
            && all_p99 <= bound_ms,
    }
}

/// Fills in the server-side commit rate of each ramp step from the poller's samples.
pub fn fill_in_commits(summary: &mut Summary, samples: &[Sample], step_s: u64) {
    let sum = summary.system == "fencegate";
    let events = &summary.events;
    if let Some(r) = summary.ramp.as_mut() {
        let step = Duration::from_secs(step_s);
        for st in r.steps.iter_mut() {
            let label = format!("{:.0}/s", st.target_rate);
            if let Some(e) = events.iter().find(|e| e.what == label) {
                let skip = adjusting(step).as_secs_f64();
                let (from, to) = (e.t_s + skip, e.t_s + step.as_secs_f64());
                let secs = poller::covered(samples, from, to).max(1e-9);
                st.commits_per_s =
                    poller::growth(samples, from, to, poller::commits_of, sum) / secs;
            }
        }
        for st in &r.steps {
            if st.sustained && Some(st.target_rate) == r.max_rate_under_bound {
                r.max_commits_per_s_under_bound = Some(st.commits_per_s);
            }
            if st.sustained && Some(st.target_rate) == r.max_rate_under_tight_bound {
                r.max_commits_per_s_under_tight_bound = Some(st.commits_per_s);
            }
        }
    }
}
