//! Peer transport: raft RPCs and internal forwarding between nodes, over HTTP on real TCP in a
//! compact binary format, with a fault layer tests and the chaos harness use to partition,
//! delay and drop.

pub mod auth;
pub mod codec;
mod faults;
pub mod frames;
mod peer_client;
mod raft_network;

pub use auth::{PeerSecret, AUTH_HEADER};
pub use faults::{FaultLayer, FaultRule, FaultSnapshot};
pub use peer_client::{PeerClient, PeerError, FROM_HEADER};
pub use raft_network::NetworkFactory;
