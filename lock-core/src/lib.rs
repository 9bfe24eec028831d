pub mod api;
pub mod client;
pub mod machine;
pub mod net;
pub mod node;
pub mod raft;
pub mod store;
