//! Snapshots: the machine as a plain image, and back (rebuilding the derived indexes).

use super::lock_machine::{count_up, LockMachine};
use super::state::MachineImage;

impl LockMachine {
    pub fn image(&self) -> MachineImage {
        let mut dedup: Vec<_> = self
            .dedup
            .iter()
            .map(|((r, q), rec)| (r.clone(), q.clone(), rec.clone()))
            .collect();
        // HashMap order differs between replicas; snapshots should be byte-identical.
        dedup.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        MachineImage {
            now_ms: self.now_ms,
            term: self.term,
            last_token: self.last_token,
            gc_floor: self.gc_floor,
            resources: self
                .resources
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            dedup,
            quotas: self.quotas.clone(),
            keys: self.keys.values().cloned().collect(),
        }
    }

    pub fn from_image(image: MachineImage) -> Self {
        let mut m = LockMachine {
            now_ms: image.now_ms,
            term: image.term,
            last_token: image.last_token,
            gc_floor: image.gc_floor,
            quotas: image.quotas,
            keys: image.keys.into_iter().map(|k| (k.id.clone(), k)).collect(),
            ..Default::default()
        };
        for (name, res) in image.resources {
            if let Some(l) = &res.lease {
                m.lease_expiry.insert((l.expires_at_ms, name.clone()));
                count_up(&mut m.tenant_leases, &name);
            }
            for w in &res.waiters {
                count_up(&mut m.tenant_waiters, &name);
                m.waiter_deadlines
                    .insert((w.deadline_ms, name.clone(), w.request_id.clone()));
            }
            m.total_waiters += res.waiters.len() as u64;
            if let Some(until) = res.idle_until_ms {
                m.idle_expiry.insert((until, name.clone()));
            }
            if let Some(at) = res.reissue_at_ms {
                m.reissue_index.insert((at, name.clone()));
            }
            m.resources.insert(name, res);
        }
        for (r, q, rec) in image.dedup {
            if rec.expires_at_ms != u64::MAX {
                m.dedup_expiry
                    .insert((rec.expires_at_ms, r.clone(), q.clone()));
            }
            m.dedup.insert((r, q), rec);
        }
        m
    }

    /// Verifies that the derived indexes agree with the primary state. For tests.
    pub fn check_indexes(&self) -> Result<(), String> {
        let rebuilt = LockMachine::from_image(self.image());
        if rebuilt.lease_expiry != self.lease_expiry {
            return Err("lease_expiry index out of step".into());
        }
        if rebuilt.waiter_deadlines != self.waiter_deadlines {
            return Err("waiter_deadlines index out of step".into());
        }
        if rebuilt.dedup_expiry != self.dedup_expiry {
            return Err("dedup_expiry index out of step".into());
        }
        if rebuilt.idle_expiry != self.idle_expiry {
            return Err("idle_expiry index out of step".into());
        }
        if rebuilt.reissue_index != self.reissue_index {
            return Err("reissue_index out of step".into());
        }
        if rebuilt.total_waiters != self.total_waiters {
            return Err("total_waiters out of step".into());
        }
        if rebuilt.tenant_leases != self.tenant_leases {
            return Err("tenant_leases out of step".into());
        }
        if rebuilt.tenant_waiters != self.tenant_waiters {
            return Err("tenant_waiters out of step".into());
        }
        Ok(())
    }
}
