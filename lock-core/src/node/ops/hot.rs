//! Per-resource activity counters for the hot-resources view and the resource page: acquire
//! rate, time acquires took, fencing rejections, and the last few events. In memory only and
//! bounded: past `CAPACITY` resources, the least recently touched tenth is dropped.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::wire::{ErrorCode, HotEntry, ResourceEvent};

const CAPACITY: usize = 10_000;
/// Events kept per resource.
const EVENTS: usize = 32;
/// Rates are counted in two windows of this length: the current one and the one before.
const WINDOW_MS: u64 = 30_000;

/// Counts in the current window and the previous one: `sum()` covers 30–60 s.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    start_ms: u64,
    cur: u64,
    prev: u64,
}

impl Window {
    fn roll(&mut self, now_ms: u64) {
        if now_ms >= self.start_ms + 2 * WINDOW_MS {
            *self = Window {
                start_ms: now_ms,
                ..Window::default()
            };
        } else if now_ms >= self.start_ms + WINDOW_MS {
            self.prev = self.cur;
            self.cur = 0;
            self.start_ms += WINDOW_MS;
        }
    }

    fn add(&mut self, now_ms: u64) {
        self.roll(now_ms);
        self.cur += 1;
    }

    /// Events per second over the covered span.
    fn rate(&self, now_ms: u64) -> f64 {
        let mut w = *self;
        w.roll(now_ms);
        let span_ms = WINDOW_MS + now_ms.saturating_sub(w.start_ms);
        (w.cur + w.prev) as f64 * 1000.0 / span_ms as f64
    }

    fn count(&self, now_ms: u64) -> u64 {
        let mut w = *self;
        w.roll(now_ms);
        w.cur + w.prev
    }
}

#[derive(Debug, Default)]
struct Stats {
    last_touch_ms: u64,
    acquires: Window,
    rejections: Window,
    /// Moving average of how long an acquire took to be answered, ms.
    wait_ms: Option<f64>,
    events: VecDeque<Kept>,
}

/// Something that happened to a resource, as a caller reports it.
#[derive(Clone, Copy, Debug)]
pub struct Activity<'a> {
    pub at_ms: u64,
    /// `acquire`, `renew`, `release`, `force_release`, `handoff`, `expire` or `fence`.
    pub kind: &'a str,
    pub fencing_token: Option<u64>,
    /// `granted`, `lock_held`, `admitted`, `stale`, ...
    pub outcome: &'a str,
}

/// An event as the table keeps it: its words are nearly always from a small vocabulary, kept
/// as static text, so recording one allocates nothing.
#[derive(Debug)]
struct Kept {
    at_ms: u64,
    kind: Cow<'static, str>,
    fencing_token: Option<u64>,
    outcome: Cow<'static, str>,
}

impl Kept {
    fn view(&self) -> ResourceEvent {
        ResourceEvent {
            at_ms: self.at_ms,
            kind: self.kind.to_string(),
            fencing_token: self.fencing_token,
            outcome: self.outcome.to_string(),
        }
    }
}

/// The static text of a known event word; a copy of any other.
fn word(s: &str) -> Cow<'static, str> {
    const WORDS: &[&str] = &[
        "acquire",
        "renew",
        "release",
        "cancel",
        "force_release",
        "handoff",
        "expire",
        "fence",
        "granted",
        "renewed",
        "released",
        "not_held",
        "expired",
        "admitted",
        "stale",
        "unknown",
        "ended",
    ];
    WORDS
        .iter()
        .find(|w| **w == s)
        .copied()
        .or_else(|| ErrorCode::known(s))
        .map_or_else(|| Cow::Owned(s.to_owned()), Cow::Borrowed)
}

#[derive(Default)]
pub struct HotTable {
    inner: Mutex<HashMap<String, Stats>>,
}

impl HotTable {
    fn touch<R>(&self, resource: &str, now_ms: u64, f: impl FnOnce(&mut Stats) -> R) -> R {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // Looked up by the borrowed name first: only a resource new to the table costs a copy
        // of its name.
        if let Some(s) = map.get_mut(resource) {
            s.last_touch_ms = s.last_touch_ms.max(now_ms);
            return f(s);
        }
        if map.len() >= CAPACITY {
            evict(&mut map);
        }
        let s = map.entry(resource.to_owned()).or_default();
        s.last_touch_ms = now_ms;
        f(s)
    }

    /// Records an event; `acquire` events also count towards the acquire rate and, with
    /// `took_ms`, the wait time; `fence` events with a rejecting outcome count as rejections.
    pub fn event(&self, resource: &str, event: Activity<'_>, took_ms: Option<u64>) {
        let now = event.at_ms;
        self.touch(resource, now, |s| {
            match event.kind {
                "acquire" => {
                    s.acquires.add(now);
                    if let Some(ms) = took_ms {
                        let ms = ms as f64;
                        s.wait_ms = Some(s.wait_ms.map_or(ms, |w| 0.8 * w + 0.2 * ms));
                    }
                }
                "fence" if event.outcome != "admitted" => s.rejections.add(now),
                _ => {}
            }
            if s.events.len() == EVENTS {
                s.events.pop_front();
            }
            s.events.push_back(Kept {
                at_ms: event.at_ms,
                kind: word(event.kind),
                fencing_token: event.fencing_token,
                outcome: word(event.outcome),
            });
        });
    }

    pub fn events(&self, resource: &str) -> Vec<ResourceEvent> {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.get(resource)
            .map(|s| s.events.iter().map(Kept::view).collect())
            .unwrap_or_default()
    }

    /// The top `limit` by acquire rate, by wait time and by fencing rejections.
    pub fn top(&self, now_ms: u64, limit: usize) -> [Vec<HotEntry>; 3] {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let top_by = |f: &dyn Fn(&Stats) -> f64| {
            let mut v: Vec<HotEntry> = map
                .iter()
                .map(|(r, s)| HotEntry {
                    resource: r.clone(),
                    value: f(s),
                })
                .filter(|e| e.value > 0.0)
                .collect();
            v.sort_by(|a, b| {
                b.value
                    .total_cmp(&a.value)
                    .then_with(|| a.resource.cmp(&b.resource))
            });
            v.truncate(limit);
            v
        };
        [
            top_by(&|s| s.acquires.rate(now_ms)),
            top_by(&|s| {
                if s.acquires.count(now_ms) > 0 {
                    s.wait_ms.unwrap_or(0.0)
                } else {
                    0.0
                }
            }),
            top_by(&|s| s.rejections.count(now_ms) as f64),
        ]
    }
}

/// Drops the least recently touched tenth, so eviction is rare and amortised.
fn evict(map: &mut HashMap<String, Stats>) {
    let mut touched: Vec<u64> = map.values().map(|s| s.last_touch_ms).collect();
    let cut = touched.len() / 10;
    let (_, at, _) = touched.select_nth_unstable(cut);
    let cutoff = *at;
    map.retain(|_, s| s.last_touch_ms > cutoff);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev<'a>(at_ms: u64, kind: &'a str, outcome: &'a str) -> Activity<'a> {
        Activity {
            at_ms,
            kind,
            fencing_token: Some(1),
            outcome,
        }
    }

    #[test]
    fn ranks_by_rate_wait_and_rejections_and_forgets_old_activity() {
        let t = HotTable::default();
        for i in 0..30 {
            t.event("kv:busy", ev(1_000 + i, "acquire", "granted"), Some(2));
        }
        t.event("kv:slow", ev(1_000, "acquire", "granted"), Some(900));
        t.event("kv:fenced", ev(1_000, "fence", "stale"), None);
        t.event("kv:fenced", ev(1_001, "fence", "admitted"), None);
        let [rate, wait, rejected] = t.top(2_000, 10);
        assert_eq!(rate[0].resource, "kv:busy");
        assert_eq!(wait[0].resource, "kv:slow");
        assert_eq!(rejected.len(), 1);
        assert_eq!(
            (rejected[0].resource.as_str(), rejected[0].value),
            ("kv:fenced", 1.0)
        );
        // Two windows later nothing is hot any more.
        let [rate, wait, rejected] = t.top(1_000 + 2 * WINDOW_MS + 1, 10);
        assert!(rate.is_empty() && wait.is_empty() && rejected.is_empty());
        assert_eq!(t.events("kv:fenced").len(), 2);
    }

    /// Known words are kept as static text, anything else as a copy; either reads back as
    /// it was recorded.
    #[test]
    fn keeps_known_words_static_and_others_as_copies() {
        assert!(matches!(word("granted"), Cow::Borrowed("granted")));
        assert!(matches!(word("lock_held"), Cow::Borrowed("lock_held")));
        assert!(matches!(word("a_newer_outcome"), Cow::Owned(_)));
        let t = HotTable::default();
        t.event("kv:a", ev(1, "acquire", "lock_held"), None);
        t.event("kv:a", ev(2, "snapshot", "a_newer_outcome"), None);
        let got: Vec<(String, String)> = t
            .events("kv:a")
            .into_iter()
            .map(|e| (e.kind, e.outcome))
            .collect();
        assert_eq!(
            got,
            [
                ("acquire".into(), "lock_held".into()),
                ("snapshot".into(), "a_newer_outcome".into())
            ]
        );
    }

    #[test]
    fn stays_bounded() {
        let t = HotTable::default();
        for i in 0..(CAPACITY as u64 + 500) {
            t.event(&format!("kv:{i}"), ev(i, "acquire", "granted"), None);
        }
        let len = t.inner.lock().expect("lock").len();
        assert!(len <= CAPACITY, "{len}");
        // The newest survive.
        assert_eq!(t.events(&format!("kv:{}", CAPACITY + 499)).len(), 1);
    }
}
