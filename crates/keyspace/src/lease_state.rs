//! A lease's state between assignments: who holds it, who gets it next, and which shards
//! may be leased at all.
//!
//! Pure, like [`leases`](super::leases): the assignment says where each lease should be;
//! this module takes a lease there without ever letting two live workers hold it. A lease
//! taken from a live worker is first *revoking* (still the old owner's, who is told to
//! stop); it passes to the new owner, with its epoch raised, only once the old owner has
//! been told and heartbeats again, or leaves, or expires.

use super::HashKey;

/// What a consumer must read of one shard: open shards, and closed ones until they are read
/// to their end.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseShard {
    pub id: String,
    pub start: HashKey,
    pub end: HashKey,
    /// `ParentShardId` and `AdjacentParentShardId`, when list-shards named them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
    /// Closed by a split or a merge: it takes no new records.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closed: bool,
}

/// The checkpoint of a closed shard read to its end.
pub const SHARD_END: &str = "SHARD_END";

/// Who holds a lease. `W` names workers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder<W> {
    /// The worker reading the shard, if any.
    pub owner: Option<W>,
    /// The worker the lease is going to; while set, the owner is revoking it.
    pub next: Option<W>,
    /// Whether the owner has been answered `revoking` since `next` was set.
    pub told: bool,
    /// Raised each time the lease passes to an owner: checkpoints must name the current one.
    pub epoch: u64,
}

/// How a lease stands for its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderState {
    Held,
    Revoking,
}

impl<W: Clone + PartialEq> Holder<W> {
    /// Where the lease stands in the assignment: with the worker it is going to, if any.
    pub fn assigned(&self) -> Option<&W> {
        self.next.as_ref().or(self.owner.as_ref())
    }

    /// The owner's view, when there is one.
    pub fn state(&self) -> Option<HolderState> {
        self.owner.as_ref().map(|_| match self.next {
            Some(_) => HolderState::Revoking,
            None => HolderState::Held,
        })
    }

    /// The lease on its way to `target`. From an owner that is live it is revoked (or the
    /// revocation called off, when `target` is the owner again); otherwise nobody is
    /// reading it, so it passes at once with the epoch raised.
    pub fn toward(&self, target: Option<W>, live: impl Fn(&W) -> bool) -> Holder<W> {
        match &self.owner {
            Some(owner) if live(owner) => {
                if target.as_ref() == Some(owner) || target.is_none() {
                    // None: no live worker is left but the owner is; keep it reading.
                    Holder {
                        next: None,
                        told: false,
                        ..self.clone()
                    }
                } else {
                    Holder {
                        told: self.told && self.next.is_some(),
                        next: target,
                        ..self.clone()
                    }
                }
            }
            _ => self.pass(target),
        }
    }

    /// The lease given to `to` (or to nobody), its epoch raised when it gets a new owner.
    pub fn pass(&self, to: Option<W>) -> Holder<W> {
        let epoch = if to.is_some() && to != self.owner {
            self.epoch + 1
        } else {
            self.epoch
        };
        Holder {
            owner: to,
            next: None,
            told: false,
            epoch,
        }
    }

    /// The owner heartbeats: a revocation it was already told of completes (the lease
    /// passes to `next`); one it was not told of is told now.
    pub fn owner_heartbeats(&self) -> Holder<W> {
        match (&self.next, self.told) {
            (Some(next), true) => self.pass(Some(next.clone())),
            (Some(_), false) => Holder {
                told: true,
                ..self.clone()
            },
            (None, _) => self.clone(),
        }
    }
}

/// Which shards may be leased, given which are read to their end (`done`): every shard not
/// done whose parents that are still listed are all done (Kinesis' order across a split or
/// a merge: a child's records follow its parents').
pub fn leasable(shards: &[LeaseShard], done: impl Fn(&str) -> bool) -> Vec<bool> {
    let listed: std::collections::HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
    shards
        .iter()
        .map(|s| {
            !done(&s.id)
                && s.parents
                    .iter()
                    .all(|p| !listed.contains(p.as_str()) || done(p))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(owner: &str, epoch: u64) -> Holder<&str> {
        Holder {
            owner: Some(owner),
            next: None,
            told: false,
            epoch,
        }
    }

    #[test]
    fn a_live_owner_is_told_before_the_lease_passes() {
        let all_live = |_: &&str| true;
        let revoking = held("a", 3).toward(Some("b"), all_live);
        assert_eq!(revoking.state(), Some(HolderState::Revoking));
        assert_eq!((revoking.owner, revoking.epoch), (Some("a"), 3));
        let told = revoking.owner_heartbeats();
        assert_eq!(told.owner, Some("a"), "told, not yet passed");
        assert!(told.told);
        // Assigning again while told changes nothing.
        assert_eq!(told.toward(Some("b"), all_live), told);
        let passed = told.owner_heartbeats();
        assert_eq!(passed, held("b", 4));
    }

    #[test]
    fn a_revocation_can_be_called_off_or_redirected() {
        let all_live = |_: &&str| true;
        let told = held("a", 3).toward(Some("b"), all_live).owner_heartbeats();
        assert_eq!(told.toward(Some("a"), all_live), held("a", 3));
        let redirected = told.toward(Some("c"), all_live);
        assert_eq!((redirected.next, redirected.told), (Some("c"), true));
    }

    #[test]
    fn a_lease_nobody_live_reads_passes_at_once() {
        let only_b = |w: &&str| *w == "b";
        assert_eq!(held("a", 3).toward(Some("b"), only_b), held("b", 4));
        let revoking = held("a", 3).toward(Some("c"), |_| true);
        assert_eq!(revoking.toward(Some("b"), only_b), held("b", 4));
        let free: Holder<&str> = Holder::default();
        assert_eq!(free.toward(Some("b"), only_b), held("b", 1));
        assert_eq!(held("a", 3).toward(None, |_| false).owner, None);
    }

    #[test]
    fn children_wait_for_every_listed_parent() {
        let shard = |id: &str, parents: &[&str]| LeaseShard {
            id: id.into(),
            start: HashKey(0),
            end: HashKey(0),
            parents: parents.iter().map(|p| p.to_string()).collect(),
            closed: false,
        };
        let shards = [
            shard("p", &[]),
            shard("q", &[]),
            shard("merged", &["p", "q"]),
            shard("orphan", &["trimmed"]),
        ];
        assert_eq!(
            leasable(&shards, |_| false),
            [true, true, false, true],
            "a parent no longer listed does not hold its child back"
        );
        assert_eq!(leasable(&shards, |s| s == "p"), [false, true, false, true]);
        assert_eq!(
            leasable(&shards, |s| s == "p" || s == "q"),
            [false, false, true, true]
        );
    }
}
