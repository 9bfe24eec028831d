//! The cluster's raft timing and log-compaction policy, as plain numbers.
//!
//! The node's raft configuration is built from these (the heartbeat and election timing from a
//! node's [`RaftTiming`], these constants by default), and the load and chaos harnesses, which
//! run nodes with the defaults, read them (a pause longer than an election timeout, enough
//! entries for several snapshots) instead of keeping copies that could drift.

use serde::{Deserialize, Serialize};

/// How often the leader heartbeats its followers, by default.
pub const HEARTBEAT_MS: u64 = 100;
/// By default a follower starts an election after hearing nothing for a random time in this
/// range.
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 400;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 800;

/// A snapshot is built every this many log entries, or every this many commands, whichever
/// comes first. Under load an entry is a batch of tens of commands, and a follower that
/// restarts replays every command after the snapshot it gets: counting commands bounds that
/// replay (a quarter of a million commands apply in one to two seconds) where counting entries
/// alone let it grow to a million...
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 20_000;
pub const SNAPSHOT_EVERY_COMMANDS: u64 = 250_000;
/// ...and this many entries are kept behind it, so a briefly slow follower catches up from the
/// log instead of a snapshot.
pub const LOG_KEPT_BEHIND_SNAPSHOT: u64 = 5_000;
/// A snapshot sent to a follower crosses in chunks of this many bytes, so its size has no
/// ceiling while every request stays small.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 1 << 20;
/// How long one snapshot chunk may take to send. The last chunk's reply waits for the
/// follower to decode and install the whole snapshot (and sync it to disk), which for the seed
/// state takes a few hundred milliseconds; a busy machine gets ample room.
pub const SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 10_000;

/// Raft's heartbeat and election timing of one node (`[node.raft]` in its config file). Every
/// member of a cluster should use the same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftTiming {
    /// How often the leader sends each follower an append or a heartbeat. It is also how long
    /// the leader waits for a follower to answer one append: a follower whose round trip
    /// (network, append and disk sync) takes longer gets no entries at all.
    pub heartbeat_ms: u64,
    /// A follower that hears nothing from the leader for a random time between this and twice
    /// this starts an election.
    pub election_timeout_ms: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat_ms: HEARTBEAT_MS,
            election_timeout_ms: ELECTION_TIMEOUT_MIN_MS,
        }
    }
}

impl RaftTiming {
    /// Shortest heartbeat interval a node accepts.
    pub const MIN_HEARTBEAT_MS: u64 = 10;
    /// Longest heartbeat interval a node accepts.
    pub const MAX_HEARTBEAT_MS: u64 = 10_000;
    /// The election timeout is at least this many heartbeats, so a follower starts an
    /// election only after missing several in a row.
    pub const MIN_HEARTBEATS_PER_ELECTION: u64 = 3;
    /// Longest election timeout a node accepts: a leader's crash leaves the cluster without
    /// one for about this long.
    pub const MAX_ELECTION_TIMEOUT_MS: u64 = 60_000;

    /// The upper end of the election timeout's random range.
    pub fn election_timeout_max_ms(&self) -> u64 {
        self.election_timeout_ms.saturating_mul(2)
    }

    /// Checks the timing is usable; the error names the offending setting.
    pub fn validate(&self) -> Result<(), String> {
        let (min_hb, max_hb) = (Self::MIN_HEARTBEAT_MS, Self::MAX_HEARTBEAT_MS);
        if !(min_hb..=max_hb).contains(&self.heartbeat_ms) {
            return Err(format!(
                "raft.heartbeat_ms ({}) must lie between {min_hb} and {max_hb}",
                self.heartbeat_ms
            ));
        }
        let least = self
            .heartbeat_ms
            .saturating_mul(Self::MIN_HEARTBEATS_PER_ELECTION);
        if self.election_timeout_ms < least {
            return Err(format!(
                "raft.election_timeout_ms ({}) must be at least {} heartbeats ({least} ms with \
                 heartbeat_ms = {}), or followers start elections while the leader is fine",
                self.election_timeout_ms,
                Self::MIN_HEARTBEATS_PER_ELECTION,
                self.heartbeat_ms
            ));
        }
        if self.election_timeout_ms > Self::MAX_ELECTION_TIMEOUT_MS {
            return Err(format!(
                "raft.election_timeout_ms ({}) is above the limit of {}: a leader's crash would \
                 leave the cluster without one for that long",
                self.election_timeout_ms,
                Self::MAX_ELECTION_TIMEOUT_MS
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_timing_is_valid_and_matches_the_constants() {
        let t = RaftTiming::default();
        assert_eq!(t.validate(), Ok(()));
        assert_eq!(t.heartbeat_ms, HEARTBEAT_MS);
        assert_eq!(t.election_timeout_ms, ELECTION_TIMEOUT_MIN_MS);
        assert_eq!(t.election_timeout_max_ms(), ELECTION_TIMEOUT_MAX_MS);
    }

    #[test]
    fn unusable_timing_is_refused_naming_the_setting() {
        let bad = [
            (1, 400, "heartbeat_ms"),
            (20_000, 100_000, "heartbeat_ms"),
            (100, 250, "election_timeout_ms"),
            (1_000, 120_000, "election_timeout_ms"),
        ];
        for (heartbeat_ms, election_timeout_ms, setting) in bad {
            let t = RaftTiming {
                heartbeat_ms,
                election_timeout_ms,
            };
            let err = t.validate().expect_err(setting);
            assert!(err.contains(setting), "{err}");
        }
        let wide = RaftTiming {
            heartbeat_ms: 500,
            election_timeout_ms: 2_500,
        };
        assert_eq!(wide.validate(), Ok(()));
    }
}
