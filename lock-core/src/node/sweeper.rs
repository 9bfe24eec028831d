//! The leader's sweeper: proposes `Tick` when something in the state machine is due.
//!
//! Expiry is a committed command: only the leader reads its clock, and replicas
//! expire leases when they apply the tick. The sweeper also ticks at least once a second
//! while leases exist, so log time never lags the leader's clock by much — that bounds how
//! much idle time a failover can credit to a lease (see `machine::LockMachine`).

use std::sync::Arc;
use std::time::Duration;

use super::Node;
use crate::machine::Command;

const INTERVAL: Duration = Duration::from_millis(25);
const HEARTBEAT_MS: u64 = 1_000;
const MAX_ITEMS: u32 = 5_000;

pub(super) async fn run(node: Arc<Node>) {
    let mut interval = tokio::time::interval(INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        // Every node reads its clock each tick, so that it stays anchored in the current term
        // and what a follower judges by log time (claims whose lease ended, say) moves on
        // while nothing is committed.
        let now = node.now_ms();
        if node.current_leader() != Some(node.id) {
            continue;
        }
        let (next, has_leases, log_now) = node
            .machine
            .read(|m| (m.next_deadline(), m.has_leases(), m.now_ms()));
        // Idempotency records are forgotten by ticks too, once their tombstone window ends.
        let next = match (next, node.machine.next_idem_purge_ms()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let due = next.is_some_and(|d| d <= now);
        let stale = has_leases && now >= log_now.saturating_add(HEARTBEAT_MS);
        if !(due || stale) {
            continue;
        }
        let timeout = Duration::from_millis(node.config.policy.write_timeout_ms);
        if let Err(e) = node
            .propose_local(
                Command::Tick {
                    max_items: MAX_ITEMS,
                },
                timeout,
            )
            .await
        {
            tracing::debug!(node = node.id, error = %e, "tick not committed");
        }
    }
}
