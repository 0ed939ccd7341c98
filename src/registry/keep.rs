//! Idempotency-Keys: a change sent with one keeps its answer, rendered before COMMIT, in its
//! own transaction, so a repeat of the request is answered the same without being applied
//! again; and no answer is kept unless the change it tells of was committed with it.

use std::any::Any;
use std::sync::OnceLock;

use super::{Error, Ticket};
use crate::store::{Actor, Kept, Tx};

/// How long a kept answer is replayed.
pub const KEPT_FOR_MS: i64 = 24 * 3600 * 1000;

/// A request's Idempotency-Key, and how its answer is told.
pub struct Keep {
    pub key: String,
    /// SHA-256 of the request's method, path and body: "the same request".
    pub fingerprint: [u8; 32],
    /// Renders the change's answer as its client is told it (`None` for an answer that is
    /// not kept: a refusal for the moment, 503 or 504...), given by the route once it knows
    /// what its change answers: `Result<&A, &Error>` for that `A`.
    render: OnceLock<Render>,
}

type Render = Box<dyn Fn(Result<&dyn Any, &Error>) -> Option<Kept> + Send + Sync>;

impl std::fmt::Debug for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keep").field("key", &self.key).finish()
    }
}

impl Keep {
    pub fn new(key: String, fingerprint: [u8; 32]) -> Keep {
        Keep {
            key,
            fingerprint,
            render: OnceLock::new(),
        }
    }

    /// Tells how an answer of the change, `A` or an error, is rendered (once).
    pub fn render_by<A: 'static>(
        &self,
        render: impl Fn(Result<&A, &Error>) -> Option<Kept> + Send + Sync + 'static,
    ) {
        let _ = self.render.set(Box::new(move |answer| match answer {
            Ok(any) => {
                let answer = any.downcast_ref::<A>();
                debug_assert!(answer.is_some(), "a change answered another type");
                answer.and_then(|a| render(Ok(a)))
            }
            Err(err) => render(Err(err)),
        }));
    }

    /// `answer` as its client is told it, if it is kept, with this request's fingerprint.
    fn render<A: 'static>(&self, answer: Result<&A, &Error>) -> Option<Kept> {
        let answer = answer.map(|a| a as &dyn Any);
        let mut kept = (self.render.get()?)(answer)?;
        kept.fingerprint = self.fingerprint;
        Some(kept)
    }
}

impl super::Registry {
    /// The answer kept for `by`'s Idempotency-Key `key` within the last 24 h (`since` is
    /// 24 h ago, in Unix ms), from the database: any replica replays it.
    pub async fn kept(&self, by: &Actor, key: &str, since: i64) -> Result<Option<Kept>, Error> {
        Ok(self.store.kept(by, key, since).await?)
    }

    /// Keeps `kept` for `by`'s key `key` on its own: an answer decided without a change.
    /// A key already kept (another request with it answered first) stays as it is.
    pub async fn keep_alone(&self, by: &Actor, key: &str, kept: &Kept) -> Result<(), Error> {
        let at = self.store.clock_ms().await?;
        self.store.keep_alone(by, key, kept, at).await?;
        Ok(())
    }

    /// Forgets kept answers older than 24 h, and each actor's oldest past the bounds, every
    /// `interval`, until the process ends. Every replica may run it: it only deletes.
    pub fn forget_kept(self: &std::sync::Arc<Self>, interval: std::time::Duration) {
        let this = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(this) = this.upgrade() else {
                    return;
                };
                let forgotten = async {
                    let now = this.store.clock_ms().await?;
                    let before = now - KEPT_FOR_MS;
                    (this.store)
                        .forget_kept(before, KEPT_PER_ACTOR, KEPT_BYTES_PER_ACTOR)
                        .await
                };
                match forgotten.await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(forgotten = n, "forgot kept answers"),
                    Err(err) => tracing::warn!(%err, "cannot forget kept answers; later"),
                }
            }
        });
    }
}

/// Most answers kept per actor: one busy client cannot grow the table without bound (the
/// oldest go first, at the next sweep).
pub const KEPT_PER_ACTOR: i64 = 100_000;

/// Most bytes of answers kept per actor (a batch's answer runs to megabytes).
pub const KEPT_BYTES_PER_ACTOR: i64 = 256 * 1024 * 1024;

impl Ticket {
    /// Keeps the answer `answer` for the ticket's Idempotency-Key (if its request sent one)
    /// in `tx`, the change's own transaction, as `by`'s, at `at`. Refused with
    /// [`Error::KeyInUse`] when another request with the key committed first.
    pub(super) async fn keep_in<A: 'static>(
        &self,
        tx: &mut Tx,
        by: &Actor,
        answer: Result<&A, &Error>,
        at: i64,
    ) -> Result<(), Error> {
        let Some(keep) = self.keep() else {
            return Ok(());
        };
        let Some(kept) = keep.render(answer) else {
            return Ok(());
        };
        if !tx.keep(by, &keep.key, &kept, at).await? {
            return Err(Error::KeyInUse);
        }
        self.note_kept();
        Ok(())
    }
}
