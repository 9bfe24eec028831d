pub mod machine;
pub mod raft;
