//! The database's clock, as this replica reads it without a round trip: its own clock plus
//! the offset last measured. What a change logs (`at`, `created_at`) is by the database's
//! clock, so a replica whose clock runs ahead logs nothing in the future; which keys a
//! decision may free is still read from the database itself (see `decision_time`).

use std::sync::atomic::{AtomicI64, Ordering};

use super::{Error, Registry, now_ms};
use crate::store::Tx;

/// The database's clock minus this host's, in milliseconds, as last measured.
#[derive(Debug, Default)]
pub(super) struct Offset(AtomicI64);

impl Offset {
    /// Notes a reading `db` of the database's clock taken between `before` and `after` by
    /// this host's (Unix ms): the middle is when it was read.
    fn note(&self, before: i64, db: i64, after: i64) {
        self.0.store(db - (before + after) / 2, Ordering::Relaxed);
    }

    /// The database's clock now, by this host's and the offset.
    pub(super) fn now(&self) -> i64 {
        now_ms() + self.0.load(Ordering::Relaxed)
    }
}

impl Registry {
    /// Reads the database's clock (Unix ms), and measures the offset by it.
    pub(super) async fn db_clock(&self) -> Result<i64, Error> {
        let before = now_ms();
        let db = self.store.clock_ms().await?;
        self.offset.note(before, db, now_ms());
        Ok(db)
    }

    /// [`Registry::db_clock`] inside a write transaction.
    pub(super) async fn tx_clock(&self, tx: &mut Tx) -> Result<i64, Error> {
        let before = now_ms();
        let db = tx.clock_ms().await?;
        self.offset.note(before, db, now_ms());
        Ok(db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_at_the_middle_of_the_reading() {
        let offset = Offset::default();
        offset.note(1_000, 4_010, 1_020);
        assert_eq!(offset.0.load(Ordering::Relaxed), 3_000);
        let now = offset.now();
        assert!((now - now_ms() - 3_000).abs() <= 1, "{now}");
    }
}
