//! Shard-aware allocation: with a primary stream, a new key goes to its open shard of least
//! weight, and inside it to the key the balanced walk picks within that shard's range.

use std::collections::BTreeSet;

use super::HashKey;
use super::shards::ShardMap;
use super::tree::Load;

/// Per-shard loads of one map, kept ordered so the lightest shard is found in O(log S).
#[derive(Debug, Clone)]
pub struct ShardBalance {
    map: ShardMap,
    loads: Vec<Load>,
    /// `(weight, count, index)`: lightest first, then emptiest, then leftmost.
    order: BTreeSet<(u64, u64, usize)>,
}

impl ShardBalance {
    /// Balances on `map`, whose shards currently carry `loads`.
    pub fn new(map: ShardMap, loads: Vec<Load>) -> Self {
        let order = loads
            .iter()
            .enumerate()
            .map(|(i, l)| (l.weight, l.count, i))
            .collect();
        ShardBalance { map, loads, order }
    }

    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    /// Shards from lightest to heaviest, as `(index, start, end)`.
    pub fn lightest_first(&self) -> impl Iterator<Item = (usize, HashKey, HashKey)> + '_ {
        self.order.iter().map(|(_, _, i)| {
            let shard = self.map.shard(*i);
            (*i, shard.start, shard.end)
        })
    }

    /// Records a key of `weight` arriving or leaving.
    pub fn record(&mut self, key: HashKey, weight: u64, arriving: bool) {
        let i = self.map.index_of(key);
        let load = &mut self.loads[i];
        self.order.remove(&(load.weight, load.count, i));
        *load = if arriving {
            *load + Load::one(weight)
        } else {
            *load - Load::one(weight)
        };
        self.order.insert((load.weight, load.count, i));
    }
}
