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

/// On a backup (`POST /v1/admin/backup`): the raft term and log index of the last entry it
/// covers.
pub const BACKUP_TERM_HEADER: &str = "Fencegate-Backup-Term";
pub const BACKUP_INDEX_HEADER: &str = "Fencegate-Backup-Index";

/// The token of an `Authorization: Bearer <token>` value. The scheme is matched without regard
/// to case, as HTTP's authentication schemes are (`bearer`, `BEARER`).
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        for value in ["Bearer k1", "bearer k1", "BEARER  k1 "] {
            assert_eq!(bearer_token(value), Some("k1"), "{value:?}");
        }
        for value in ["Basic k1", "Bearer", "Bearer ", "Bearerk1", "k1"] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }
}
