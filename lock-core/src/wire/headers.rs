//! Header names of the fencing proxy's contract and of the lock API's answers.

/// The fencing token a protected write carries (a decimal `u64`).
pub const FENCE_TOKEN_HEADER: &str = "Fence-Token";
/// Optional: the resource the writer believes it holds; must equal the one the proxy derives
/// from the path.
pub const FENCE_RESOURCE_HEADER: &str = "Fence-Resource";

/// On every answer of a node's public API: the answering node's id.
pub const NODE_ID_HEADER: &str = "Fencegate-Node-Id";
/// On every answer of a node's public API while the node knows a leader: the leader's id. A
/// client that knows which of its nodes has that id can send its next calls there and save
/// the follower's forwarding hop; any node still serves any call.
pub const LEADER_ID_HEADER: &str = "Fencegate-Leader-Id";
