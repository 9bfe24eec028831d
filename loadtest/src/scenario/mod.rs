//! One run: set up the system under test, drive the workload through a scenario, collect the
//! client's and the server's view, tear down.
//!
//! - [`system`]: the cluster under test (started here, or a `--target`), or etcd ([`etcd`]).
//! - [`drive`]: what every scenario shares: the open-loop engine, the recorder, the server
//!   poller, the end of the run.
//! - one file per scenario: [`steady`], [`replica_down`], [`leader_kill`], [`compaction`],
//!   [`ramp`].
//! - [`summary`]: the numbers of a window and of the server samples.

mod compaction;
mod drive;
mod etcd;
mod leader_kill;
mod ramp;
mod replica_down;
mod steady;
mod summary;
mod system;

pub use replica_down::CatchUp;
pub use system::SystemUnderTest;

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use clap::ValueEnum;

use crate::config::{prepare_out, RunArgs, Scenario, System, Workload};
use crate::poller::{self, Sample};
use crate::report::{self, Artifacts, Machine, Summary};
use crate::stats::Second;
use drive::Drive;

const CLOSED_LOOP: &str = "the cycles scenario is closed loop: crate::closed_loop runs it";

/// The outcome of one run, with what is needed to plot it.
pub struct RunResult {
    pub summary: Summary,
    pub timeline: Vec<Second>,
    pub samples: Vec<Sample>,
    pub cdf: Vec<crate::plot::Series>,
}

impl RunResult {
    /// Why the run does not stand as a measurement, if it does not: nothing was measured, or
    /// `--max-total-s` cut it short. (Safety violations are [`RunResult::unsafe_`].)
    pub fn unusable(&self) -> Vec<String> {
        let s = &self.summary;
        let mut out = Vec::new();
        if s.ops.get("acquire").is_none_or(|o| o.ok == 0) {
            out.push(format!(
                "nothing was measured: no acquire succeeded in the {:.1} s measured (the failed \
                 attempts are listed above; is the target a running {} cluster?)",
                s.measured_s, s.system
            ));
        }
        if s.cut_short {
            out.push(format!(
                "--max-total-s {} cut the run short: {:.1} s measured (see the warning above)",
                s.max_total_s, s.measured_s
            ));
        }
        out
    }

    /// Safety violations: the client's invariants, or a server token below one it granted.
    pub fn unsafe_(&self) -> bool {
        let s = &self.summary;
        s.invariants.violations_total() > 0 || s.server_token_consistent == Some(false)
    }

    /// Ok if the run stands: no safety violation, something measured, not cut short.
    pub fn verdict(&self) -> anyhow::Result<()> {
        let mut why = Vec::new();
        if self.unsafe_() {
            why.push("safety violations found (see above)".to_string());
        }
        why.extend(self.unusable());
        if !why.is_empty() {
            bail!("{}", why.join("; "));
        }
        Ok(())
    }

    /// summary.json, timeline.json and the plots, in `dir`.
    pub fn write_out(&self, dir: &Path) -> anyhow::Result<()> {
        report::write_out(
            dir,
            &Artifacts {
                summary: &self.summary,
                cdf: &self.cdf,
                timeline: &self.timeline,
                samples: &self.samples,
            },
        )
    }
}

/// Runs one scenario against one system and prints its table.
pub async fn run_and_print(args: &RunArgs, system: System) -> anyhow::Result<RunResult> {
    eprintln!(
        "{system}: {} scenario, {} profile",
        value_name(args.scenario),
        value_name(args.profile)
    );
    if args.profile == crate::config::Profile::Smoke {
        eprintln!("(a short, scaled-down run; the full seed workload is --profile seed)");
    }
    let result = run(args, system).await?;
    report::print_table(&result.summary);
    Ok(result)
}

/// Checks every flag of a run on `system` (the closed loop's own are checked by
/// `closed_loop`) and that `--out` can be written, before anything starts: a run must not
/// fail on its arguments after it has done its work.
pub fn check_args(args: &RunArgs, system: System) -> anyhow::Result<()> {
    args.validate()?;
    let scenario = args.scenario;
    if args.lose_data && (scenario != Scenario::ReplicaDown || system != System::Fencegate) {
        bail!("--lose-data applies to fencegate's replica-down scenario only");
    }
    if scenario != Scenario::Cycles {
        let w = workload(args)?;
        if scenario == Scenario::Ramp && args.ramp_max_rate < w.rate {
            bail!(
                "--ramp-max-rate {} is below the first step's rate {} (--rate)",
                args.ramp_max_rate,
                w.rate
            );
        }
        if scenario == Scenario::LeaderKill {
            let at = args.fault_at_s.unwrap_or(w.duration_s / 3);
            if at >= w.duration_s {
                bail!(
                    "--fault-at-s {at} is not within the {} s measured (--duration-s)",
                    w.duration_s
                );
            }
        }
    }
    SystemUnderTest::check(args, system)?;
    if let Some(out) = &args.out {
        prepare_out(out)?;
    }
    Ok(())
}

/// The workload of an open-loop run, sized for its scenario.
fn workload(args: &RunArgs) -> anyhow::Result<Workload> {
    let mut w = Workload::resolve(args)?;
    if args.scenario == Scenario::Compaction {
        compaction::size_run(&mut w, args);
    }
    Ok(w)
}

/// Runs one scenario against one system ([`check_args`] first).
async fn run(args: &RunArgs, system: System) -> anyhow::Result<RunResult> {
    let scenario = args.scenario;
    if scenario == Scenario::Cycles {
        bail!(CLOSED_LOOP);
    }
    let w = workload(args)?;
    let machine = Machine::read();
    let mut warnings = Vec::new();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let sut = SystemUnderTest::start(args, system, w.writes_per_hold > 0, &http).await?;

    let mut client_bases = sut.bases.clone();
    let mut events = Vec::new();
    let mut stopped = None;
    if scenario == Scenario::ReplicaDown {
        let (event, idx) = replica_down::stop_one(&sut, &http, &mut client_bases).await?;
        events.push(event);
        stopped = Some(idx);
    }
    let backend = sut.client(&w.client_opts(), &http, &client_bases).await?;
    if w.writes_per_hold > 0 && !backend.supports_writes() {
        warnings.push(
            "fenced writes need the fencing proxy (fencegate, local or --proxy-target); skipped"
                .into(),
        );
    }

    let expected = match scenario {
        Scenario::Ramp => Duration::from_secs(ramp::step_s(args) * ramp::EXPECTED_STEPS),
        _ => Duration::from_secs(w.duration_s),
    };
    let d = Drive::start(args, &w, backend, &sut, expected, events);
    let (main_window, leader_kill, ramp) = match scenario {
        Scenario::Ramp => {
            let (report, window) = ramp::drive(&d, args, &w).await;
            (window, None, Some(report))
        }
        Scenario::LeaderKill => {
            let (window, report) = leader_kill::drive(&d, &sut, &http, args, &w).await?;
            (window, report, None)
        }
        Scenario::Steady | Scenario::ReplicaDown | Scenario::Compaction => {
            (steady::drive(&d).await, None, None)
        }
        Scenario::Cycles => bail!(CLOSED_LOOP),
    };
    let (rec, ledger) = (d.rec.clone(), d.ledger.clone());
    let cut_short = d.cut_short();
    let driven = d.finish(main_window).await;
    if driven.drain_timed_out {
        warnings.push(
            "some lock cycles were still running 60 s after the end (drain timed out)".into(),
        );
    }

    // ---- after the run ----
    let node_failures = sut.crashed();
    let catch_up = match stopped {
        Some(idx) if sut.local.is_some() => {
            match replica_down::restart_and_catch_up(&sut, &http, idx, args.lose_data).await {
                Ok(c) => {
                    let rss = c.rss_mib.map_or(String::new(), |(now, peak)| {
                        format!(", RSS {now:.0} MiB (peak {peak:.0})")
                    });
                    let empty = if c.data_lost {
                        " with its data directory deleted"
                    } else {
                        ""
                    };
                    eprintln!(
                        "node {} restarted{empty}: answering after {:.2} s, caught up with index \
                         {} ({} resources, {} dedup records) after {:.2} s{rss}",
                        c.node_id,
                        c.start_s,
                        c.target_index,
                        c.resources_on_leader,
                        c.dedup_records_on_leader,
                        c.caught_up_s
                    );
                    Some(c)
                }
                Err(e) => {
                    warnings.push(format!("catch-up after the run: {e:#}"));
                    None
                }
            }
        }
        _ => None,
    };
    let invariants = ledger.report();
    let server_token_consistent = sut
        .last_token(&http)
        .await
        .map(|t| t >= invariants.max_token);
    let (from, to) = rec.with_window(main_window, |win| {
        (win.start.as_secs_f64(), win.end.as_secs_f64())
    });
    let server = summary::server(system, &driven.samples, from, to);
    let mut timeline = rec.timeline();
    let commits = poller::counter_by_second(
        &driven.samples,
        timeline.len(),
        poller::commits_of,
        system == System::Fencegate,
    );
    let slow_syncs =
        poller::counter_by_second(&driven.samples, timeline.len(), |s| &s.slow_syncs, true);
    for ((sec, c), slow) in timeline.iter_mut().zip(commits).zip(slow_syncs) {
        sec.server_commits = c;
        sec.slow_syncs = slow;
    }
    let steal = summary::steal(&driven.samples, &rec, &mut timeline, from, to);
    let slow_syncs = summary::slow_syncs(&rec, &driven.samples, &timeline, from, to);
    if let Some(st) = steal
        .as_ref()
        .filter(|st| st.stolen_seconds * 10 > st.seconds)
    {
        warnings.push(format!(
            "the hypervisor ran something else on this machine's CPUs in {} of {} s \
             ({:.1} % of the CPU on average), which slows every process on it; {}",
            st.stolen_seconds,
            st.seconds,
            st.mean_pct,
            st.quiet_part()
        ));
    }
    let mut leader_kill = leader_kill;
    if let Some(k) = leader_kill.as_mut() {
        leader_kill::finish(k, &timeline, &rec);
    }
    if scenario == Scenario::Compaction {
        warnings.extend(compaction::too_few_snapshots(&server));
    }
    let client = rec.with_window(main_window, summary::client);
    warnings.extend(client.harness_wait.warning(w.connections, w.leader_only));
    if cut_short {
        let asked = match scenario {
            Scenario::Ramp => "the ramp's steps".to_string(),
            _ => format!("the {} s asked for", w.duration_s),
        };
        warnings.push(format!(
            "--max-total-s {} stopped the run before its end: {:.1} s measured of {asked}; \
             the rates above are over the time measured",
            args.max_total_s, client.measured_s
        ));
    }
    let mut summary = Summary {
        system: system.to_string(),
        scenario: value_name(scenario),
        profile: value_name(args.profile),
        cluster: sut.desc.clone(),
        machine,
        workload: w.clone(),
        measured_s: client.measured_s,
        cut_short,
        max_total_s: args.max_total_s,
        ops: client.ops,
        unfinished_ops: driven.unfinished_ops,
        client_cpu_cores: driven.client_cpu_cores,
        harness_wait: client.harness_wait,
        lock_cycles_per_s: client.lock_cycles_per_s,
        server,
        steal,
        slow_syncs,
        invariants,
        server_token_consistent,
        dropped_arrivals: driven.dropped_arrivals,
        events: rec.events(),
        leader_kill,
        ramp,
        catch_up,
        node_failures,
        warnings,
    };
    if scenario == Scenario::Ramp {
        ramp::fill_in_commits(&mut summary, &driven.samples, ramp::step_s(args));
    }
    sut.stop();
    Ok(RunResult {
        summary,
        timeline,
        samples: driven.samples,
        cdf: client.cdf,
    })
}

/// A flag value's name as the command line spells it (`replica-down`).
pub fn value_name(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}
