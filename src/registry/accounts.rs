//! Every account's keys in memory, as lookups read them.
//!
//! An account of one key is one 32-byte entry in one hash map, as before accounts could
//! hold several: a million of them is what start-up and memory are measured on. The keys
//! of an account with several live in a second map, read only for those accounts.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::keyspace::{AccountId, HashKey};
use crate::store::{HashKeys, Switch};

/// Hashed with foldhash (seeded per process) rather than SipHash: a third of start-up at
/// a million accounts was filing them, and lookups hash on every request.
type Map<V> = HashMap<AccountId, V, foldhash::quality::RandomState>;

/// An account as the lookup map holds it (the account is the map's key).
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Key 0.
    key: HashKey,
    /// The account's weight (at most [`crate::keyspace::MAX_WEIGHT`]): the sum of its keys'.
    weight: u32,
    fanout: u32,
    created_at: i64,
}

/// One account's keys, weight and creation time.
#[derive(Debug, Clone)]
pub struct Held {
    /// By index, each switching key with its new value.
    pub keys: HashKeys,
    pub weight: u64,
    pub created_at: i64,
    /// The account's keys that staged moves are switching (usually none).
    pub switching: Vec<Switch>,
    /// The most keys the load controller may give it, if it opted in.
    pub max_fanout: Option<u32>,
}

/// Every account's keys, by account.
#[derive(Debug, Default)]
pub struct Accounts {
    entries: Map<Entry>,
    /// Every key, by index, of the accounts holding several.
    several: Map<Arc<[HashKey]>>,
    /// The keys staged moves are switching, by account: few, and empty most of the time.
    switching: Map<Vec<Switch>>,
    /// The caps on a fanout raised by load, of the accounts that set one: few.
    caps: Map<u32>,
    /// When each of those switches: (switch_at, account, index).
    due: BTreeSet<(i64, AccountId, u32)>,
    /// Bumped whenever an account may have come, gone, or changed weight or fanout.
    changes: u64,
}

/// Why a change cannot apply: the log and memory disagree.
pub type Mismatch = String;

impl Accounts {
    pub fn with_capacity(count: usize) -> Self {
        Accounts {
            entries: Map::with_capacity_and_hasher(count, Default::default()),
            several: Map::default(),
            switching: Map::default(),
            caps: Map::default(),
            due: BTreeSet::new(),
            changes: 0,
        }
    }

    /// A count that moves whenever an account may have come, gone, or changed weight or
    /// fanout: what is computed from names and weights alone holds while it stays.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Number of accounts.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn held(&self, id: &str, e: &Entry) -> Held {
        let keys = if e.fanout == 1 {
            HashKeys::One(e.key)
        } else {
            HashKeys::Many(Arc::clone(&self.several[id]))
        };
        let switching = match self.switching.is_empty() {
            true => Vec::new(),
            false => self.switching.get(id).cloned().unwrap_or_default(),
        };
        let max_fanout = match self.caps.is_empty() {
            true => None,
            false => self.caps.get(id).copied(),
        };
        Held {
            keys,
            weight: u64::from(e.weight),
            created_at: e.created_at,
            switching,
            max_fanout,
        }
    }

    pub fn get(&self, id: &str) -> Option<Held> {
        self.entries.get(id).map(|e| self.held(id, e))
    }

    pub fn get_key_value(&self, id: &str) -> Option<(&AccountId, Held)> {
        let (id, e) = self.entries.get_key_value(id)?;
        Some((id, self.held(id.as_str(), e)))
    }

    /// Every account, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&AccountId, Held)> + '_ {
        self.entries
            .iter()
            .map(|(id, e)| (id, self.held(id.as_str(), e)))
    }

    /// The `n` accounts of most weight, heaviest first (ties by account id), with their
    /// keys: one pass over the accounts, keeping the best `n` seen.
    pub fn heaviest(&self, n: usize) -> Vec<(AccountId, Held)> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        // The heap's top is the worst of the best kept so far.
        let mut best = BinaryHeap::with_capacity(n + 1);
        for (id, e) in &self.entries {
            let rank = Reverse((e.weight, Reverse(id)));
            if best.len() < n {
                best.push(rank);
            } else if best.peek().is_some_and(|worst| rank < *worst) {
                best.pop();
                best.push(rank);
            }
        }
        best.into_sorted_vec()
            .into_iter()
            .map(|Reverse((_, Reverse(id)))| {
                (id.clone(), self.held(id.as_str(), &self.entries[id]))
            })
            .collect()
    }

    /// Every account with its weight and fanout, in no particular order: all that MD5 of
    /// the names needs, read without copying any account's keys.
    pub fn named(&self) -> impl Iterator<Item = (&AccountId, u64, u32)> + '_ {
        (self.entries.iter()).map(|(id, e)| (id, u64::from(e.weight), e.fanout))
    }

    /// Every account holding several keys, with its keys by index.
    pub fn several(&self) -> impl Iterator<Item = (&AccountId, &[HashKey])> + '_ {
        self.several.iter().map(|(id, keys)| (id, &keys[..]))
    }

    /// Files an account of one key.
    pub fn file_one(&mut self, id: AccountId, key: HashKey, weight: u64, created_at: i64) {
        self.changes += 1;
        let entry = Entry {
            key,
            weight: weight as u32,
            fanout: 1,
            created_at,
        };
        self.entries.insert(id, entry);
    }

    /// Files an account's keys, by index, as read from the table.
    pub fn file(&mut self, id: AccountId, keys: Vec<HashKey>, weight: u64, created_at: i64) {
        self.changes += 1;
        let entry = Entry {
            key: keys[0],
            weight: weight as u32,
            fanout: keys.len() as u32,
            created_at,
        };
        if keys.len() > 1 {
            self.several.insert(id.clone(), keys.into());
        }
        self.entries.insert(id, entry);
    }

    /// Key `index` of `id`, if it has one.
    pub fn key(&self, id: &str, index: u32) -> Option<HashKey> {
        let e = self.entries.get(id)?;
        match (e.fanout, index) {
            (1, 0) => Some(e.key),
            (1, _) => None,
            _ => self.several[id].get(index as usize).copied(),
        }
    }

    /// Adds key `index` of `weight`: a new account's key 0, or the next key of one.
    pub fn add(
        &mut self,
        id: AccountId,
        index: u32,
        key: HashKey,
        weight: u64,
        at: i64,
    ) -> Result<(), Mismatch> {
        if index == 0 {
            self.several.remove(id.as_str());
            self.file_one(id, key, weight, at);
            return Ok(());
        }
        let Some(held) = self.get(id.as_str()) else {
            return Err(format!("key {index} of {id}, which has none"));
        };
        let mut keys = held.keys.as_slice().to_vec();
        if keys.len() != index as usize {
            return Err(format!("key {index} of {id}, which has {}", keys.len()));
        }
        keys.push(key);
        self.file(id, keys, held.weight + weight, held.created_at);
        Ok(())
    }

    /// Releases key `index` of `weight`, the account's last one; key 0 releases the account.
    pub fn release(&mut self, id: &AccountId, index: u32, weight: u64) -> Result<(), Mismatch> {
        let Some(held) = self.get(id.as_str()) else {
            return Ok(());
        };
        let mut keys = held.keys.as_slice().to_vec();
        if keys.len() != index as usize + 1 {
            return Err(format!(
                "release of key {index} of {id}, which has {}",
                keys.len()
            ));
        }
        self.several.remove(id.as_str());
        if index == 0 {
            self.changes += 1;
            self.entries.remove(id.as_str());
            self.caps.remove(id.as_str());
        } else {
            keys.pop();
            self.file(id.clone(), keys, held.weight - weight, held.created_at);
        }
        Ok(())
    }

    /// Sets (or with `None` clears) the cap on `id`'s fanout raised by load.
    pub fn set_max_fanout(&mut self, id: &AccountId, max_fanout: Option<u32>) {
        match max_fanout {
            Some(cap) if self.entries.contains_key(id.as_str()) => {
                self.caps.insert(id.clone(), cap);
            }
            _ => {
                self.caps.remove(id.as_str());
            }
        }
    }

    /// Every account that set a cap on its fanout, with its fanout, weight and cap.
    pub fn capped(&self) -> Vec<(AccountId, u32, u64, u32)> {
        (self.caps.iter())
            .filter_map(|(id, &cap)| {
                let e = self.entries.get(id.as_str())?;
                Some((id.clone(), e.fanout, u64::from(e.weight), cap))
            })
            .collect()
    }

    /// Moves key `index` to `to`.
    pub fn move_key(&mut self, id: &AccountId, index: u32, to: HashKey) {
        let Some(held) = self.get(id.as_str()) else {
            return;
        };
        let mut keys = held.keys.as_slice().to_vec();
        if let Some(key) = keys.get_mut(index as usize) {
            *key = to;
        }
        self.file(id.clone(), keys, held.weight, held.created_at);
    }

    /// Records that key `switch.index` of `id` keeps its old value `switch.from` until
    /// `switch.switch_at` (the key must not be switching already: see
    /// [`Accounts::unstage`]).
    pub fn stage(&mut self, id: &AccountId, switch: Switch) {
        self.due
            .insert((switch.switch_at, id.clone(), switch.index));
        self.switching.entry(id.clone()).or_default().push(switch);
    }

    /// Forgets that key `index` of `id` is switching; answers the switch if it was.
    pub fn unstage(&mut self, id: &AccountId, index: u32) -> Option<Switch> {
        let switches = self.switching.get_mut(id.as_str())?;
        let at = switches.iter().position(|s| s.index == index)?;
        let switch = switches.swap_remove(at);
        if switches.is_empty() {
            self.switching.remove(id.as_str());
        }
        self.due.remove(&(switch.switch_at, id.clone(), index));
        Some(switch)
    }

    /// When the next switch is due, if any is pending.
    pub fn next_switch(&self) -> Option<i64> {
        self.due.first().map(|(at, ..)| *at)
    }

    /// Ends every switch due by `now`; answers them, so that their old keys are freed.
    pub fn end_switches(&mut self, now: i64) -> Vec<Switch> {
        let mut ended = Vec::new();
        while let Some((at, id, index)) = self.due.first().cloned() {
            if at > now {
                break;
            }
            ended.extend(self.unstage(&id, index));
        }
        ended
    }

    /// How many keys are switching (some perhaps due, not yet ended).
    pub fn switching(&self) -> usize {
        self.due.len()
    }

    /// How many keys switch after `now`.
    pub fn switching_after(&self, now: i64) -> usize {
        (self.due.iter().rev())
            .take_while(|(at, ..)| *at > now)
            .count()
    }

    /// Changes the account's weight by a key's change from `before` to `after`.
    pub fn reweight(&mut self, id: &str, before: u64, after: u64) {
        if let Some(e) = self.entries.get_mut(id) {
            e.weight = (u64::from(e.weight) - before + after) as u32;
            self.changes += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_of_one_key_takes_one_small_entry() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
    }

    #[test]
    fn the_heaviest_come_by_weight_then_by_name() {
        let mut accounts = Accounts::with_capacity(8);
        for (name, weight) in [("c", 5), ("a", 5), ("d", 1), ("b", 9), ("e", 5), ("f", 2)] {
            let id = AccountId::parse(name).unwrap();
            accounts.file_one(id, HashKey(u128::from(weight)), weight, 0);
        }
        let names = |n| -> Vec<String> {
            let top = accounts.heaviest(n);
            top.into_iter()
                .map(|(id, _)| id.as_str().to_owned())
                .collect()
        };
        assert_eq!(names(4), ["b", "a", "c", "e"]);
        assert_eq!(names(10), ["b", "a", "c", "e", "f", "d"]);
        assert!(names(0).is_empty());
        assert_eq!(accounts.heaviest(1)[0].1.weight, 9);
    }

    #[test]
    fn keys_come_and_go_from_the_top() {
        let id = AccountId::parse("a").unwrap();
        let mut accounts = Accounts::with_capacity(1);
        accounts.add(id.clone(), 0, HashKey(5), 2, 7).unwrap();
        accounts.add(id.clone(), 1, HashKey(9), 3, 8).unwrap();
        assert!(accounts.add(id.clone(), 3, HashKey(1), 1, 8).is_err());
        let held = accounts.get("a").unwrap();
        assert_eq!(held.keys.as_slice(), [HashKey(5), HashKey(9)]);
        assert_eq!((held.weight, held.created_at), (5, 7));
        accounts.move_key(&id, 0, HashKey(6));
        assert_eq!(accounts.key("a", 0), Some(HashKey(6)));
        assert!(accounts.release(&id, 0, 2).is_err(), "key 1 goes first");
        accounts.release(&id, 1, 3).unwrap();
        let held = accounts.get("a").unwrap();
        assert_eq!((held.keys, held.weight), (HashKeys::One(HashKey(6)), 2));
        assert_eq!(accounts.several().count(), 0);
        accounts.release(&id, 0, 2).unwrap();
        assert_eq!(accounts.len(), 0);
    }
}
