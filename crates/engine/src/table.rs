//! A fixed-capacity hash table keyed by stripe: the shard's index of stripes with an operation
//! running or queued. Allocated once; inserting into a full table is refused (backpressure),
//! never grown. Open addressing with linear probing and backward-shift deletion, so there are
//! no tombstones and lookups stay short at the load factor it is sized for (at most 1/2).

use flashraid_layout::StripeIndex;

#[derive(Debug)]
pub(crate) struct StripeTable<V> {
    slots: Vec<Option<(StripeIndex, V)>>,
    len: usize,
    len_max: usize,
    mask: usize,
}

/// The table holds `len_max` entries already.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Full;

impl<V> StripeTable<V> {
    pub fn new(len_max: usize) -> Self {
        let capacity = (len_max.max(1) * 2).next_power_of_two();
        let mut slots = Vec::with_capacity(capacity);
        slots.resize_with(capacity, || None);
        Self { slots, len: 0, len_max, mask: capacity - 1 }
    }

    fn home(&self, key: StripeIndex) -> usize {
        // Fibonacci hashing: consecutive stripes spread over the table.
        let hashed = key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        usize::try_from(hashed >> 32).expect("usize holds 32 bits") & self.mask
    }

    fn find(&self, key: StripeIndex) -> Option<usize> {
        let mut i = self.home(key);
        loop {
            match &self.slots[i] {
                None => return None,
                Some((k, _)) if *k == key => return Some(i),
                Some(_) => i = (i + 1) & self.mask,
            }
        }
    }

    pub fn get(&self, key: StripeIndex) -> Option<&V> {
        self.find(key).map(|i| &self.slots[i].as_ref().expect("found").1)
    }

    pub fn get_mut(&mut self, key: StripeIndex) -> Option<&mut V> {
        self.find(key).map(|i| &mut self.slots[i].as_mut().expect("found").1)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_full(&self) -> bool {
        self.len >= self.len_max
    }

    /// Insert a new key (it must not be present).
    pub fn insert(&mut self, key: StripeIndex, value: V) -> Result<(), Full> {
        assert!(self.find(key).is_none(), "stripe {key:?} inserted twice");
        if self.is_full() {
            return Err(Full);
        }
        let mut i = self.home(key);
        while self.slots[i].is_some() {
            i = (i + 1) & self.mask;
        }
        self.slots[i] = Some((key, value));
        self.len += 1;
        Ok(())
    }

    pub fn remove(&mut self, key: StripeIndex) -> Option<V> {
        let mut hole = self.find(key)?;
        let (_, value) = self.slots[hole].take().expect("found");
        self.len -= 1;
        // Backward shift: move later entries of the probe run into the hole when their home
        // position allows, so every remaining key is still reachable from its home.
        let mut i = (hole + 1) & self.mask;
        while let Some((k, _)) = &self.slots[i] {
            let home = self.home(*k);
            let distance_to_i = (i + self.slots.len() - home) & self.mask;
            let distance_to_hole = (hole + self.slots.len() - home) & self.mask;
            if distance_to_hole <= distance_to_i {
                self.slots[hole] = self.slots[i].take();
                hole = i;
            }
            i = (i + 1) & self.mask;
        }
        Some(value)
    }

    /// Keys in table order (not sorted); for status and tests only.
    pub fn keys(&self) -> impl Iterator<Item = StripeIndex> + '_ {
        self.slots.iter().filter_map(|s| s.as_ref().map(|(k, _)| *k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    #[test]
    fn behaves_like_a_map_under_random_operations() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut table: StripeTable<u64> = StripeTable::new(64);
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        for step in 0..20_000u64 {
            // Few distinct keys, so inserts, lookups and removals all collide often.
            let key = rng.random_range(0..200u64);
            match rng.random_range(0..3) {
                0 => {
                    let inserted = if model.contains_key(&key) {
                        None
                    } else {
                        Some(table.insert(StripeIndex(key), step))
                    };
                    match inserted {
                        Some(Ok(())) => {
                            model.insert(key, step);
                        }
                        Some(Err(Full)) => assert_eq!(model.len(), 64),
                        None => {}
                    }
                }
                1 => assert_eq!(table.remove(StripeIndex(key)), model.remove(&key)),
                _ => assert_eq!(table.get(StripeIndex(key)).copied(), model.get(&key).copied()),
            }
            assert_eq!(table.len(), model.len());
        }
        for (k, v) in &model {
            assert_eq!(table.get(StripeIndex(*k)), Some(v));
        }
    }
}
