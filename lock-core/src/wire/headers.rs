//! Header names of the fencing proxy's contract.

/// The fencing token a protected write carries (a decimal `u64`).
pub const FENCE_TOKEN_HEADER: &str = "Fence-Token";
/// Optional: the resource the writer believes it holds; must equal the one the proxy derives
/// from the path.
pub const FENCE_RESOURCE_HEADER: &str = "Fence-Resource";
