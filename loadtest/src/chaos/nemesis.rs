//! The nemesis: one fault at a time, the enabled kinds in shuffled rounds, each held for a
//! while, healed, then a quiet gap — so the history alternates faulty and healthy periods and
//! every fault is healed before the next begins.
//!
//! | kind | what it does | heal |
//! |---|---|---|
//! | `kill-leader` | SIGKILL the leader's process (its proxy dies with it) | restart, same data dir |
//! | `kill-random` | SIGKILL a random node | restart |
//! | `pause` | SIGSTOP a node (the leader half the time) for up to 3 s, at least 0.4 s past the longest election timeout | SIGCONT |
//! | `partition-minority` | cut one random node off from both others (fault layer, both sides) | clear rules |
//! | `partition-leader` | cut the leader off | clear rules |
//! | `bridge` | cut only the link leader ↔ one follower; the third node still sees both | clear rules |
//! | `drop-responses` | lock calls and orders lose their answer (after the effect) or hang up mid-request | stop dropping |
//! | `clock-offset` | shift a *follower's* wall clock by ±0.5–3 s (it may become leader later) | reset; if it leads by then with a slow clock, restart it instead |
//!
//! Clock offsets are applied to followers only: a step of the *leader's* clock while it leads
//! is a clock-rate fault, outside the model the fencing proxy documents (docs/fencing.md,
//! "Time assumptions"). Offsets between leaders are in the model: the failover rule cancels
//! them. Resetting a leader's slow clock would be such a step forward, so that node is
//! restarted instead (a node's clock fixed while it was down).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Mutex;

use super::client::DropSwitch;
use lock_core::timing::ELECTION_TIMEOUT_MAX_MS;

use super::history::History;
use crate::cluster::LocalCluster;

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    KillLeader,
    KillRandom,
    Pause,
    PartitionMinority,
    PartitionLeader,
    Bridge,
    DropResponses,
    ClockOffset,
}

impl Fault {
    pub const ALL: [Fault; 8] = [
        Fault::KillLeader,
        Fault::KillRandom,
        Fault::Pause,
        Fault::PartitionMinority,
        Fault::PartitionLeader,
        Fault::Bridge,
        Fault::DropResponses,
        Fault::ClockOffset,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "kill-leader",
            Fault::KillRandom => "kill-random",
            Fault::Pause => "pause",
            Fault::PartitionMinority => "partition-minority",
            Fault::PartitionLeader => "partition-leader",
            Fault::Bridge => "bridge",
            Fault::DropResponses => "drop-responses",
            Fault::ClockOffset => "clock-offset",
        }
    }

    /// How long the fault is held, ms.
    fn hold_ms(self, rng: &mut StdRng) -> u64 {
        match self {
            Fault::KillLeader | Fault::KillRandom => rng.random_range(1_000..=3_000),
            // Longer than the election timeout, so the others elect a new leader.
            Fault::Pause => rng.random_range(ELECTION_TIMEOUT_MAX_MS + 400..=3_000),
            Fault::PartitionMinority | Fault::PartitionLeader | Fault::Bridge => {
                rng.random_range(2_000..=5_000)
            }
            Fault::DropResponses => rng.random_range(3_000..=6_000),
            Fault::ClockOffset => rng.random_range(4_000..=8_000),
        }
    }
}

/// What is currently broken, so it can be healed exactly.
enum Active {
    Killed(u64),
    Paused(u64),
    Partitioned,
    Dropping,
    Clock(u64),
}

pub struct Nemesis {
    pub cluster: Arc<Mutex<LocalCluster>>,
    pub hist: Arc<History>,
    pub drops: Arc<DropSwitch>,
    pub kinds: Vec<Fault>,
    pub stop: Arc<AtomicBool>,
    pub seed: u64,
    /// Current clock offsets by node (kept when partitions rewrite a node's rules).
    offsets: BTreeMap<u64, i64>,
    pub crashes: Vec<String>,
}

impl Nemesis {
    pub fn new(
        cluster: Arc<Mutex<LocalCluster>>,
        hist: Arc<History>,
        drops: Arc<DropSwitch>,
        kinds: Vec<Fault>,
        stop: Arc<AtomicBool>,
        seed: u64,
    ) -> Self {
        Nemesis {
            cluster,
            hist,
            drops,
            kinds,
            stop,
            seed,
            offsets: BTreeMap::new(),
            crashes: Vec::new(),
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Sleeps up to `ms`, returning early when asked to stop.
    async fn hold(&self, ms: u64) {
        let until = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < until && !self.stopping() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn note(&self, f: &str, node: Option<u64>, value: serde_json::Value) {
        self.hist.note("nemesis", f, node, value);
    }

    /// Runs faults until stopped, then heals everything.
    pub async fn run(mut self) -> Self {
        let mut rng = StdRng::seed_from_u64(self.seed);
        self.hold(rng.random_range(1_500..=3_000)).await;
        // Shuffled rounds: every enabled kind once per round, in a random order, so even a
        // short run sees each kind.
        let mut round: Vec<Fault> = Vec::new();
        while !self.stopping() {
            self.restart_crashed().await;
            if round.is_empty() {
                round = self.kinds.clone();
                round.shuffle(&mut rng);
            }
            let Some(kind) = round.pop() else {
                break;
            };
            match self.start(kind, &mut rng).await {
                Ok(Some(active)) => {
                    self.hold(kind.hold_ms(&mut rng)).await;
                    if let Err(e) = self.heal(active).await {
                        self.note("heal-error", None, json!({ "error": e.to_string() }));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    // A half-applied fault (one side of a partition) must not linger.
                    self.note(
                        "start-error",
                        None,
                        json!({ "kind": kind.name(), "error": e.to_string() }),
                    );
                    self.heal_all().await;
                }
            }
            self.hold(rng.random_range(500..=2_000)).await;
        }
        self.heal_all().await;
        self
    }

    async fn restart_crashed(&mut self) {
        let mut c = self.cluster.lock().await;
        for msg in c.crashed() {
            self.note("crash", None, json!({ "message": msg }));
            self.crashes.push(msg);
        }
        for id in c.ids() {
            if !c.is_up(id) {
                let _ = c.resume(id);
                if let Err(e) = c.restart(id) {
                    self.note("restart-error", Some(id), json!({ "error": e.to_string() }));
                }
            }
        }
    }

    async fn start(&mut self, kind: Fault, rng: &mut StdRng) -> anyhow::Result<Option<Active>> {
        let mut c = self.cluster.lock().await;
        let ids = c.ids();
        let leader = c.leader().await;
        let random = *ids.choose(rng).unwrap_or(&1);
        let name = kind.name();
        let active = match kind {
            Fault::KillLeader | Fault::KillRandom => {
                let target = match kind {
                    Fault::KillLeader => leader.unwrap_or(random),
                    _ => random,
                };
                c.kill(target)?;
                self.offsets.remove(&target);
                self.note(
                    "start",
                    Some(target),
                    json!({ "kind": name, "leader": leader }),
                );
                Active::Killed(target)
            }
            Fault::Pause => {
                let target = if rng.random_bool(0.5) {
                    leader.unwrap_or(random)
                } else {
                    random
                };
                c.pause(target)?;
                self.note(
                    "start",
                    Some(target),
                    json!({ "kind": name, "leader": leader }),
                );
                Active::Paused(target)
            }
            Fault::PartitionMinority | Fault::PartitionLeader => {
                let target = match kind {
                    Fault::PartitionLeader => leader.unwrap_or(random),
                    _ => random,
                };
                let others: Vec<u64> = ids.iter().copied().filter(|i| *i != target).collect();
                self.note(
                    "start",
                    Some(target),
                    json!({ "kind": name, "leader": leader, "isolated": target, "majority": others }),
                );
                for &id in &ids {
                    let blocked: Vec<u64> = if id == target {
                        others.clone()
                    } else {
                        vec![target]
                    };
                    c.set_faults(id, &blocked, self.offset(id)).await?;
                }
                Active::Partitioned
            }
            Fault::Bridge => {
                let a = leader.unwrap_or(random);
                let followers: Vec<u64> = ids.iter().copied().filter(|i| *i != a).collect();
                let Some(&b) = followers.choose(rng) else {
                    return Ok(None);
                };
                let bridge: Vec<u64> = followers.iter().copied().filter(|i| *i != b).collect();
                self.note(
                    "start",
                    None,
                    json!({ "kind": name, "leader": leader, "cut": [a, b], "bridge": bridge }),
                );
                c.set_faults(a, &[b], self.offset(a)).await?;
                c.set_faults(b, &[a], self.offset(b)).await?;
                Active::Partitioned
            }
            Fault::DropResponses => {
                self.drops.set(true);
                self.note("start", None, json!({ "kind": name }));
                Active::Dropping
            }
            Fault::ClockOffset => {
                let followers: Vec<u64> = ids
                    .iter()
                    .copied()
                    .filter(|i| Some(*i) != leader && c.is_up(*i))
                    .collect();
                let (Some(_), Some(&target)) = (leader, followers.choose(rng)) else {
                    return Ok(None);
                };
                let magnitude: i64 = rng.random_range(500..=3_000);
                let offset = if rng.random_bool(0.5) {
                    magnitude
                } else {
                    -magnitude
                };
                // Only while it follows (see the module docs): re-check just before setting.
                if c.leader().await == Some(target) {
                    return Ok(None);
                }
                c.set_faults(target, &[], offset).await?;
                self.offsets.insert(target, offset);
                self.note(
                    "start",
                    Some(target),
                    json!({ "kind": name, "leader": leader, "offset_ms": offset }),
                );
                Active::Clock(target)
            }
        };
        Ok(Some(active))
    }

    fn offset(&self, id: u64) -> i64 {
        self.offsets.get(&id).copied().unwrap_or(0)
    }

    async fn heal(&mut self, active: Active) -> anyhow::Result<()> {
        let mut c = self.cluster.lock().await;
        match active {
            Active::Killed(id) => {
                c.restart(id)?;
                self.note("stop", Some(id), json!({ "healed": "restarted" }));
            }
            Active::Paused(id) => {
                c.resume(id)?;
                self.note("stop", Some(id), json!({ "healed": "resumed" }));
            }
            Active::Partitioned => {
                for id in c.ids() {
                    if c.is_up(id) {
                        set_faults_retrying(&c, id, self.offset(id)).await?;
                    }
                }
                self.note("stop", None, json!({ "healed": "partition" }));
            }
            Active::Dropping => {
                self.drops.set(false);
                self.note("stop", None, json!({ "healed": "responses" }));
            }
            Active::Clock(id) => {
                drop(c);
                self.reset_clock(id).await?;
            }
        }
        Ok(())
    }

    /// Puts a node's clock back without stepping a leader's clock forward.
    async fn reset_clock(&mut self, id: u64) -> anyhow::Result<()> {
        let offset = self.offset(id);
        let mut c = self.cluster.lock().await;
        if offset < 0 && c.leader().await == Some(id) {
            // Its clock is behind and it leads: setting it right would jump log time forward
            // under live grants. Restart it instead; the next leader's failover shift absorbs
            // the difference.
            c.kill(id)?;
            c.restart(id)?;
            self.note(
                "stop",
                Some(id),
                json!({ "healed": "clock-restart", "offset_ms": 0 }),
            );
        } else {
            c.set_faults(id, &[], 0).await?;
            self.note(
                "stop",
                Some(id),
                json!({ "healed": "clock", "offset_ms": 0 }),
            );
        }
        self.offsets.remove(&id);
        Ok(())
    }

    /// Resumes paused nodes, restarts dead ones, clears every rule and clock offset.
    pub async fn heal_all(&mut self) {
        self.drops.set(false);
        {
            let mut c = self.cluster.lock().await;
            for msg in c.crashed() {
                self.note("crash", None, json!({ "message": msg }));
                self.crashes.push(msg);
            }
            for id in c.ids() {
                let _ = c.resume(id);
                let _ = c.restart(id);
            }
        }
        let skewed: Vec<u64> = self.offsets.keys().copied().collect();
        for id in skewed {
            if let Err(e) = self.reset_clock(id).await {
                self.note("heal-error", Some(id), json!({ "error": e.to_string() }));
            }
        }
        let c = self.cluster.lock().await;
        for id in c.ids() {
            if let Err(e) = set_faults_retrying(&c, id, 0).await {
                self.note("heal-error", Some(id), json!({ "error": e.to_string() }));
            }
        }
        self.offsets.clear();
        self.note("stop", None, json!({ "healed": "all" }));
    }
}

/// Clears node `id`'s partition rules (keeping `offset`), retrying for up to 5 s: a node
/// restarted a moment ago may not listen yet.
async fn set_faults_retrying(c: &LocalCluster, id: u64, offset: i64) -> anyhow::Result<()> {
    let mut last = None;
    for _ in 0..50 {
        match c.set_faults(id, &[], offset).await {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("set faults on node {id}")))
}
