//! File descriptors for client connections, and for everything else.
//!
//! Every connection a listener accepts holds a file descriptor, and so does each of the
//! store's files, snapshot, audit file and outgoing connection. When clients hold them all, the
//! next file the store opens fails (`Too many open files`) and raft stops for good: a flood of
//! idle connections would stop the node. So the process first raises its soft open-file limit
//! to the hard one, and if its listeners' connection caps could still take more descriptors
//! than the limit leaves after a reserve, the caps are lowered to fit.

use fencegate_proxy::conn_limits::ProxyLimits;
use lock_core::node::NodeConfig;
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The connection caps of one node's listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub api: usize,
    pub peer: usize,
    /// The fencing proxy's, if the node runs one.
    pub proxy: Option<usize>,
}

impl Caps {
    /// The caps a node's config and its proxy's limits set.
    pub fn of(config: &NodeConfig, proxy: Option<&ProxyLimits>) -> Caps {
        Caps {
            api: config.limits.max_connections,
            peer: config.peer_limits.max_connections,
            proxy: proxy.map(|p| p.max_connections),
        }
    }

    /// Sets these caps in a node's config and its proxy's limits.
    pub fn apply(&self, config: &mut NodeConfig, proxy: Option<&mut ProxyLimits>) {
        config.limits.max_connections = self.api;
        config.peer_limits.max_connections = self.peer;
        if let (Some(p), Some(cap)) = (proxy, self.proxy) {
            p.max_connections = cap;
        }
    }

    /// Descriptors the caps allow: a proxied connection may hold one to its upstream too.
    fn descriptors(&self) -> u64 {
        self.api as u64 + self.peer as u64 + 2 * self.proxy.unwrap_or(0) as u64
    }
}

/// Descriptors kept from client connections for the store, snapshots, audit files, outgoing
/// connections and the runtime: a quarter of the limit, at least 64 and at most 4096.
fn reserve(limit: u64) -> u64 {
    (limit / 4).clamp(64, 4096)
}

/// `caps` of each of `nodes` nodes in one process, lowered in proportion so that together they
/// leave [`reserve`] descriptors of `limit`; `None` if they fit already.
fn fitted(caps: Caps, nodes: u64, limit: u64) -> Option<Caps> {
    let budget = limit.saturating_sub(reserve(limit)).max(1);
    let wanted = caps.descriptors() * nodes;
    let scale = |cap: usize| ((cap as u64 * budget / wanted).max(1)) as usize;
    (wanted > budget).then(|| Caps {
        api: scale(caps.api),
        peer: scale(caps.peer),
        proxy: caps.proxy.map(scale),
    })
}

/// Raises the soft open-file limit to the hard one (as much as the process may have without
/// privileges) and returns the limit now in force.
fn raise_open_file_limit() -> u64 {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return u64::MAX;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// Fits the caps of the `nodes` nodes this process runs (each with `caps`) to the open-file
/// limit, raised first; logs a warning when it had to lower them. Returns each node's caps.
pub fn fit(caps: Caps, nodes: u64) -> Caps {
    let limit = raise_open_file_limit();
    let Some(lowered) = fitted(caps, nodes, limit) else {
        return caps;
    };
    let Caps { api, peer, proxy } = lowered;
    tracing::warn!(
        open_file_limit = limit,
        "the open-file limit ({limit}) is too low for the configured connection caps: each \
         node now serves at most {api} API, {peer} peer and {} proxy connections, so that its \
         storage always has file descriptors left. Raise the limit (ulimit -n, or LimitNOFILE \
         in a systemd unit) to serve more",
        proxy.map_or("no".to_string(), |p| p.to_string())
    );
    lowered
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: Caps = Caps {
        api: 4_096,
        peer: 1_024,
        proxy: Some(4_096),
    };

    #[test]
    fn caps_within_the_limit_stay() {
        assert_eq!(fitted(DEFAULT, 1, 1 << 20), None);
        assert_eq!(fitted(DEFAULT, 3, 65_536), None);
    }

    /// Three nodes' default caps under a limit of 1024: lowered in proportion, and together
    /// they leave the reserve.
    #[test]
    fn caps_past_the_limit_are_lowered_to_leave_the_reserve() {
        for (nodes, limit) in [(1, 1_024), (3, 1_024), (3, 20_000), (1, 64)] {
            let c = fitted(DEFAULT, nodes, limit).expect("lowered");
            let used = c.descriptors() * nodes;
            assert!(
                used <= limit.saturating_sub(reserve(limit)).max(4 * nodes),
                "{nodes} nodes at {limit}: {c:?} use {used}"
            );
            assert!(c.api >= 1 && c.peer >= 1 && c.proxy >= Some(1), "{c:?}");
            assert!(c.api >= c.peer, "proportions kept: {c:?}");
        }
    }
}
