//! A collection that is nearly always empty, held as one pointer.
//!
//! A resource record has a queue of waiters and a list of proxy grants, and at the seed
//! workload almost every record has neither: inline, an empty `VecDeque` and an empty `Vec`
//! cost 56 bytes of every one of a hundred thousand records, in the nodes of a persistent map
//! that apply copies while a snapshot is written. [`Rare`] is one pointer, null while the
//! collection is empty: it is allocated by the first element and let go of with the last.
//!
//! Reads go through `Deref` (an empty collection reads as empty); changes go through the few
//! methods below, which keep "empty" and "null" the same thing. Serialised exactly as the
//! collection itself.

use std::collections::VecDeque;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::state::Waiter;

/// A `Vec` or `VecDeque` as one pointer, null exactly when the collection is empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rare<C>(Option<Box<C>>);

impl<C> Default for Rare<C> {
    fn default() -> Self {
        Rare(None)
    }
}

impl<C: Serialize + Default> Serialize for Rare<C> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Some(c) => c.serialize(serializer),
            None => C::default().serialize(serializer),
        }
    }
}

/// The collections a [`Rare`] holds.
pub trait Collection {
    fn is_empty(&self) -> bool;
}

impl<T> Collection for Vec<T> {
    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
}

impl<T> Collection for VecDeque<T> {
    fn is_empty(&self) -> bool {
        VecDeque::is_empty(self)
    }
}

impl<'de, C: Deserialize<'de> + Collection> Deserialize<'de> for Rare<C> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let c = C::deserialize(deserializer)?;
        Ok(Rare((!c.is_empty()).then(|| Box::new(c))))
    }
}

impl<T> Deref for Rare<Vec<T>> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

impl<T> Rare<Vec<T>> {
    pub fn push(&mut self, item: T) {
        self.0.get_or_insert_with(Box::default).push(item);
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.0.iter_mut().flat_map(|v| v.iter_mut())
    }

    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        if let Some(v) = &mut self.0 {
            v.retain(keep);
            if v.is_empty() {
                self.0 = None;
            }
        }
    }
}

/// What an empty queue of waiters reads as.
static NO_WAITERS: VecDeque<Waiter> = VecDeque::new();

impl Deref for Rare<VecDeque<Waiter>> {
    type Target = VecDeque<Waiter>;

    fn deref(&self) -> &VecDeque<Waiter> {
        self.0.as_deref().unwrap_or(&NO_WAITERS)
    }
}

impl Rare<VecDeque<Waiter>> {
    pub fn push_back(&mut self, waiter: Waiter) {
        self.0.get_or_insert_with(Box::default).push_back(waiter);
    }

    pub fn pop_front(&mut self) -> Option<Waiter> {
        self.take_from(|q| q.pop_front())
    }

    pub fn remove(&mut self, index: usize) -> Option<Waiter> {
        self.take_from(|q| q.remove(index))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Waiter> {
        self.0.iter_mut().flat_map(|q| q.iter_mut())
    }

    fn take_from(
        &mut self,
        take: impl FnOnce(&mut VecDeque<Waiter>) -> Option<Waiter>,
    ) -> Option<Waiter> {
        let q = self.0.as_deref_mut()?;
        let taken = take(q);
        if q.is_empty() {
            self.0 = None;
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: &str) -> Waiter {
        Waiter {
            request_id: id.into(),
            holder: None,
            ttl_ms: 1,
            deadline_ms: 2,
            lease_id: crate::wire::LeaseId(3),
            retain_ms: 4,
        }
    }

    #[test]
    fn encodes_as_the_collection_and_empty_is_null() {
        let mut q: Rare<VecDeque<Waiter>> = Rare::default();
        let plain: VecDeque<Waiter> = ["a", "b"].into_iter().map(waiter).collect();
        q.push_back(waiter("a"));
        q.push_back(waiter("b"));
        let bytes = rmp_serde::to_vec_named(&q).unwrap();
        assert_eq!(bytes, rmp_serde::to_vec_named(&plain).unwrap());
        let back: Rare<VecDeque<Waiter>> = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, q);
        assert_eq!(q.remove(1).map(|w| w.request_id), Some("b".into()));
        assert_eq!(q.pop_front().map(|w| w.request_id), Some("a".into()));
        assert_eq!(q.pop_front(), None);
        assert_eq!(q, Rare::default(), "the last one out lets go of the queue");
        let empty = rmp_serde::to_vec_named(&q).unwrap();
        assert_eq!(
            empty,
            rmp_serde::to_vec_named(&VecDeque::<Waiter>::new()).unwrap()
        );
        let back: Rare<VecDeque<Waiter>> = rmp_serde::from_slice(&empty).unwrap();
        assert_eq!(back, Rare::default());
    }

    #[test]
    fn a_list_emptied_by_retain_is_null() {
        let mut v: Rare<Vec<u64>> = Rare::default();
        assert!(v.is_empty());
        v.push(1);
        v.push(2);
        for x in v.iter_mut() {
            *x *= 10;
        }
        assert_eq!(&*v, &[10, 20]);
        v.retain(|x| *x > 10);
        assert_eq!(&*v, &[20]);
        v.retain(|_| false);
        assert_eq!(v, Rare::default());
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            serde_json::to_string(&Vec::<u64>::new()).unwrap()
        );
    }
}
