//! Member health as this node sees it: every `PROBE_EVERY` it asks each other member's
//! `/readyz` (on its public API address) with a short timeout. A member that does not answer
//! shows as down after one failed probe, so a stopped node shows as down within about a
//! second.
//!
//! The probes go straight to the members' public API, not through the peer fault layer: they
//! answer "can this node reach that one's API", which is what an operator looking at the page
//! served by this node wants to know.
//!
//! A ready member's answer carries its wall clock and its monotonic clock, so the probes also
//! watch the clocks: the wall-clock offset (peer connections are refused past
//! [`MAX_SKEW_MS`]), and how fast the member's monotonic clock runs against this node's over
//! the last minute or two (lease lengths are measured on the leader's monotonic clock and
//! clients assume it runs at the rate of theirs, within 1 %). Either one out of bounds is
//! logged as a warning at most once a minute per member.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::net::auth::{ms_apart, MAX_SKEW_MS};
use crate::node::{monotonic_ms, Node};
use crate::wire::{ErrorBody, ErrorCode, ReadyStatus};

const PROBE_EVERY: Duration = Duration::from_millis(500);
const PROBE_TIMEOUT: Duration = Duration::from_millis(400);

/// A wall-clock offset past this is warned about; NTP keeps hosts within milliseconds.
const OFFSET_WARN_MS: u64 = 5_000;
/// A clock rate this far from this node's (as a fraction) is warned about: half the 1 % that
/// clients' safety margins allow for.
const RATE_WARN: f64 = 0.005;
/// How often a member is warned about at most.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The last probe of one member.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Probe {
    pub up: bool,
    /// The member knows a leader (its `/readyz` answered 200).
    pub ready: bool,
    pub leader_id: Option<u64>,
    pub last_seen_ms: Option<u64>,
    pub error: Option<String>,
    /// The member's wall clock minus this node's, from its latest ready answer.
    pub clock_offset_ms: Option<i64>,
    /// How fast the member's monotonic clock runs against this node's (1.0: the same), once
    /// a minute of precise samples is in.
    pub clock_rate: Option<f64>,
    /// The build the member runs, from its latest ready answer.
    pub version: Option<String>,
}

#[derive(Default)]
pub struct HealthTable {
    probes: Mutex<BTreeMap<u64, Probe>>,
    clocks: Mutex<BTreeMap<u64, ClockWatch>>,
    /// The leader's applied index as its answers said, with when, over the last few seconds.
    leader_applied: Mutex<VecDeque<(Instant, u64)>>,
    /// When this node was last found behind, and how far.
    last_behind: Mutex<Option<(Instant, Behind)>>,
    /// The leader's first answer after none for [`REJOIN_GAP`] (this node was cut off, or just
    /// started): what the leader had applied then, with when. Until this node has applied as
    /// much it is behind; the samples from before the gap say nothing of now.
    rejoined: Mutex<Option<(Instant, u64)>>,
    /// Whether the leader has answered a probe since this node started.
    leader_answered: AtomicBool,
}

/// How long after its start a node that has not yet heard from the leader how far the log is
/// waits for that before it says it is ready anyway (a leader whose answers never come).
const FIRST_ANSWER_WAIT_MS: u64 = 10_000;

/// A leader's answer after this long without one binds at once (see `HealthTable::rejoined`):
/// two probes or more were missed.
const REJOIN_GAP: Duration = Duration::from_millis(1_500);

/// A node is behind when it has not applied what the leader had applied this long ago: its
/// reads wait at least that long.
const BEHIND_AFTER: Duration = Duration::from_secs(1);
/// ... and stays behind this long after it last was: a node that keeps falling behind and
/// catching up is not ready, rather than flapping between the two.
const BEHIND_HOLD: Duration = Duration::from_secs(5);

/// How far behind the leader this node is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Behind {
    /// What the leader had applied `ago`.
    pub leader_applied: u64,
    pub ago: Duration,
}

/// One member's clock as the probes see it.
#[derive(Default)]
struct ClockWatch {
    rate: RateWindow,
    warned: Option<Instant>,
}

/// What one ready answer says of the member's clocks, read against this node's at the
/// middle of the round trip.
#[derive(Clone, Copy, Debug)]
struct ClockSample {
    /// The member's wall clock minus this node's.
    offset_ms: i64,
    /// This node's monotonic clock at the middle of the round trip.
    ours_ms: u64,
    /// The member's monotonic clock in its answer.
    theirs_ms: u64,
    round_trip: Duration,
}

/// Pairs of monotonic readings (this node's, the member's), one per [`RateWindow::EVERY_MS`],
/// over the last [`RateWindow::KEEP`] of them; the rate is the slope from the oldest to the
/// newest. Only answers with a short round trip count: the unknown split of a round trip
/// between the two directions is the reading's error.
#[derive(Default)]
struct RateWindow {
    samples: VecDeque<(u64, u64)>,
}

impl RateWindow {
    const EVERY_MS: u64 = 10_000;
    const KEEP: usize = 13;
    /// No rate is given over less: a 50 ms round trip then errs by 0.04 % at most.
    const MIN_SPAN_MS: u64 = 60_000;
    const MAX_ROUND_TRIP: Duration = Duration::from_millis(50);

    /// Adds a sample (if precise enough and due) and gives the rate over the window.
    fn add(&mut self, sample: &ClockSample) -> Option<f64> {
        let (ours, theirs) = (sample.ours_ms, sample.theirs_ms);
        if let Some(&(last_ours, last_theirs)) = self.samples.back() {
            if theirs < last_theirs || ours < last_ours {
                // The member restarted (its monotonic clock starts again at 0).
                self.samples.clear();
            } else if ours - last_ours < Self::EVERY_MS {
                return self.rate();
            }
        }
        if sample.round_trip <= Self::MAX_ROUND_TRIP {
            self.samples.push_back((ours, theirs));
            while self.samples.len() > Self::KEEP {
                self.samples.pop_front();
            }
        }
        self.rate()
    }

    fn rate(&self) -> Option<f64> {
        let (&(ours0, theirs0), &(ours1, theirs1)) = (self.samples.front()?, self.samples.back()?);
        let span = ours1 - ours0;
        (span >= Self::MIN_SPAN_MS).then(|| (theirs1 - theirs0) as f64 / span as f64)
    }
}

impl HealthTable {
    /// Whether this node, started less than [`FIRST_ANSWER_WAIT_MS`] ago, has not yet heard
    /// from the leader how far the log is: until it has, it cannot tell whether it is behind
    /// (a node that started empty has applied nothing, and its snapshot is still to come).
    pub fn leader_unheard(&self) -> bool {
        !self.leader_answered.load(Ordering::Relaxed) && monotonic_ms() < FIRST_ANSWER_WAIT_MS
    }

    fn heard_leader(&self) {
        self.leader_answered.store(true, Ordering::Relaxed);
    }

    /// Whether a node that has applied `applied` is behind the leader: the leader had applied
    /// more [`BEHIND_AFTER`] ago or earlier (by its answers to this node's probes), or this
    /// node has not yet applied what the leader had at its first answer after a gap. Never on
    /// the leader, which probes no leader.
    pub fn behind_leader(&self, applied: u64) -> Option<Behind> {
        self.behind_at(applied, Instant::now())
    }

    fn behind_at(&self, applied: u64, now: Instant) -> Option<Behind> {
        {
            // Catching up after a gap: behind until it has what the leader had then, with no
            // hold after (it was not found behind in steady state).
            let mut rejoined = self.rejoined.lock().unwrap_or_else(|e| e.into_inner());
            match *rejoined {
                Some((at, target)) if applied < target => {
                    return Some(Behind {
                        leader_applied: target,
                        ago: now.saturating_duration_since(at),
                    })
                }
                Some(_) => *rejoined = None,
                None => {}
            }
        }
        let behind_now = {
            let samples = self
                .leader_applied
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            samples
                .iter()
                .rev()
                .find(|(at, _)| now.saturating_duration_since(*at) >= BEHIND_AFTER)
                .filter(|(_, leader_applied)| *leader_applied > applied)
                .map(|(at, leader_applied)| Behind {
                    leader_applied: *leader_applied,
                    ago: now.saturating_duration_since(*at),
                })
        };
        let mut last = self.last_behind.lock().unwrap_or_else(|e| e.into_inner());
        match behind_now {
            Some(b) => {
                *last = Some((now, b));
                Some(b)
            }
            None => last
                .filter(|(at, _)| now.saturating_duration_since(*at) < BEHIND_HOLD)
                .map(|(_, b)| b),
        }
    }

    /// Takes in the leader's applied index from its answer at `at`; keeps what
    /// [`Self::behind_at`] needs: the newest sample at least [`BEHIND_AFTER`] old and those
    /// after it.
    fn leader_applied_at(&self, at: Instant, applied: u64) {
        let mut samples = self
            .leader_applied
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if samples
            .back()
            .is_none_or(|(last, _)| at.saturating_duration_since(*last) >= REJOIN_GAP)
        {
            samples.clear();
            *self.rejoined.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, applied));
        }
        samples.push_back((at, applied));
        while samples
            .get(1)
            .is_some_and(|(next, _)| at.saturating_duration_since(*next) >= BEHIND_AFTER)
        {
            samples.pop_front();
        }
    }

    pub fn get(&self, id: u64) -> Option<Probe> {
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    fn set(&self, id: u64, update: impl FnOnce(&mut Probe)) {
        let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        update(probes.entry(id).or_default());
    }
}

pub(in crate::node) async fn run(node: Arc<Node>) {
    let mut interval = tokio::time::interval(PROBE_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let members: Vec<u64> = {
            let m = node.raft.metrics();
            let m = m.borrow();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, _)| *id)
                .filter(|id| *id != node.id)
                .collect()
        };
        let probes = members.into_iter().map(|id| {
            let node = node.clone();
            async move {
                let answer = probe(&node, id).await;
                let now = node.wall_ms();
                if let Ok(Answer {
                    leader_id: Some(leader),
                    applied_index,
                    asked,
                    ..
                }) = &answer
                {
                    // The leader's own answer: what this node must have applied soon (a leader
                    // of an earlier version does not tell).
                    if *leader == id {
                        node.ops.health.heard_leader();
                        if let Some(applied) = applied_index {
                            node.ops.health.leader_applied_at(*asked, *applied);
                        }
                    }
                }
                let (offset_ms, rate) = match &answer {
                    Ok(Answer {
                        clock: Some(sample),
                        ..
                    }) => (
                        Some(sample.offset_ms),
                        node.ops.health.watch_clock(&node, id, sample),
                    ),
                    // A member that tells no clock now (down, not ready, or of an earlier
                    // version) shows none: its last reading would be stale, and so would its
                    // series.
                    _ => {
                        node.ops.health.forget_clock(&node, id);
                        (None, None)
                    }
                };
                node.ops.health.set(id, |p| match answer {
                    Ok(a) => {
                        *p = Probe {
                            up: true,
                            ready: a.ready,
                            leader_id: a.leader_id,
                            last_seen_ms: Some(now),
                            error: a.not_ready,
                            clock_offset_ms: offset_ms,
                            clock_rate: rate,
                            // A not-ready answer tells none: the last ready one still holds.
                            version: if a.ready { a.version } else { p.version.take() },
                        }
                    }
                    // Keeps the time of the last answer; what it said no longer holds.
                    Err(e) => {
                        p.up = false;
                        p.ready = false;
                        p.leader_id = None;
                        p.error = Some(e);
                        p.clock_offset_ms = None;
                        p.clock_rate = None;
                    }
                });
            }
        });
        futures_join_all(probes).await;
    }
}

impl HealthTable {
    /// Drops what is known of a member's clocks, and its series.
    fn forget_clock(&self, node: &Node, id: u64) {
        let known = self
            .clocks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
            .is_some();
        if known {
            let peer = id.to_string();
            let _ = node.metrics.peer_clock_offset.remove_label_values(&[&peer]);
            let _ = node.metrics.peer_clock_rate.remove_label_values(&[&peer]);
        }
    }

    /// Takes in a member's clock sample: sets its metrics, warns if the clock is out of
    /// bounds, and gives its rate once known.
    fn watch_clock(&self, node: &Node, id: u64, sample: &ClockSample) -> Option<f64> {
        let mut clocks = self.clocks.lock().unwrap_or_else(|e| e.into_inner());
        let watch = clocks.entry(id).or_default();
        let rate = watch.rate.add(sample);
        let peer = id.to_string();
        node.metrics
            .peer_clock_offset
            .with_label_values(&[&peer])
            .set(sample.offset_ms as f64 / 1_000.0);
        match rate {
            Some(rate) => node
                .metrics
                .peer_clock_rate
                .with_label_values(&[&peer])
                .set(rate),
            // Not measured yet (a member that just started): no series rather than a guess.
            None => {
                let _ = node.metrics.peer_clock_rate.remove_label_values(&[&peer]);
            }
        }
        let offset_bad = sample.offset_ms.unsigned_abs() > OFFSET_WARN_MS;
        let rate_bad = rate.is_some_and(|r| (r - 1.0).abs() > RATE_WARN);
        let due = watch.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY);
        if (offset_bad || rate_bad) && due {
            watch.warned = Some(Instant::now());
            if offset_bad {
                tracing::warn!(
                    node = node.id,
                    peer = id,
                    offset_ms = sample.offset_ms,
                    "node {id}'s clock is {:.1} s {} this node's: peer connections are refused \
                     past {} s of difference; run NTP on every node",
                    sample.offset_ms.unsigned_abs() as f64 / 1_000.0,
                    if sample.offset_ms >= 0 {
                        "ahead of"
                    } else {
                        "behind"
                    },
                    MAX_SKEW_MS / 1_000
                );
            }
            if let Some(rate) = rate.filter(|_| rate_bad) {
                tracing::warn!(
                    node = node.id,
                    peer = id,
                    rate,
                    "node {id}'s clock runs {rate:.4} times as fast as this node's: lease lengths \
                     are measured on the leader's clock, and clients allow for rates within 1 %; \
                     check both hosts' clock sources"
                );
            }
        }
        rate
    }
}

/// A member's answer to a probe.
struct Answer {
    /// It knows a leader (`/readyz` answered 200).
    ready: bool,
    leader_id: Option<u64>,
    /// Why it is not ready, when it says something other than that it knows no leader.
    not_ready: Option<String>,
    /// Its clocks, when it is ready and of a version that tells them.
    clock: Option<ClockSample>,
    /// The last log index it applied, likewise.
    applied_index: Option<u64>,
    /// The build it runs, likewise.
    version: Option<String>,
    /// When it was asked.
    asked: Instant,
}

/// The member's answer when it answered at all (over the peer port: see
/// `Node::call_member_api`).
async fn probe(node: &Node, id: u64) -> Result<Answer, String> {
    let sent = Instant::now();
    let (sent_wall, sent_mono) = (node.clock.wall_ms(), monotonic_ms());
    let asked = node.call_member_api(id, "GET", "/readyz", None, None, PROBE_TIMEOUT);
    let (status, body) = match tokio::time::timeout(PROBE_TIMEOUT, asked).await {
        Err(_) => return Err(format!("no answer within {} ms", PROBE_TIMEOUT.as_millis())),
        Ok(answer) => answer?,
    };
    if !(200..300).contains(&status) {
        // Alive but not ready; the body says why.
        let why = serde_json::from_str::<ErrorBody>(&body)
            .ok()
            .filter(|e| e.error != ErrorCode::NoLeader)
            .map(|e| format!("{}: {}", e.error.as_str(), e.message));
        return Ok(Answer {
            ready: false,
            leader_id: None,
            not_ready: why,
            clock: None,
            applied_index: None,
            version: None,
            asked: sent,
        });
    }
    let ready: ReadyStatus = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let round_trip = sent.elapsed();
    let half = round_trip.as_millis() as u64 / 2;
    let clock = ready
        .clock_ms
        .zip(ready.monotonic_ms)
        .map(|(wall, theirs_ms)| ClockSample {
            offset_ms: ms_apart(wall, sent_wall + half),
            ours_ms: sent_mono + half,
            theirs_ms,
            round_trip,
        });
    Ok(Answer {
        ready: true,
        leader_id: Some(ready.leader_id),
        not_ready: None,
        clock,
        applied_index: ready.applied_index,
        version: ready.version,
        asked: sent,
    })
}

/// Runs the probes concurrently, so one slow member does not delay the others' results.
async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) {
    let mut set = tokio::task::JoinSet::new();
    for f in futs {
        set.spawn(f);
    }
    while set.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ours_ms: u64, theirs_ms: u64, rtt_ms: u64) -> ClockSample {
        ClockSample {
            offset_ms: 0,
            ours_ms,
            theirs_ms,
            round_trip: Duration::from_millis(rtt_ms),
        }
    }

    #[test]
    fn a_rate_needs_a_minute_of_precise_samples() {
        let mut w = RateWindow::default();
        // Every 5 s (only one in two is due), the member's clock 50 % fast.
        for s in 0..12u64 {
            let ours = s * 5_000;
            assert_eq!(
                w.add(&sample(ours, 1_000 + ours * 3 / 2, 2)),
                None,
                "at {ours} ms"
            );
        }
        let rate = w.add(&sample(60_000, 91_000, 2)).expect("a minute in");
        assert!((rate - 1.5).abs() < 1e-9, "{rate}");
        // A slow round trip's reading (10 s off) does not count.
        let rate = w
            .add(&sample(70_000, 116_000, 300))
            .expect("the rate so far");
        assert!((rate - 1.5).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn the_window_slides_and_a_restart_starts_it_again() {
        let mut w = RateWindow::default();
        let mut rate = None;
        for s in 0..40u64 {
            let ours = s * 10_000;
            // The same rate for 200 s, then 1 % slow.
            let theirs = if ours <= 200_000 {
                ours
            } else {
                200_000 + (ours - 200_000) * 99 / 100
            };
            rate = w.add(&sample(ours, theirs, 1));
        }
        assert!((rate.expect("rate") - 0.99).abs() < 1e-9, "{rate:?}");
        assert_eq!(w.add(&sample(400_000, 5, 1)), None, "a restarted member");
    }

    #[test]
    fn a_node_is_behind_when_it_lacks_what_the_leader_applied_a_second_ago() {
        let table = HealthTable::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // The leader's answers every 500 ms: 100 entries applied per answer.
        for i in 0..10u64 {
            table.leader_applied_at(at(i * 500), 1_000 + i * 100);
        }
        let now = at(4_500);
        // 1 s before now the leader had applied 1,700.
        assert_eq!(table.behind_at(1_700, now), None);
        assert_eq!(table.behind_at(1_900, now), None, "ahead of a second ago");
        let behind = table.behind_at(1_650, now).expect("behind");
        assert_eq!(behind.leader_applied, 1_700);
        assert_eq!(behind.ago, Duration::from_secs(1));
        // Caught up, but found behind 4 s ago: still behind; 5 s on, ready again.
        assert_eq!(table.behind_at(1_900, at(8_500)), Some(behind));
        assert_eq!(table.behind_at(1_900, at(9_500)), None);
        assert!(
            table.leader_applied.lock().unwrap().len() <= 6,
            "keeps only what it needs"
        );
        assert_eq!(
            HealthTable::default().behind_at(0, now),
            None,
            "nothing heard from a leader"
        );
    }

    #[test]
    fn a_node_that_has_not_heard_the_leader_yet_cannot_tell() {
        let table = HealthTable::default();
        // The test process is young enough for this only in its first seconds: check the rule,
        // not the clock.
        if monotonic_ms() < FIRST_ANSWER_WAIT_MS {
            assert!(table.leader_unheard());
        }
        table.heard_leader();
        assert!(!table.leader_unheard());
    }

    /// After a gap in the leader's answers (this node was cut off, or just started), the first
    /// answer binds at once: the samples from before the gap would call a node that missed
    /// everything meanwhile ready for the next second.
    #[test]
    fn after_a_gap_the_leaders_first_answer_binds_at_once() {
        let table = HealthTable::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        table.leader_applied_at(at(0), 1_000);
        assert!(
            table.behind_at(999, at(0)).is_some(),
            "a node that just started"
        );
        assert_eq!(table.behind_at(1_000, at(10)), None);
        for i in 1..6u64 {
            table.leader_applied_at(at(i * 500), 1_000 + i * 10);
        }
        assert_eq!(table.behind_at(1_050, at(2_500)), None);

        // Cut off for 30 s, while the leader applied 20,000 more.
        table.leader_applied_at(at(32_500), 21_050);
        let behind = table.behind_at(1_050, at(32_600)).expect("behind at once");
        assert_eq!(behind.leader_applied, 21_050);
        assert!(table.behind_at(21_000, at(33_000)).is_some());
        // Caught up: ready, with no hold.
        assert_eq!(table.behind_at(21_050, at(33_100)), None);
        assert_eq!(table.behind_at(21_050, at(33_200)), None);
        // Steady answers do not bind at once.
        table.leader_applied_at(at(33_000), 21_500);
        assert_eq!(table.behind_at(21_050, at(33_300)), None);
    }
}
