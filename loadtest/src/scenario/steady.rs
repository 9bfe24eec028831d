//! `steady`: the workload on a healthy cluster, a warm-up and then the measured window. The
//! replica-down and compaction scenarios drive the same way on a cluster set up differently.

use super::drive::Drive;

/// Runs the measured window; returns it.
pub async fn drive(d: &Drive) -> usize {
    let window = d.measured_window();
    d.run_to_end(window).await;
    d.settle(window).await;
    window
}
