//! The clock a leader stamps its proposals with.
//!
//! Only the leader reads a clock; replicas apply the stamps. The reading is this node's wall
//! clock plus the skew the fault layer injects (zero unless a test or chaos run sets one).

use crate::net::FaultLayer;

#[derive(Clone, Debug)]
pub struct Clock {
    skew: FaultLayer,
}

impl Clock {
    pub fn new(skew: FaultLayer) -> Self {
        Clock { skew }
    }

    /// Milliseconds since the Unix epoch, as this node's stamps see it.
    pub fn now_ms(&self) -> u64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        wall.saturating_add_signed(self.skew.clock_offset_ms())
    }
}
