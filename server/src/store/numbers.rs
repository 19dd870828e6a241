//! Stored visitor numbers kept in memory, for the open days of every analytics read.
//!
//! Each visitor key of a site gets a number (`visitor_numbers`) when a day holding it is
//! sealed; an open day's events carry those numbers, so its visitor sets unite exactly with
//! the sealed days'. Every read of a range that ends today looks up the numbers of all of
//! today's visitors: on PostgreSQL ~20–90 ms for the ~15,000 visitors of a day of a 10 M-view
//! year, growing with the day. Here the answers are kept, both kinds:
//!
//! Contract (both backends; `tests/it/segment_store.rs` proves it):
//! - **A number is kept for good.** A stored number never changes and is never removed.
//! - **A key without a number is kept only with the numbering generation it was looked up
//!   at** (the `number_generation` row of `meta`). Every transaction that stores numbers
//!   raises it ([`BUMP_GENERATION`]), after its inserts, so two snapshots that read the same
//!   generation see the same stored numbers (the raises take the row's lock one after the
//!   other). A read passes the generation it read in its own snapshot: one that sees another
//!   generation forgets every key kept without a number; one that read an older generation
//!   than the cache holds keeps nothing it found missing.
//! - **Bounded.** Numbers are kept in two generations of [`PER_GENERATION`] keys (a key
//!   found in the older is moved to the newer, so the keys in use stay), keys without a
//!   number up to [`PER_GENERATION`] (then no more are kept): ~25 MB at most.
//! - **One database's history.** What is kept assumes the database never loses a commit it
//!   acknowledged; after a restore from a backup or a failover to a standby that lacks
//!   recent commits, restart the collectors (as for the ids every store keeps).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Raise the numbering generation: run in every transaction that stores visitor numbers,
/// after them (the same text on SQLite and PostgreSQL).
pub(crate) const BUMP_GENERATION: &str = "INSERT INTO meta (key, value) \
     VALUES ('number_generation', 1) \
     ON CONFLICT (key) DO UPDATE SET value = meta.value + 1";

/// The numbering generation (no row: 0).
pub(crate) const READ_GENERATION: &str =
    "SELECT COALESCE(MAX(value), 0) FROM meta WHERE key = 'number_generation'";

/// Keys kept per generation of numbers, and keys kept without one: the most a table of
/// 2^18 buckets holds (7/8 of them), so each table stays at that size.
const PER_GENERATION: usize = 229_376;

type Key = (i64, [u8; 16]);

/// Estimated bytes per key kept with its number (key, number, padding, control byte) and per
/// key kept without one.
const BYTES_PER_NUMBERED: usize = 33;
const BYTES_PER_MISSING: usize = 25;

/// Numbers and missing numbers one store has looked up or assigned.
#[derive(Default)]
pub(crate) struct Numbers {
    young: HashMap<Key, u32>,
    old: HashMap<Key, u32>,
    /// Keys without a number at `missing_at`.
    missing: HashSet<Key>,
    missing_at: i64,
}

/// What [`Numbers::lookup`] leaves to the database.
struct Lookup {
    /// The keys' numbers known here.
    known: HashMap<[u8; 16], u32>,
    /// Keys not known here either way: look them up.
    ask: Vec<[u8; 16]>,
}

/// One read's lookup through a shared [`Numbers`]: [`Pending::ask`] the database for the
/// keys it names, then [`Pending::finish`].
pub(crate) struct Pending<'a> {
    cache: &'a Mutex<Numbers>,
    site: i64,
    generation: i64,
    lookup: Lookup,
}

impl<'a> Pending<'a> {
    /// Look `keys` of `site` up in `cache`, for a read at numbering generation `generation`.
    pub(crate) fn start<'k>(
        cache: &'a Mutex<Numbers>,
        site: i64,
        keys: impl IntoIterator<Item = &'k [u8; 16]>,
        generation: i64,
    ) -> Self {
        let lookup = lock(cache).lookup(site, keys, generation);
        Pending {
            cache,
            site,
            generation,
            lookup,
        }
    }

    /// The keys to look up in the database.
    pub(crate) fn ask(&self) -> &[[u8; 16]] {
        &self.lookup.ask
    }

    /// Every number known, given the ones the database `found` of [`Pending::ask`]; the cache
    /// keeps them, and the keys asked but not found.
    pub(crate) fn finish(self, found: HashMap<[u8; 16], u32>) -> HashMap<[u8; 16], u32> {
        let Lookup { mut known, ask } = self.lookup;
        lock(self.cache).learn(self.site, &ask, &found, self.generation);
        known.extend(found);
        known
    }
}

fn lock(cache: &Mutex<Numbers>) -> MutexGuard<'_, Numbers> {
    cache.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Numbers {
    /// A kept number; one found in the older generation moves to the newer.
    fn get(&mut self, key: &Key) -> Option<u32> {
        if let Some(n) = self.young.get(key) {
            return Some(*n);
        }
        let n = self.old.remove(key)?;
        self.insert(key.0, key.1, n);
        Some(n)
    }

    /// Keep the numbers a committed transaction stored: `assigned` keys of `site`.
    pub(crate) fn remember(cache: &Mutex<Numbers>, site: i64, assigned: Vec<([u8; 16], u32)>) {
        let mut numbers = lock(cache);
        for (key, num) in assigned {
            numbers.insert(site, key, num);
        }
    }

    /// Estimated bytes of `cache`'s tables: each bucket a key, a number and a control byte
    /// (without the number for keys kept without one).
    pub(crate) fn estimated_bytes(cache: &Mutex<Numbers>) -> usize {
        let numbers = lock(cache);
        let with = numbers.young.capacity() + numbers.old.capacity();
        with * BYTES_PER_NUMBERED + numbers.missing.capacity() * BYTES_PER_MISSING
    }

    /// Keep a stored number.
    fn insert(&mut self, site: i64, key: [u8; 16], num: u32) {
        if self.young.len() >= PER_GENERATION {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert((site, key), num);
    }

    /// Split `keys` of `site` into the numbers known here and the keys to ask the database
    /// for, for a read at numbering generation `generation`.
    fn lookup<'a>(
        &mut self,
        site: i64,
        keys: impl IntoIterator<Item = &'a [u8; 16]>,
        generation: i64,
    ) -> Lookup {
        self.follow(generation);
        let mut known = HashMap::new();
        let mut ask = Vec::new();
        for key in keys {
            let k = (site, *key);
            if let Some(n) = self.get(&k) {
                known.insert(*key, n);
            } else if self.missing_at != generation || !self.missing.contains(&k) {
                ask.push(*key);
            }
        }
        Lookup { known, ask }
    }

    /// Keep what a read at `generation` found in the database: `found` numbers, and the
    /// `asked` keys it did not find.
    fn learn(
        &mut self,
        site: i64,
        asked: &[[u8; 16]],
        found: &HashMap<[u8; 16], u32>,
        generation: i64,
    ) {
        for (key, num) in found {
            self.insert(site, *key, *num);
        }
        self.follow(generation);
        if generation != self.missing_at {
            return;
        }
        for key in asked {
            if self.missing.len() >= PER_GENERATION {
                break;
            }
            if !found.contains_key(key) {
                self.missing.insert((site, *key));
            }
        }
    }

    /// Forget the missing keys of an older generation.
    fn follow(&mut self, generation: i64) {
        if generation > self.missing_at {
            self.missing.clear();
            self.missing_at = generation;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_are_kept_for_their_generation_only() {
        let mut n = Numbers::default();
        let (a, b) = ([1u8; 16], [2u8; 16]);
        let first = n.lookup(7, [&a, &b], 3);
        assert_eq!(first.ask, vec![a, b]);
        n.learn(7, &first.ask, &HashMap::from([(a, 40)]), 3);
        // The same generation: a is known, b is known to have no number.
        let again = n.lookup(7, [&a, &b], 3);
        assert_eq!(again.known, HashMap::from([(a, 40)]));
        assert!(again.ask.is_empty());
        // Another site's same key is its own.
        assert_eq!(n.lookup(8, [&b], 3).ask, vec![b]);
        // A newer generation asks for b again; a stays known.
        let newer = n.lookup(7, [&a, &b], 4);
        assert_eq!(newer.known, HashMap::from([(a, 40)]));
        assert_eq!(newer.ask, vec![b]);
        // A late read of the old generation keeps nothing missing.
        n.learn(7, &[b], &HashMap::new(), 3);
        assert_eq!(n.lookup(7, [&b], 4).ask, vec![b]);
    }

    #[test]
    fn numbers_in_use_outlive_two_rotations() {
        let key = |i: u32| {
            let mut k = [0u8; 16];
            k[..4].copy_from_slice(&i.to_le_bytes());
            k
        };
        let mut n = Numbers::default();
        let used = [9u8; 16];
        n.insert(1, used, 5);
        let fill = |n: &mut Numbers, from: u32| {
            for i in from..from + PER_GENERATION as u32 {
                n.insert(1, key(i), i);
            }
        };
        fill(&mut n, 0);
        // `used` is in the older generation now; a read moves it to the newer.
        assert_eq!(n.lookup(1, [&used], 0).known.get(&used), Some(&5));
        fill(&mut n, 1 << 20);
        assert_eq!(n.lookup(1, [&used], 0).known.get(&used), Some(&5));
        assert_eq!(n.lookup(1, [&key(1)], 0).ask, vec![key(1)], "unused: gone");
        assert!(n.young.len() <= PER_GENERATION && n.old.len() <= PER_GENERATION);
    }

    #[test]
    fn missing_keys_stay_within_their_bound() {
        let mut n = Numbers::default();
        let keys: Vec<[u8; 16]> = (0..PER_GENERATION as u32 + 10)
            .map(|i| {
                let mut k = [0u8; 16];
                k[..4].copy_from_slice(&i.to_le_bytes());
                k
            })
            .collect();
        n.learn(1, &keys, &HashMap::new(), 1);
        assert_eq!(n.missing.len(), PER_GENERATION);
        assert_eq!(n.lookup(1, &keys, 1).ask.len(), 10);
    }
}
