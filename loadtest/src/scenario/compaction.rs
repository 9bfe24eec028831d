//! `compaction`: a run long enough to cross several snapshots and log purges, so their cost
//! shows in the latencies and the summary counts them.

use lock_core::timing::SNAPSHOT_EVERY_ENTRIES;

use crate::config::{RunArgs, Workload};
use crate::report::ServerSummary;

/// Snapshots a run should cross.
const SNAPSHOTS_WANTED: f64 = 4.0;

/// Without an explicit `--duration-s`, lengthens the run to cross about four snapshots at
/// the commit rate the workload should produce (an acquire and a release per arrival, plus
/// the renewals of the active locks).
pub fn size_run(w: &mut Workload, args: &RunArgs) {
    if args.duration_s.is_some() {
        return;
    }
    let commits = 2.0 * w.rate + w.active_locks as f64 * 1000.0 / w.renew_interval_ms as f64;
    let needed = (SNAPSHOTS_WANTED * SNAPSHOT_EVERY_ENTRIES as f64 / commits).ceil() as u64;
    w.duration_s = w.duration_s.max(needed);
}

/// A warning if the run crossed too few snapshots to say much.
pub fn too_few_snapshots(server: &ServerSummary) -> Option<String> {
    (server.snapshots < 3).then(|| {
        format!(
            "only {} snapshots during the run: raise --duration-s or --rate to cross more",
            server.snapshots
        )
    })
}
