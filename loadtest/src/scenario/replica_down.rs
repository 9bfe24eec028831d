//! `replica-down`: one of the three nodes is stopped before the run and stays down, so every
//! commit needs both remaining nodes.

use std::time::Duration;

use anyhow::{bail, Context};

use super::system::SystemUnderTest;
use crate::cluster::status;

/// Stops a follower (fencegate) or member 3 (etcd) and takes it out of `client_bases`.
/// Returns what happened, for the timeline.
pub async fn stop_one(
    sut: &SystemUnderTest,
    http: &reqwest::Client,
    client_bases: &mut Vec<String>,
) -> anyhow::Result<String> {
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
    Ok(event)
}
