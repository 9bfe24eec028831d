//! `replica-down`: one of the three nodes is stopped before the run and stays down, so every
//! commit needs both remaining nodes.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use super::system::SystemUnderTest;
use crate::cluster::status;

/// Stops a follower (fencegate) or member 3 (etcd) and takes it out of `client_bases`.
/// Returns what happened, for the timeline, and the stopped node's index.
pub async fn stop_one(
    sut: &SystemUnderTest,
    http: &reqwest::Client,
    client_bases: &mut Vec<String>,
) -> anyhow::Result<(String, usize)> {
    let (idx, event) = match (&sut.local, &sut.etcd) {
        (Some(c), _) => {
            let (leader, _) = status::find_leader(http, &sut.bases)
                .await
                .context("no leader")?;
            let victim = (1..=3u64).find(|id| *id != leader).unwrap_or(3);
            c.lock().unwrap_or_else(|e| e.into_inner()).stop(victim)?;
            (
                victim as usize - 1,
                format!("node {victim} (follower) stopped"),
            )
        }
        (None, Some(e)) => {
            // Any member: etcd's leader moves on its own if it was the leader.
            e.stop_member(3);
            (2, "member 3 stopped".to_string())
        }
        _ => bail!("replica-down needs a cluster the harness starts"),
    };
    sut.pids.set(idx, None);
    client_bases.retain(|b| *b != sut.bases[idx]);
    if sut.etcd.is_some() {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok((event, idx))
}

/// How long the stopped follower took to catch up once restarted after the run.
#[derive(Clone, Debug, Serialize)]
pub struct CatchUp {
    pub node_id: u64,
    /// The leader's last applied index when the follower was restarted: the target.
    pub target_index: u64,
    /// Resource records and dedup records in the leader's state at that moment.
    pub resources_on_leader: u64,
    pub dedup_records_on_leader: u64,
    /// From the restart until the follower answered `/v1/cluster` at all.
    pub start_s: f64,
    /// From the restart until its last applied index reached the target.
    pub caught_up_s: f64,
    /// The restarted node's RSS in MiB once caught up, and its peak since the restart (the
    /// snapshot install included), if /proc could be read.
    pub rss_mib: Option<(f64, f64)>,
    /// Whether its data directory was deleted before the restart (`--lose-data`).
    pub data_lost: bool,
}

/// Restarts the follower `stop_one` stopped (fencegate only), with its data directory deleted
/// first if `lose_data`, and measures how long it takes to reach the leader's last applied
/// index of that moment: with the log purged behind several snapshots during the run, that is
/// a snapshot install plus the log after it.
pub async fn restart_and_catch_up(
    sut: &SystemUnderTest,
    http: &reqwest::Client,
    idx: usize,
    lose_data: bool,
) -> anyhow::Result<CatchUp> {
    let Some(cluster) = &sut.local else {
        bail!("catch-up is measured on clusters the harness starts");
    };
    let (leader, leader_idx) = status::find_leader(http, &sut.bases)
        .await
        .context("no leader after the run")?;
    let st = status::fetch(http, &sut.bases[leader_idx], Duration::from_secs(2)).await?;
    let target_index = st.last_applied;
    let (resources_on_leader, dedup_records_on_leader) =
        (st.locks.resources, st.locks.dedup_records);
    let node_id = idx as u64 + 1;
    debug_assert_ne!(node_id, leader);
    let started = {
        let mut cluster = cluster.lock().unwrap_or_else(|e| e.into_inner());
        if lose_data {
            cluster.lose_data(node_id)?;
        }
        let started = Instant::now();
        cluster.restart(node_id)?;
        started
    };
    let mut start_s = None;
    let deadline = started + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(s) = status::fetch(http, &sut.bases[idx], Duration::from_millis(500)).await {
            start_s.get_or_insert(started.elapsed().as_secs_f64());
            if s.last_applied >= target_index {
                let pid = cluster
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pids()
                    .get(&idx)
                    .copied();
                return Ok(CatchUp {
                    rss_mib: pid.and_then(crate::cluster::process::rss_mib),
                    node_id,
                    target_index,
                    resources_on_leader,
                    dedup_records_on_leader,
                    start_s: start_s.unwrap_or_default(),
                    caught_up_s: started.elapsed().as_secs_f64(),
                    data_lost: lose_data,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("node {node_id} did not reach index {target_index} within 120 s of its restart")
}
