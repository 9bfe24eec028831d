//! Which of a client's configured nodes gets its next call.
//!
//! Every answer from a node names that node (`Fencegate-Node-Id`) and the leader it knows
//! (`Fencegate-Leader-Id`). A follower forwards every call to the leader, so sending calls to
//! the leader only saves that hop: a wrong or stale choice costs a little latency, never
//! correctness. Shared by the Rust client and the load harness, so both route alike.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use reqwest::header::HeaderMap;

use crate::wire::{LEADER_ID_HEADER, NODE_ID_HEADER};

/// The node calls go to, among `n` configured nodes, and the node ids learned so far.
pub struct NodeRoute {
    /// The node ids answers have named, by position (0: none seen yet).
    ids: Vec<AtomicU64>,
    /// Position of the node calls go to now.
    current: AtomicUsize,
}

impl NodeRoute {
    /// Starts at the first node, with no ids known.
    pub fn new(nodes: usize) -> Self {
        NodeRoute {
            ids: (0..nodes.max(1)).map(|_| AtomicU64::new(0)).collect(),
            current: AtomicUsize::new(0),
        }
    }

    /// Position of the node the next call goes to.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.ids.len()
    }

    /// Sends the next calls to node `idx`, whatever was learned before.
    pub fn point_at(&self, idx: usize) {
        self.current.store(idx % self.ids.len(), Ordering::Relaxed);
    }

    /// Node `idx` failed a call with an uncertain outcome: the next calls go to the next node.
    /// Only the first of several concurrent callers that saw it fail moves the route.
    pub fn failed(&self, idx: usize) {
        self.move_from(idx, (idx + 1) % self.ids.len());
    }

    /// Learns from an answer of node `idx` which node id it has and which node leads, and
    /// moves the route to the leader when it is one of ours. While the leader's position is
    /// unknown, the route moves on to a node whose id has not been seen yet, so the leader is
    /// found within one call per node.
    pub fn learn(&self, idx: usize, headers: &HeaderMap) {
        let id_in = |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.parse().ok() };
        let Some(id) = id_in(NODE_ID_HEADER) else {
            return;
        };
        let n = self.ids.len();
        self.ids[idx % n].store(id, Ordering::Relaxed);
        let Some(leader) = id_in(LEADER_ID_HEADER).filter(|&l| l != id) else {
            return;
        };
        let known = self
            .ids
            .iter()
            .position(|x| x.load(Ordering::Relaxed) == leader);
        let unseen = || {
            (1..n)
                .map(|k| (idx + k) % n)
                .find(|&j| self.ids[j].load(Ordering::Relaxed) == 0)
        };
        if let Some(next) = known.or_else(unseen) {
            self.move_from(idx % n, next);
        }
    }

    /// Moves the route from `from` to `to`, unless another caller already moved it.
    fn move_from(&self, from: usize, to: usize) {
        let _ = self
            .current
            .compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(node: u64, leader: Option<u64>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(NODE_ID_HEADER, node.into());
        if let Some(l) = leader {
            h.insert(LEADER_ID_HEADER, l.into());
        }
        h
    }

    #[test]
    fn finds_the_leader_within_one_call_per_node() {
        let route = NodeRoute::new(3);
        // Node at 0 is id 7 and names leader 9, which no answer has named yet: try node 1.
        route.learn(0, &answer(7, Some(9)));
        assert_eq!(route.current(), 1);
        // Node at 1 is id 8, also a follower: node 2 is the only unseen one.
        route.learn(1, &answer(8, Some(9)));
        assert_eq!(route.current(), 2);
        // Node at 2 is the leader: stay.
        route.learn(2, &answer(9, Some(9)));
        assert_eq!(route.current(), 2);
        // A new leader the route has seen: straight to it.
        route.learn(2, &answer(9, Some(7)));
        assert_eq!(route.current(), 0);
    }

    #[test]
    fn a_stale_answer_does_not_move_a_route_that_moved_on() {
        let route = NodeRoute::new(3);
        route.learn(1, &answer(8, None));
        route.learn(2, &answer(9, None));
        route.failed(0);
        assert_eq!(route.current(), 1);
        // An answer from node 0, sent before the failure, names leader 9: ignored, because the
        // route no longer points at node 0.
        route.learn(0, &answer(7, Some(9)));
        assert_eq!(route.current(), 1);
        // Without ids in the answer nothing is learned.
        route.learn(1, &HeaderMap::new());
        assert_eq!(route.current(), 1);
        route.point_at(5);
        assert_eq!(route.current(), 2);
    }
}
