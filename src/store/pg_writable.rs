//! Connections to a Postgres server that takes no writes (a demoted primary, a standby, a
//! server shutting down) are never lent again: once a statement meets one, every
//! connection opened before is retired from the pool, and the pool opens new ones, which
//! reach whatever server the database's address names now.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgDatabaseError;

/// SQLSTATE of a write refused in a read-only transaction: a standby's (in recovery), or a
/// session's whose `default_transaction_read_only` is on.
const READ_ONLY: &str = "25006";

/// The clock [`MET_AT`] counts from.
static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);

/// When a statement last met a server that takes no writes, in nanoseconds since [`BASE`]
/// (0: never). One process serves one database, and a failover ends every connection to
/// its old primary: one clock for every pool.
static MET_AT: AtomicU64 = AtomicU64::new(0);

/// Notes `err` if it says the server takes no writes now: a read-only transaction, or the
/// server shutting down, crashed or still starting (class 57P).
pub fn note(err: &sqlx::Error) {
    if code(err).is_some_and(|code| code == READ_ONLY || code.starts_with("57P")) {
        met_now();
    }
}

/// Whether `err` is a write refused in a read-only transaction.
pub fn read_only(err: &sqlx::Error) -> bool {
    code(err) == Some(READ_ONLY)
}

/// The SQLSTATE of a Postgres error.
fn code(err: &sqlx::Error) -> Option<&str> {
    match err {
        sqlx::Error::Database(db) => Some(db.try_downcast_ref::<PgDatabaseError>()?.code()),
        _ => None,
    }
}

/// A connection found the server taking no writes: retires every connection open now.
pub fn met_now() {
    let now = BASE.elapsed().as_nanos() as u64;
    MET_AT.fetch_max(now.max(1), Ordering::AcqRel);
}

/// Whether a pooled connection `age` old was opened before a statement last met a server
/// that takes no writes, and so must not be lent again.
pub fn retired(age: Duration) -> bool {
    let at = MET_AT.load(Ordering::Acquire);
    at != 0 && age >= BASE.elapsed().saturating_sub(Duration::from_nanos(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_opened_before_a_refusal_are_retired_and_later_ones_are_not() {
        let before = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        met_now();
        std::thread::sleep(Duration::from_millis(2));
        let after = Instant::now();
        assert!(retired(before.elapsed()));
        assert!(!retired(after.elapsed()));
    }
}
