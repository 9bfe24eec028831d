//! Long-poll registry: acquires waiting in a queue are woken by the effects of apply.
//!
//! Effects are emitted on every replica, so the HTTP request can wait on whichever node it
//! arrived at, even across a leader change. A ticket is registered *before* the acquire is
//! proposed, so a hand-off applied before the proposer hears back is not missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::machine::{Grant, WaiterGone};

#[derive(Clone, Debug)]
pub enum WaitOutcome {
    Granted(Grant),
    Removed(WaiterGone),
}

type Key = (String, String);

#[derive(Clone, Default)]
pub struct WaitRegistry {
    inner: Arc<Mutex<HashMap<Key, Vec<oneshot::Sender<WaitOutcome>>>>>,
    /// Tickets alive: long polls held open on this node, each on a connection of its own.
    open: Arc<AtomicUsize>,
}

/// A registered interest in one (resource, request_id); unregisters on drop.
pub struct WaitTicket {
    registry: WaitRegistry,
    key: Key,
    rx: oneshot::Receiver<WaitOutcome>,
}

impl WaitRegistry {
    pub fn subscribe(&self, resource: &str, request_id: &str) -> WaitTicket {
        let (tx, rx) = oneshot::channel();
        let key = (resource.to_string(), request_id.to_string());
        self.lock().entry(key.clone()).or_default().push(tx);
        self.open.fetch_add(1, Ordering::Relaxed);
        WaitTicket {
            registry: self.clone(),
            key,
            rx,
        }
    }

    pub fn notify(&self, resource: &str, request_id: &str, outcome: WaitOutcome) {
        let key = (resource.to_string(), request_id.to_string());
        let senders = self.lock().remove(&key).unwrap_or_default();
        for tx in senders {
            let _ = tx.send(outcome.clone());
        }
    }

    /// Long polls held open on this node now (tickets alive).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Number of registered waits, for metrics and leak checks.
    pub fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Vec<oneshot::Sender<WaitOutcome>>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl WaitTicket {
    /// Waits for the outcome; `None` if the registry went away.
    pub async fn outcome(&mut self) -> Option<WaitOutcome> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        self.registry.open.fetch_sub(1, Ordering::Relaxed);
        let mut map = self.registry.lock();
        if let Some(list) = map.get_mut(&self.key) {
            list.retain(|tx| !tx.is_closed());
            self.rx.close();
            list.retain(|tx| !tx.is_closed());
            if list.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}
