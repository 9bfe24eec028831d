//! `leader-kill`: the leader is SIGKILLed a third of the way into the measured run (or at
//! `--fault-at-s`) and restarted `--restart-after-s` later. The report says how long the
//! election took, when operations succeeded again, and when the restarted node caught up.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::drive::Drive;
use super::system::SystemUnderTest;
use crate::cluster::status::{self, READ_TIMEOUT};
use crate::cluster::LocalCluster;
use crate::config::{RunArgs, Workload};
use crate::poller::Pids;
use crate::report::LeaderKillReport;
use crate::stats::{Op, Recorder, Second, Window};

/// Runs the measured window with the kill in it; returns the window and the fault's report.
pub async fn drive(
    d: &Drive,
    sut: &SystemUnderTest,
    http: &reqwest::Client,
    args: &RunArgs,
    w: &Workload,
) -> anyhow::Result<(usize, Option<LeaderKillReport>)> {
    let cluster = sut
        .local
        .clone()
        .context("leader-kill needs a local cluster")?;
    let window = d.measured_window();
    let fault = Fault {
        cluster,
        http: http.clone(),
        bases: sut.bases.clone(),
        pids: sut.pids.clone(),
        rec: d.rec.clone(),
        restart_after: Duration::from_secs(args.restart_after_s),
    };
    let at = d.t0 + d.warmup + Duration::from_secs(args.fault_at_s.unwrap_or(w.duration_s / 3));
    let fault = tokio::spawn(fault.run(at));
    d.run_to_end(window).await;
    let report = if Instant::now() < at {
        // `--max-total-s` ended the run before the kill: there is no fault to report.
        fault.abort();
        None
    } else {
        fault.await.ok().and_then(|r| r.ok())
    };
    d.settle(window).await;
    Ok((window, report))
}

/// What the fault needs, moved into its task.
struct Fault {
    cluster: Arc<Mutex<LocalCluster>>,
    http: reqwest::Client,
    bases: Vec<String>,
    pids: Pids,
    rec: Arc<Recorder>,
    restart_after: Duration,
}

impl Fault {
    /// SIGKILLs the leader at `at`, watches the election, restarts the node after
    /// `restart_after` and waits for it to catch up.
    async fn run(self, at: Instant) -> anyhow::Result<LeaderKillReport> {
        tokio::time::sleep_until(at.into()).await;
        let (leader, idx) = status::find_leader(&self.http, &self.bases)
            .await
            .context("no leader to kill")?;
        let mut report = LeaderKillReport {
            killed_node: leader,
            ..Default::default()
        };
        let slot = self.rec.watch_recovery();
        let killed = Instant::now();
        {
            let mut c = self.cluster.lock().unwrap_or_else(|e| e.into_inner());
            tokio::task::block_in_place(|| c.kill(leader))?;
        }
        report.killed_at_s = self
            .rec
            .event(format!("leader node {leader} killed (SIGKILL)"));
        let kill_t = Duration::from_secs_f64(report.killed_at_s);
        report.fault_window = Some(self.rec.add_window(Window::new(
            kill_t,
            kill_t + self.restart_after + Duration::from_secs(10),
        )));
        self.pids.set(idx, None);
        let survivors: Vec<String> = self
            .bases
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != idx)
            .map(|(_, b)| b.clone())
            .collect();
        self.watch_election(leader, killed, &survivors, &mut report)
            .await;
        tokio::time::sleep_until((killed + self.restart_after).into()).await;
        self.restart(leader, idx, &survivors, &mut report).await?;
        if let Some((_, first)) = self.rec.recovery(slot) {
            report.first_success_after_ms = Some(first.saturating_sub(kill_t).as_millis() as u64);
        }
        Ok(report)
    }

    /// Polls the survivors until one says it leads (at most 30 s, or until the restart).
    async fn watch_election(
        &self,
        old: u64,
        killed: Instant,
        survivors: &[String],
        report: &mut LeaderKillReport,
    ) {
        let deadline = killed + self.restart_after.max(Duration::from_secs(30));
        while Instant::now() < deadline {
            let st = status::fetch_all(&self.http, survivors).await;
            if let Some((_, s)) = st.iter().find(|(_, s)| s.is_leader() && s.node_id != old) {
                let new = s.node_id;
                report.new_leader_after_ms = Some(killed.elapsed().as_millis() as u64);
                report.new_leader = Some(new);
                self.rec.event(format!("node {new} leads"));
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Restarts the killed node and waits (at most a minute) until it has applied what the
    /// survivors had applied when it came back.
    async fn restart(
        &self,
        leader: u64,
        idx: usize,
        survivors: &[String],
        report: &mut LeaderKillReport,
    ) -> anyhow::Result<()> {
        let st = status::fetch_all(&self.http, survivors).await;
        let leader_applied = st.iter().map(|(_, s)| s.last_applied).max().unwrap_or(0);
        {
            let mut c = self.cluster.lock().unwrap_or_else(|e| e.into_inner());
            c.restart(leader)?;
            if let Some(pid) = c.pids().get(&idx) {
                self.pids.set(idx, Some(*pid));
            }
        }
        let restarted = Instant::now();
        report.restarted_at_s = Some(self.rec.event(format!("node {leader} restarted")));
        let deadline = restarted + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(s) = status::fetch(&self.http, &self.bases[idx], READ_TIMEOUT).await {
                if s.last_applied >= leader_applied {
                    report.caught_up_after_ms = Some(restarted.elapsed().as_millis() as u64);
                    self.rec.event(format!("node {leader} caught up"));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

/// Fills in what the recorder knows after the run: the longest stretch without a
/// successful acquire from the kill on, and the failures during the fault window.
pub fn finish(k: &mut LeaderKillReport, timeline: &[Second], rec: &Recorder) {
    let start = k.killed_at_s.floor() as u64;
    let mut run = 0;
    let mut best = 0;
    for s in timeline.iter().filter(|s| s.t >= start) {
        if s.ok[0] == 0 {
            run += 1;
            best = best.max(run);
        } else if run > 0 || s.t > start + 60 {
            run = 0;
            if s.t > start + 60 {
                break;
            }
        }
    }
    k.seconds_without_acquires = best;
    if let Some(idx) = k.fault_window {
        rec.with_window(idx, |win| {
            for op in Op::ALL {
                for (code, n) in &win.op(op).errors_by_code {
                    *k.errors_by_code
                        .entry(format!("{}:{code}", op.name()))
                        .or_default() += n;
                }
                k.failed_ops += win.op(op).failed;
            }
        });
    }
}
