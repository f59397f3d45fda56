//! A fast hasher for the queue's maps keyed by what the module itself numbers (waiter ids, the
//! server's blocked-client handles, database indexes): none is chosen by a client, so none can
//! be picked to collide, and SipHash's resistance to that (kept for lock names, owners and
//! tags, which clients choose) is not needed there. A multiply-rotate hash (FxHash's), whose high
//! bits (what the table's control bytes use) depend on every input bit.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by module-numbered values (see the module docs).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// FxHash's constant: odd, with its bits spread.
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// The hasher of [`IdMap`].
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl IdHasher {
    const fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn write_i32(&mut self, n: i32) {
        self.add(u64::from(n as u32));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn sequential_ids_fill_the_buckets_and_spread_the_control_bits() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let hashes: Vec<u64> = (1..=128u64).map(|id| build.hash_one(id)).collect();
        // The bucket (the low bits): an odd multiplier is a bijection modulo 2^7.
        let buckets: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 127).collect();
        assert_eq!(buckets.len(), 128);
        // The control byte (the top 7 bits): not all alike (a probe's filter works).
        let tops: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(tops.len() > 32, "{} distinct top-7-bit values of 128", tops.len());
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map: IdMap<u64, u64> = IdMap::default();
        for id in 0..10_000 {
            map.insert(id, id * 2);
        }
        assert!((0..10_000).all(|id| map.get(&id) == Some(&(id * 2))));
        let mut dbs: IdMap<i32, ()> = IdMap::default();
        dbs.insert(-1, ());
        dbs.insert(0, ());
        assert_eq!(dbs.len(), 2);
    }
}
