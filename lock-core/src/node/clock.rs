//! The clock a leader stamps its proposals with: monotonic, anchored to the log.
//!
//! Only the leader reads a clock; replicas apply the stamps, and log time is the largest stamp
//! applied. A leader's stamps are the log time it found when it took over plus the monotonic
//! time elapsed since — never its wall clock. So a wall-clock step on any node (an NTP
//! correction, or the skew the fault layer injects) neither expires leases early (a forward
//! step) nor freezes log time (a backward step, or a new leader whose clock is behind). The
//! wall clock is read once in a cluster's life: to start log time near the Unix epoch clock,
//! so that `expires_at_ms` reads as a date.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::net::FaultLayer;

/// This machine's wall clock in ms since the Unix epoch (for display and the first stamp only).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This process's monotonic clock, ms since its first reading (at start-up): what other
/// members compare the rate of this node's clock with.
pub fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[derive(Debug)]
pub struct Clock {
    skew: FaultLayer,
    anchor: Mutex<Option<Anchor>>,
}

/// Where this node's stamps for one term start.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    term: u64,
    base_ms: u64,
    at: Instant,
}

impl Clock {
    pub fn new(skew: FaultLayer) -> Self {
        Clock {
            skew,
            anchor: Mutex::new(None),
        }
    }

    /// This node's wall clock plus any injected skew, in ms since the Unix epoch. Only a
    /// brand-new cluster's first stamp uses it.
    pub fn wall_ms(&self) -> u64 {
        unix_ms().saturating_add_signed(self.skew.clock_offset_ms())
    }

    /// The stamp for a proposal in `term`, given the log time this node has applied. The first
    /// stamp of a term starts from the log time; later ones add the monotonic time elapsed
    /// since. When applying older entries moves log time past that (a new leader catching up),
    /// the anchor moves with it, so stamps never lag log time and never freeze it.
    pub fn stamp(&self, term: u64, log_now_ms: u64) -> u64 {
        let mut anchor = self.anchor.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let current = anchor.filter(|a| a.term == term).map(|a| {
            let elapsed = now.duration_since(a.at).as_millis() as u64;
            a.base_ms.saturating_add(elapsed)
        });
        match current {
            Some(stamp) if stamp >= log_now_ms => stamp,
            _ => {
                let base_ms = if log_now_ms == 0 {
                    self.wall_ms()
                } else {
                    log_now_ms
                };
                *anchor = Some(Anchor {
                    term,
                    base_ms,
                    at: now,
                });
                base_ms
            }
        }
    }
}
