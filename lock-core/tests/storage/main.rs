//! The fjall store that raft runs on: votes and log entries are on disk before they are
//! acknowledged, and everything raft relies on comes back after a reopen.
//!
//! `suite` runs openraft's storage conformance suite; `recovery` writes, drops everything,
//! reopens the same directory and compares.

mod recovery;
mod suite;
