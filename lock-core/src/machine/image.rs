//! Snapshots: the machine as a plain image, and back (rebuilding the derived indexes).

use super::lock_machine::{count_up, LockMachine};
use super::state::{dedup_key, DedupEntry, MachineImage};

impl LockMachine {
    pub fn image(&self) -> MachineImage {
        // In key order, so every replica writes byte-identical snapshots.
        let dedup_records: Vec<_> = self
            .dedup
            .iter()
            .map(|(key, rec)| DedupEntry::of(*key, rec))
            .collect();
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
            dedup_records,
            dedup: Vec::new(),
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
        let legacy = image
            .dedup
            .into_iter()
            .map(|(resource, request_id, rec)| (dedup_key(&resource, &request_id), rec));
        let current = image.dedup_records.into_iter().map(DedupEntry::into_record);
        for (key, rec) in current.chain(legacy) {
            if rec.expires_at_ms != u64::MAX {
                m.dedup_expiry.insert((rec.expires_at_ms, key));
            }
            m.dedup.insert(key, rec);
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
