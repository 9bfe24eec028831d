//! The node's errors: fatal ones (storage, raft) and why a command was not committed.

use serde::{Deserialize, Serialize};

use crate::store;

/// Fatal errors starting or running a node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    // Transparent: a storage error says what it is about, and printed with its causes (as
    // `fencegate node` prints a failed start) a prefix carrying it again repeated it.
    #[error(transparent)]
    Storage(#[from] store::StoreError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The data directory (or a file of the node's in it) cannot be created or written.
    #[error("data directory {}: {source}", path.display())]
    DataDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("configuration: {0}")]
    Config(String),
}

/// Why a command could not be committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// This node is not the leader; it names the leader if it knows one.
    #[error("not the leader (leader: {0:?})")]
    NotLeader(Option<u64>),
    /// No quorum answered within the write timeout.
    #[error("no quorum within the write timeout")]
    NoQuorum,
    /// The raft node stopped.
    #[error("raft stopped: {0}")]
    Stopped(String),
    /// The leader's write queue is full: the command was refused before it was queued, so
    /// nothing of it happened.
    #[error("{queued} commands are waiting for the raft log; retry in {retry_after_ms} ms")]
    Overloaded { queued: usize, retry_after_ms: u64 },
}
