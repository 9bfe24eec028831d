//! The replication path: command batching on the leader, peer traffic on its own
//! authenticated port, and a follower behind the purged log catching up by snapshot.

mod append_size;
mod batching;
mod far_follower;
mod peer_port;
mod snapshot_catch_up;
