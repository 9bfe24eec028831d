//! What a cluster says about itself, read through the wire contract: each node's
//! `GET /v1/cluster` ([`ClusterStatus`]), the leader, and readiness. Works on any cluster,
//! the harness's own or a `--target`.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use lock_core::wire::{classify, ClusterStatus};
use serde::de::DeserializeOwned;

/// How long one status read may take.
pub const READ_TIMEOUT: Duration = Duration::from_millis(1000);

/// Sends `req` and reads its answer as `T`; anything but a 2xx with a `T` is an error.
pub async fn typed<T: DeserializeOwned>(req: reqwest::RequestBuilder) -> anyhow::Result<T> {
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let body = resp.bytes().await?;
    classify(status, &body).map_err(|f| anyhow!("{f}"))
}

/// One node's `GET /v1/cluster`.
pub async fn fetch(
    http: &reqwest::Client,
    base: &str,
    timeout: Duration,
) -> anyhow::Result<ClusterStatus> {
    typed(http.get(format!("{base}/v1/cluster")).timeout(timeout)).await
}

/// The statuses of every reachable node, with the index of the base URL each came from.
pub async fn fetch_all(http: &reqwest::Client, bases: &[String]) -> Vec<(usize, ClusterStatus)> {
    let mut out = Vec::new();
    for (i, b) in bases.iter().enumerate() {
        if let Ok(s) = fetch(http, b, READ_TIMEOUT).await {
            out.push((i, s));
        }
    }
    out
}

/// The leader as these statuses show it: the node that says it leads in the highest term any
/// of them reports, else the leader the most recent term names. (During an election an old
/// leader may still say it leads, in an older term.)
pub fn leader<'a>(statuses: impl IntoIterator<Item = &'a ClusterStatus>) -> Option<u64> {
    let statuses: Vec<&ClusterStatus> = statuses.into_iter().collect();
    statuses
        .iter()
        .filter(|s| s.is_leader())
        .max_by_key(|s| s.term)
        .map(|s| s.node_id)
        .or_else(|| statuses.iter().max_by_key(|s| s.term)?.leader_id)
}

/// The leader's node id and the index of its base URL, if the leader itself answers.
pub async fn find_leader(http: &reqwest::Client, bases: &[String]) -> Option<(u64, usize)> {
    let st = fetch_all(http, bases).await;
    let id = leader(st.iter().map(|(_, s)| s))?;
    let (idx, _) = st.iter().find(|(_, s)| s.node_id == id)?;
    Some((id, *idx))
}

/// Waits until every node answers, they agree on a leader, and each says it is ready.
/// Returns the leader.
pub async fn wait_ready(
    http: &reqwest::Client,
    bases: &[String],
    timeout: Duration,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(leader) = ready_leader(http, bases).await {
            return Ok(leader);
        }
        if Instant::now() > deadline {
            bail!("cluster at {bases:?} not ready (no agreed leader) within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader, if every node answers, they agree on it, and each says it is ready.
pub async fn ready_leader(http: &reqwest::Client, bases: &[String]) -> Option<u64> {
    let leader = agreed_leader(http, bases).await?;
    all_ready(http, bases).await.then_some(leader)
}

/// The leader every node names, if all answer and agree.
async fn agreed_leader(http: &reqwest::Client, bases: &[String]) -> Option<u64> {
    let st = fetch_all(http, bases).await;
    if st.len() != bases.len() {
        return None;
    }
    let first = st.first()?.1.leader_id?;
    st.iter()
        .all(|(_, s)| s.leader_id == Some(first))
        .then_some(first)
}

async fn all_ready(http: &reqwest::Client, bases: &[String]) -> bool {
    let mut ready = true;
    for b in bases {
        ready &= http
            .get(format!("{b}/readyz"))
            .timeout(Duration::from_millis(500))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
    }
    ready
}
