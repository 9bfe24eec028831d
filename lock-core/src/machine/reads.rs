//! Reads of the lock state: views for the API, deadlines for the sweeper, stats.

use super::lock_machine::LockMachine;
use super::name::ResName;
use super::quota::QuotaLedger;
use super::state::{Lease, ResourceState};
use crate::wire::{
    scoped_name, split_scoped, LockStats, LockView, DEFAULT_TENANT, TENANT_SEPARATOR,
};

/// Resource records a page of the lock list walks in name order before it finds the live ones
/// through the indexes instead (see `page`).
const SCAN_BUDGET: usize = 2_048;

impl LockMachine {
    /// When the resource's ended lease's proxy grants run out at the latest, while the next
    /// lease waits for the proxies to confirm they stopped (see `Command::RevokeAck`).
    pub fn revoking_until(&self, resource: &str) -> Option<u64> {
        let res = self.record(resource)?;
        if res.lease.is_some() {
            return None;
        }
        res.reissue_at_ms.filter(|at| *at > self.now_ms)
    }

    /// Log time: the latest stamp applied.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The quota ledger (definitions and leased shares).
    pub fn quotas(&self) -> &QuotaLedger {
        &self.quotas
    }

    pub fn last_token(&self) -> u64 {
        self.last_token
    }

    /// Commands applied since the log began (each command of a batch counts).
    pub fn commands(&self) -> u64 {
        self.commands
    }

    /// The resource as a reader should see it at log time `now_ms` (a lease whose time is up
    /// but that no command has expired yet is shown as not held).
    pub fn view(&self, resource: &str, now_ms: u64) -> LockView {
        let res = self.record(resource);
        let live = res
            .and_then(|r| r.lease.as_ref())
            .filter(|l| l.expires_at_ms > now_ms.max(self.now_ms));
        LockView {
            resource: resource.to_string(),
            held: live.is_some(),
            holder: live.and_then(|l| l.holder.clone()),
            fencing_token: res.map(|r| r.last_token).filter(|t| *t > 0),
            expires_at_ms: live.map(|l| l.expires_at_ms),
            waiters: res.map_or(0, |r| r.waiters.len() as u32),
        }
    }

    /// Resources whose name starts with `prefix`, in name order, that are held or waited on.
    pub fn list(&self, prefix: &str, limit: usize, now_ms: u64) -> Vec<LockView> {
        self.list_after(prefix, None, limit, now_ms).0
    }

    /// One page of [`list`](Self::list): the entries after the name `after` (exclusive), and
    /// the cursor for the next page when more entries follow. The scan starts at the cursor in
    /// the ordered map, so a page costs the same at the end of 100k resources as at the start.
    pub fn list_after(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        now_ms: u64,
    ) -> (Vec<LockView>, Option<String>) {
        self.page(prefix, after, limit, now_ms, |_| true)
    }

    /// [`list_after`](Self::list_after) within `tenant`'s namespace: `prefix`, `after` and the
    /// answer use the tenant's own names, and no other tenant's resource is ever visited.
    pub fn list_tenant(
        &self,
        tenant: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        now_ms: u64,
    ) -> (Vec<LockView>, Option<String>) {
        let prefix = scoped_name(tenant, prefix);
        let after = after.map(|a| scoped_name(tenant, a));
        // The default tenant's names are the bare ones; other tenants' sort among them.
        let default = tenant == DEFAULT_TENANT;
        let (mut page, next) = self.page(&prefix, after.as_deref(), limit, now_ms, |name| {
            !default || !name.contains(TENANT_SEPARATOR)
        });
        for view in &mut page {
            view.resource = split_scoped(&view.resource).1.to_string();
        }
        (page, next.map(|n| split_scoped(&n).1.to_string()))
    }

    /// The live resources (a lease not yet run out, or waiters) in `prefix` after `after`, in
    /// name order, `limit` of them and the cursor of the next page.
    ///
    /// Readers hold the machine's lock, and apply waits for it, so a page must cost little
    /// whatever the state. Walking the names in order is cheap while live resources are
    /// dense; among many idle records (every resource used in the retry window keeps one) a
    /// page could walk all 100,000 of them. So the walk stops after a budget of records, and a
    /// page it did not fill is then taken from the expiry indexes, which name exactly the
    /// resources with a lease or a waiter: the cost is bounded by the live resources, not by
    /// the records.
    fn page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        now_ms: u64,
        keep: impl Fn(&str) -> bool,
    ) -> (Vec<LockView>, Option<String>) {
        use std::ops::Bound;
        let after = after.filter(|a| *a >= prefix);
        let start = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Included(prefix),
        };
        let now = now_ms.max(self.now_ms);
        let live = |r: &ResourceState| {
            r.lease.as_ref().is_some_and(|l| l.expires_at_ms > now) || !r.waiters.is_empty()
        };
        // One more than asked tells whether a next page exists, so the last page never
        // points at an empty one.
        let want = limit.saturating_add(1);
        let budget = want.saturating_mul(8).max(SCAN_BUDGET);
        let mut names: Vec<&str> = Vec::with_capacity(want.min(1_024));
        let mut complete = true;
        for (walked, (name, r)) in self
            .resources
            .range::<_, str>((start, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .enumerate()
        {
            if names.len() == want {
                break;
            }
            if walked == budget {
                complete = false;
                break;
            }
            if keep(name) && live(r) {
                names.push(name);
            }
        }
        if !complete {
            names = self.live_names_from_indexes(prefix, after, want, &keep, live);
        }
        let mut page: Vec<LockView> = names.iter().map(|name| self.view(name, now_ms)).collect();
        let next = if page.len() > limit {
            page.truncate(limit);
            page.last().map(|v| v.resource.clone())
        } else {
            None
        };
        (page, next)
    }

    /// The first `want` names, in order, of resources in `prefix` after `after` that `keep`
    /// and `live` accept, found through the lease and waiter indexes.
    fn live_names_from_indexes<'a>(
        &'a self,
        prefix: &str,
        after: Option<&str>,
        want: usize,
        keep: &impl Fn(&str) -> bool,
        live: impl Fn(&ResourceState) -> bool,
    ) -> Vec<&'a str> {
        let held = self.lease_expiry.iter().map(|(_, name)| name.as_str());
        let waited = self
            .waiter_deadlines
            .iter()
            .map(|(_, name, _)| name.as_str());
        let mut names: Vec<&str> = held
            .chain(waited)
            .filter(|name| name.starts_with(prefix) && after.is_none_or(|a| *name > a))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .filter(|name| keep(name) && self.resources.get(*name).is_some_and(&live))
            .take(want)
            .collect()
    }

    /// Resources with the longest queues, longest first. Found through the waiter index, so
    /// the cost follows the waiters, not the resource records.
    pub fn deepest_queues(&self, limit: usize) -> Vec<(String, u32)> {
        let mut waited: Vec<&ResName> = self
            .waiter_deadlines
            .iter()
            .map(|(_, name, _)| name)
            .collect();
        waited.sort_unstable();
        waited.dedup();
        let mut deep: Vec<(String, u32)> = waited
            .into_iter()
            .filter_map(|name| {
                let depth = self.resources.get(name)?.waiters.len() as u32;
                (depth > 0).then(|| (name.to_string(), depth))
            })
            .collect();
        deep.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        deep.truncate(limit);
        deep
    }

    /// The record of one resource. Looked up by a `ResName`, the search compares the names'
    /// first bytes, kept in the map's keys; by `&str`, every comparison would read another
    /// name's allocation, a cache miss each at 100k resources (the API makes this lookup beside
    /// apply, e.g. for every renewal's audit line).
    fn record(&self, resource: &str) -> Option<&ResourceState> {
        self.resources.get(&ResName::new(resource))
    }

    /// The lease currently recorded for a resource (expired or not), for tests and checks.
    pub fn lease(&self, resource: &str) -> Option<&Lease> {
        self.record(resource)?.lease.as_deref()
    }

    pub fn resource(&self, resource: &str) -> Option<&ResourceState> {
        self.record(resource)
    }

    /// The earliest moment at which a `Tick` would change something, if any.
    pub fn next_deadline(&self) -> Option<u64> {
        [
            self.lease_expiry.get_min().map(|(t, _)| *t),
            self.waiter_deadlines.get_min().map(|(t, _, _)| *t),
            self.dedup.next_expiry(),
            self.idle_expiry.get_min().map(|(t, _)| *t),
            self.reissue_index.get_min().map(|(t, _)| *t),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether any lease is recorded (the sweeper then keeps log time fresh).
    pub fn has_leases(&self) -> bool {
        !self.lease_expiry.is_empty()
    }

    pub fn stats(&self) -> LockStats {
        LockStats {
            now_ms: self.now_ms,
            term: self.term,
            last_token: self.last_token,
            resources: self.resources.len() as u64,
            active_locks: self.lease_expiry.len() as u64,
            waiters: self.total_waiters,
            dedup_records: self.dedup.len() as u64,
        }
    }
}
