//! The cluster's raft timing and log-compaction policy, as plain numbers.
//!
//! The node's raft configuration is built from these, and the load and chaos harnesses read
//! them (a pause longer than an election timeout, enough entries for several snapshots)
//! instead of keeping copies that could drift.

/// How often the leader heartbeats its followers.
pub const HEARTBEAT_MS: u64 = 100;
/// A follower starts an election after hearing nothing for a random time in this range.
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
