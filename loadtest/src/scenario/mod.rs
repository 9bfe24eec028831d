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

use crate::config::{RunArgs, Scenario, System, Workload};
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

/// Runs one scenario against one system.
async fn run(args: &RunArgs, system: System) -> anyhow::Result<RunResult> {
    let scenario = args.scenario;
    if scenario == Scenario::Cycles {
        bail!(CLOSED_LOOP);
    }
    if args.lose_data && (scenario != Scenario::ReplicaDown || system != System::Fencegate) {
        bail!("--lose-data applies to fencegate's replica-down scenario only");
    }
    let mut w = Workload::resolve(args)?;
    if scenario == Scenario::Compaction {
        compaction::size_run(&mut w, args);
    }
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
    let mut summary = Summary {
        system: system.to_string(),
        scenario: value_name(scenario),
        profile: value_name(args.profile),
        cluster: sut.desc.clone(),
        machine,
        workload: w.clone(),
        measured_s: client.measured_s,
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
fn value_name(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}
