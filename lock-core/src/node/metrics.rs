//! Prometheus metrics of a node.

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets from 0.25 ms to 10 s: commits on a local disk are sub-millisecond to a few
/// ms, failovers take seconds.
const BUCKETS: &[f64] = &[
    0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024,
    2.048, 4.096, 10.0,
];

/// [`BUCKETS`] and on up to 300 s, for the lock API's calls: a waiting acquire lasts up to its
/// `wait_timeout_ms` (at most 5 minutes), and such waits must not all land in `+Inf`.
fn op_buckets() -> Vec<f64> {
    BUCKETS
        .iter()
        .copied()
        .chain([30.0, 60.0, 120.0, 300.0])
        .collect()
}

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Request latency by operation (acquire, renew, release, cancel, get, list).
    pub op_seconds: HistogramVec,
    /// Request outcomes by operation and outcome: `success`, the error code of a refusal
    /// (`lock_held`, `lease_lost`, `no_quorum`, ...), `wait_timeout` for a wait that ended
    /// without the lock, `abandoned` for a call whose caller hung up before the answer.
    pub op_outcomes: IntCounterVec,
    pub commit_seconds: Histogram,
    /// Commands per raft write on the leader (see `node::batcher`).
    pub batch_commands: Histogram,
    /// Commands waiting for the leader's next raft write (see `node::batcher`).
    pub write_queue: IntGauge,
    /// Commands the leader refused because as many as it holds were waiting already.
    pub writes_refused: IntCounter,
    /// Commands per message a follower forwards to the leader (see `node::forward`).
    pub forward_commands: Histogram,
    /// Reads served by one read index (see `node::read_rounds`).
    pub read_index_reads: Histogram,
    /// Forwarded messages that got no usable answer, by why (`unreachable`, `status`,
    /// `codec`, `dropped`, `count`): their commands are retried, and may have been applied.
    pub forward_failures: IntCounterVec,
    pub apply_seconds: Histogram,
    /// How long one sync of the raft log to disk takes (one sync covers every append queued
    /// while the previous one ran). A slow disk shows here first.
    pub log_sync_seconds: Histogram,
    pub expirations: IntCounter,
    pub handoffs: IntCounter,
    pub waiter_timeouts: IntCounter,
    pub renew_failures: IntCounter,
    pub leader_changes: IntCounter,
    pub pre_votes: IntCounterVec,
    pub election_seconds: Histogram,
    pub active_locks: IntGauge,
    pub waiters: IntGauge,
    pub resources: IntGauge,
    pub last_token: IntGauge,
    pub term: IntGauge,
    pub is_leader: IntGauge,
    /// 1 while this node, started with an empty data directory, votes in no election.
    pub vote_held: IntGauge,
    pub last_applied: IntGauge,
    /// What `/readyz` would answer at the scrape: 1 ready, 0 not.
    pub ready: IntGauge,
    /// Idempotency records this node forgot after their tombstone window (their keys are new
    /// again).
    pub idem_forgotten: IntCounter,
    /// Operators' resolutions of idempotency records of unknown outcome, by resolution.
    pub idem_resolutions: IntCounterVec,
    /// Calls refused for authentication, by reason (missing, invalid, role).
    pub auth_denied: IntCounterVec,
    /// Lock calls refused by a tenant's bound, by bound (leases, waiters, rate).
    pub tenant_limited: IntCounterVec,
    /// Connections open on the node's listeners, by listener (`api`, `peer`).
    pub connections_open: IntGaugeVec,
    /// The hottest resources by acquire rate, as this node saw them (at most
    /// [`HOT_IN_METRICS`], set at each scrape).
    pub hot_acquire_rate: GaugeVec,
    /// The resources with the most fencing rejections at this node's proxy, likewise.
    pub hot_fence_rejections: GaugeVec,
    /// Each other member's wall clock minus this node's, in seconds, by member id.
    pub peer_clock_offset: GaugeVec,
    /// How fast each other member's monotonic clock runs against this node's, by member id.
    pub peer_clock_rate: GaugeVec,
    /// 1, labelled with the build's version and commit.
    pub build_info: IntGaugeVec,
}

/// How many resources the hot-resource series name: few, as each is a series of its own.
pub const HOT_IN_METRICS: usize = 10;
/// A resource is named in `hot_resource_acquires_per_second` only from this rate up.
pub const HOT_ACQUIRES_PER_S: f64 = 1.0;
/// A resource is named in `hot_resource_fence_rejections` only from this many rejections up.
pub const HOT_FENCE_REJECTIONS: f64 = 1.0;

impl Metrics {
    pub fn new(node_id: u64) -> Self {
        let registry = Registry::new_custom(
            Some("fencegate".into()),
            Some([("node".to_string(), node_id.to_string())].into()),
        )
        .unwrap_or_default();
        let hist = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()))
                .unwrap_or_else(|e| panic!("metric {name}: {e}"))
        };
        let counter = |name: &str, help: &str| {
            IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"))
        };
        let gauge = |name: &str, help: &str| {
            IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"))
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
                .unwrap_or_else(|e| panic!("metric {name}: {e}"))
        };
        // Commands per message, in powers of two.
        let commands = |name: &str, help: &str| {
            let buckets = (0..10).map(|i| f64::from(1u32 << i)).collect();
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .unwrap_or_else(|e| panic!("metric {name}: {e}"))
        };
        let m = Metrics {
            op_seconds: HistogramVec::new(
                HistogramOpts::new("op_seconds", "Lock API request latency by operation")
                    .buckets(op_buckets()),
                &["op"],
            )
            .unwrap_or_else(|e| panic!("metric op_seconds: {e}")),
            op_outcomes: counter_vec(
                "op_outcomes_total",
                "Lock API outcomes by operation",
                &["op", "outcome"],
            ),
            commit_seconds: hist(
                "raft_commit_seconds",
                "Time from proposing a command to its apply",
            ),
            batch_commands: commands("raft_batch_commands", "Commands carried by one raft write"),
            write_queue: gauge(
                "raft_write_queue",
                "Commands waiting for the leader's next raft write",
            ),
            writes_refused: counter(
                "raft_writes_refused_total",
                "Commands refused with 503 overloaded: the leader's write queue was full",
            ),
            forward_commands: commands(
                "raft_forward_commands",
                "Commands carried by one message a follower forwards to the leader",
            ),
            read_index_reads: commands(
                "raft_read_index_reads",
                "Linearizable reads served by one read index (one leadership confirmation)",
            ),
            forward_failures: counter_vec(
                "raft_forward_failures_total",
                "Messages a follower forwarded to the leader that got no usable answer",
                &["reason"],
            ),
            apply_seconds: hist("raft_apply_seconds", "Time to apply one batch of entries"),
            log_sync_seconds: hist(
                "raft_log_sync_seconds",
                "Time to sync the raft log to disk (one sync covers every append queued meanwhile)",
            ),
            expirations: counter("lease_expirations_total", "Leases that expired unrenewed"),
            handoffs: counter("lease_handoffs_total", "Locks handed to a queued waiter"),
            waiter_timeouts: counter("waiter_timeouts_total", "Waiters that timed out"),
            renew_failures: counter("renew_failures_total", "Renewals answered lease_lost"),
            leader_changes: counter("leader_changes_total", "Leader changes seen by this node"),
            pre_votes: counter_vec(
                "raft_pre_votes_total",
                "Pre-vote rounds this node ran before an election, by outcome (won: it campaigned)",
                &["outcome"],
            ),
            election_seconds: hist("election_seconds", "Time without a known leader"),
            active_locks: gauge("active_locks", "Leases recorded in the state machine"),
            waiters: gauge("waiters", "Acquires waiting in queues"),
            resources: gauge(
                "resources",
                "Resource records (held, waited on or recently idle)",
            ),
            last_token: gauge("last_fencing_token", "Highest fencing token issued"),
            term: gauge("raft_term", "Current raft term"),
            is_leader: gauge(
                "raft_is_leader",
                "1 if this node is the leader and a quorum acknowledged it within twice the \
                 longest election timeout",
            ),
            vote_held: gauge(
                "raft_vote_held",
                "1 while this node, started with an empty data directory, votes in no \
                 election until it has caught up with a leader",
            ),
            last_applied: gauge("raft_last_applied", "Index of the last applied log entry"),
            ready: gauge(
                "ready",
                "1 if /readyz answers 200 (in touch with a leader and keeping up with it), else 0",
            ),
            idem_forgotten: counter(
                "idempotency_records_forgotten_total",
                "Idempotency records forgotten after their tombstone window",
            ),
            idem_resolutions: counter_vec(
                "idempotency_operator_resolutions_total",
                "Idempotency records of unknown outcome resolved by an operator",
                &["resolution"],
            ),
            auth_denied: counter_vec(
                "auth_denied_total",
                "Calls refused by authentication, by reason",
                &["reason"],
            ),
            tenant_limited: counter_vec(
                "tenant_limited_total",
                "Lock calls refused by a tenant bound",
                &["limit"],
            ),
            connections_open: IntGaugeVec::new(
                Opts::new(
                    "connections_open",
                    "Connections open on the node's listeners, by listener (api, peer)",
                ),
                &["listener"],
            )
            .unwrap_or_else(|e| panic!("metric connections_open: {e}")),
            hot_acquire_rate: GaugeVec::new(
                Opts::new(
                    "hot_resource_acquires_per_second",
                    "The 10 resources with the most acquires through this node, per second over \
                     the last 30 to 60 s, from 1 per second up",
                ),
                &["resource"],
            )
            .unwrap_or_else(|e| panic!("metric hot_resource_acquires_per_second: {e}")),
            hot_fence_rejections: GaugeVec::new(
                Opts::new(
                    "hot_resource_fence_rejections",
                    "The 10 resources with the most fencing rejections at this node's proxy over \
                     the last 30 to 60 s",
                ),
                &["resource"],
            )
            .unwrap_or_else(|e| panic!("metric hot_resource_fence_rejections: {e}")),
            peer_clock_offset: GaugeVec::new(
                Opts::new(
                    "peer_clock_offset_seconds",
                    "Another member's wall clock minus this node's, from the health probes; \
                     peer connections are refused past 60 s",
                ),
                &["peer"],
            )
            .unwrap_or_else(|e| panic!("metric peer_clock_offset_seconds: {e}")),
            peer_clock_rate: GaugeVec::new(
                Opts::new(
                    "peer_clock_rate",
                    "How fast another member's monotonic clock runs against this node's over the \
                     last one to two minutes (1: the same); clients allow for rates within 1 %",
                ),
                &["peer"],
            )
            .unwrap_or_else(|e| panic!("metric peer_clock_rate: {e}")),
            build_info: IntGaugeVec::new(
                Opts::new(
                    "build_info",
                    "1, labelled with the version and commit this node runs",
                ),
                &["version", "commit"],
            )
            .unwrap_or_else(|e| panic!("metric build_info: {e}")),
            registry,
        };
        let r = &m.registry;
        let register = |c: Box<dyn prometheus::core::Collector>| {
            r.register(c)
                .unwrap_or_else(|e| panic!("register metric: {e}"))
        };
        register(Box::new(m.op_seconds.clone()));
        register(Box::new(m.op_outcomes.clone()));
        register(Box::new(m.commit_seconds.clone()));
        register(Box::new(m.batch_commands.clone()));
        register(Box::new(m.write_queue.clone()));
        register(Box::new(m.writes_refused.clone()));
        register(Box::new(m.forward_commands.clone()));
        register(Box::new(m.read_index_reads.clone()));
        register(Box::new(m.forward_failures.clone()));
        register(Box::new(m.apply_seconds.clone()));
        register(Box::new(m.log_sync_seconds.clone()));
        register(Box::new(m.expirations.clone()));
        register(Box::new(m.handoffs.clone()));
        register(Box::new(m.waiter_timeouts.clone()));
        register(Box::new(m.renew_failures.clone()));
        register(Box::new(m.leader_changes.clone()));
        register(Box::new(m.pre_votes.clone()));
        register(Box::new(m.election_seconds.clone()));
        register(Box::new(m.active_locks.clone()));
        register(Box::new(m.waiters.clone()));
        register(Box::new(m.resources.clone()));
        register(Box::new(m.last_token.clone()));
        register(Box::new(m.term.clone()));
        register(Box::new(m.is_leader.clone()));
        register(Box::new(m.vote_held.clone()));
        register(Box::new(m.last_applied.clone()));
        register(Box::new(m.ready.clone()));
        register(Box::new(m.idem_forgotten.clone()));
        register(Box::new(m.idem_resolutions.clone()));
        register(Box::new(m.auth_denied.clone()));
        register(Box::new(m.tenant_limited.clone()));
        register(Box::new(m.connections_open.clone()));
        register(Box::new(m.hot_acquire_rate.clone()));
        register(Box::new(m.hot_fence_rejections.clone()));
        register(Box::new(m.peer_clock_offset.clone()));
        register(Box::new(m.peer_clock_rate.clone()));
        register(Box::new(m.build_info.clone()));
        let build = crate::build_info::build();
        m.build_info
            .with_label_values(&[&build.version, &build.commit])
            .set(1);
        m.start_at_zero();
        m
    }

    /// Creates every fixed label combination at 0. A series that first appears with its
    /// first count reads to Prometheus' `rate()` and `increase()` as no change, and an alert on
    /// a series that does not exist yet sees nothing rather than 0: so the first stale token,
    /// the first lost lease, the first refused key would go unnoticed on each node and after
    /// each restart.
    fn start_at_zero(&self) {
        let outcomes: &[(&str, &[&str])] = &[
            (
                "acquire",
                &[
                    "lock_held",
                    "wait_timeout",
                    "wait_cancelled",
                    "too_many_waiters",
                ],
            ),
            ("renew", &["lease_lost"]),
            ("release", &[]),
            ("cancel", &[]),
            ("get", &[]),
            ("list", &[]),
        ];
        for (op, own) in outcomes {
            self.op_seconds.with_label_values(&[op]);
            for outcome in [
                "success",
                "no_quorum",
                "abandoned",
                "invalid_request",
                "overloaded",
            ]
            .iter()
            .chain(own.iter())
            {
                self.op_outcomes.with_label_values(&[op, outcome]);
            }
        }
        let fixed: [(&IntCounterVec, &[&str]); 5] = [
            (
                &self.forward_failures,
                &["unreachable", "status", "codec", "dropped", "count"],
            ),
            (&self.pre_votes, &["won", "lost"]),
            (&self.idem_resolutions, &["succeeded", "never_ran"]),
            (&self.auth_denied, &["missing", "invalid", "role", "tenant"]),
            (&self.tenant_limited, &["leases", "waiters", "rate"]),
        ];
        for (counter, values) in fixed {
            for value in values {
                counter.with_label_values(&[value]);
            }
        }
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
