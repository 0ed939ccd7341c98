//! What a replica may answer from memory. A released key may be given out again at once, so
//! a table is only as good as its last look at the log: a replica that has not looked for
//! longer than [`VOUCH`] (it was paused, say, or starved) looks again before it answers a
//! lookup. If the database cannot be read, nobody can change it either (or, cut off alone,
//! this replica cannot tell): memory is answered for up to the lookups' max-age since the
//! last look, as a producer's mirror does, and after that the lookup is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Error, Registry};

/// How old a look at the log may be for a lookup to be answered without another: four
/// follower polls, so a replica that follows normally never waits.
pub const VOUCH: Duration = Duration::from_secs(1);

/// Longest a lookup waits for a look at the log before it falls back on memory.
const LOOK_WAIT: Duration = Duration::from_secs(1);

/// When this replica last read the log to its end, as milliseconds since `base`.
#[derive(Debug)]
pub(super) struct Synced {
    base: Instant,
    /// When the last successful read of the log started, in milliseconds since `base`.
    at_ms: AtomicU64,
    /// One look at a time: lookups that find the table too old share the next one.
    looking: tokio::sync::Mutex<()>,
}

impl Synced {
    pub(super) fn new() -> Synced {
        Synced {
            base: Instant::now(),
            at_ms: AtomicU64::new(0),
            looking: tokio::sync::Mutex::new(()),
        }
    }

    /// Records a read of the log to its end that started at `started`.
    pub(super) fn note(&self, started: Instant) {
        let ms = started.saturating_duration_since(self.base).as_millis() as u64;
        self.at_ms.fetch_max(ms, Ordering::Release);
    }

    /// How long ago the last read of the log to its end started.
    pub(super) fn age(&self) -> Duration {
        let at = Duration::from_millis(self.at_ms.load(Ordering::Acquire));
        self.base.elapsed().saturating_sub(at)
    }
}

impl Registry {
    /// Whether memory may answer a lookup now: at once when the log was read within
    /// [`VOUCH`]; else after reading it again; else, when the database cannot be read in
    /// time, while the last read is within `max_age` ([`Error::Stale`] past it).
    pub async fn vouch(&self, max_age: Duration) -> Result<(), Error> {
        if self.synced.age() <= VOUCH {
            return Ok(());
        }
        let _looking = self.synced.looking.lock().await;
        if self.synced.age() <= VOUCH {
            return Ok(());
        }
        let looked = tokio::time::timeout(LOOK_WAIT, self.look()).await;
        if matches!(looked, Ok(Ok(()))) {
            return Ok(());
        }
        let age = self.synced.age();
        if age <= max_age {
            return Ok(());
        }
        Err(Error::Stale {
            age_s: age.as_secs(),
        })
    }

    /// Reads the log to its end and applies it, now.
    async fn look(&self) -> Result<(), Error> {
        self.catch_up(None).await.map(drop)
    }
}
