//! Member health as this node sees it: every `PROBE_EVERY` it asks each other member's
//! `/readyz` (on its public API address) with a short timeout. A member that does not answer
//! shows as down after one failed probe, so a stopped node shows as down within about a
//! second.
//!
//! The probes go straight to the members' public API, not through the peer fault layer: they
//! answer "can this node reach that one's API", which is what an operator looking at the page
//! served by this node wants to know.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::node::Node;
use crate::wire::ReadyStatus;

const PROBE_EVERY: Duration = Duration::from_millis(500);
const PROBE_TIMEOUT: Duration = Duration::from_millis(400);

/// The last probe of one member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    pub up: bool,
    /// The member knows a leader (its `/readyz` answered 200).
    pub ready: bool,
    pub leader_id: Option<u64>,
    pub last_seen_ms: Option<u64>,
    pub error: Option<String>,
}

#[derive(Default)]
pub struct HealthTable {
    probes: Mutex<BTreeMap<u64, Probe>>,
}

impl HealthTable {
    pub fn get(&self, id: u64) -> Option<Probe> {
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    fn set(&self, id: u64, update: impl FnOnce(&mut Probe)) {
        let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        update(probes.entry(id).or_default());
    }
}

pub(in crate::node) async fn run(node: Arc<Node>) {
    let mut interval = tokio::time::interval(PROBE_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let members: Vec<u64> = {
            let m = node.raft.metrics();
            let m = m.borrow();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, _)| *id)
                .filter(|id| *id != node.id)
                .collect()
        };
        let probes = members.into_iter().map(|id| {
            let node = node.clone();
            async move {
                let answer = probe(&node, id).await;
                let now = node.wall_ms();
                node.ops.health.set(id, |p| match answer {
                    Ok((ready, leader_id)) => {
                        *p = Probe {
                            up: true,
                            ready,
                            leader_id,
                            last_seen_ms: Some(now),
                            error: None,
                        }
                    }
                    // Keeps the time of the last answer; what it said no longer holds.
                    Err(e) => {
                        p.up = false;
                        p.ready = false;
                        p.leader_id = None;
                        p.error = Some(e);
                    }
                });
            }
        });
        futures_join_all(probes).await;
    }
}

/// `Ok((ready, leader))` when the member answered at all (over the peer port: see
/// `Node::call_member_api`).
async fn probe(node: &Node, id: u64) -> Result<(bool, Option<u64>), String> {
    let asked = node.call_member_api(id, "GET", "/readyz", None, None, PROBE_TIMEOUT);
    let (status, body) = match tokio::time::timeout(PROBE_TIMEOUT, asked).await {
        Err(_) => return Err(format!("no answer within {} ms", PROBE_TIMEOUT.as_millis())),
        Ok(answer) => answer?,
    };
    if (200..300).contains(&status) {
        let ready: ReadyStatus = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        Ok((true, Some(ready.leader_id)))
    } else {
        // Not ready (no leader known) but alive; the body says why.
        Ok((false, None))
    }
}

/// Runs the probes concurrently, so one slow member does not delay the others' results.
async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) {
    let mut set = tokio::task::JoinSet::new();
    for f in futs {
        set.spawn(f);
    }
    while set.join_next().await.is_some() {}
}
