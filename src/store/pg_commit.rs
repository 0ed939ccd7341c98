//! A Postgres write transaction and its COMMIT, which is never cut short by a timer: once
//! sent, its result is waited for while the connection it went on lives, so the answer a
//! client gets is what the database did. Only a COMMIT whose result cannot be known any
//! more (the connection lost, or the session gone from the server) fails, as
//! [`StoreError::OutcomeUnknown`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgDatabaseError};
use sqlx::{Connection as _, Postgres, Transaction};
use tokio::time::Instant;

use super::{Result, StoreError};

/// A write transaction, with what it takes to tell whether its session still lives.
pub struct PgTx {
    tx: Transaction<'static, Postgres>,
    /// The backend process serving the transaction, when known.
    pid: Option<i32>,
    /// How to reach the database on a connection of its own, to ask after the session.
    options: Arc<PgConnectOptions>,
}

impl PgTx {
    pub fn new(
        tx: Transaction<'static, Postgres>,
        pid: Option<i32>,
        options: Arc<PgConnectOptions>,
    ) -> PgTx {
        PgTx { tx, pid, options }
    }

    /// Commits, waiting for the result as long as the session lives (see [`settled`]).
    pub async fn commit(self) -> Result<()> {
        let PgTx { tx, pid, options } = self;
        settled(tx.commit(), pid, &options).await
    }
}

impl std::ops::Deref for PgTx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

/// How long a COMMIT is waited for before the database is asked whether its session
/// lives; and how often after that.
const PROBE_EVERY: Duration = Duration::from_secs(2);

/// How long the database may go without answering any probe before a COMMIT's result is
/// given up as unknowable: the server itself gives up on a silent client after this long
/// (`tcp_user_timeout`, see `postgres::session_settings`).
const LIVENESS: Duration = Duration::from_secs(20);

/// How long one probe may take, connecting included.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits for `commit` (a COMMIT, or a statement that commits by itself) to answer.
///
/// No timer ends the wait: a COMMIT held up by a synchronous standby, or a busy server,
/// is waited for, since cutting it short cannot undo it. While it takes longer than
/// [`PROBE_EVERY`], the database is asked on a connection of its own whether the session
/// (`pid`) still lives; the result is unknowable, and [`StoreError::OutcomeUnknown`]
/// answered, once that session is gone, or once no probe has been answered for
/// [`LIVENESS`] (a cut network, a frozen host). A connection lost inside the COMMIT is
/// unknowable too; an error the database answered (an ERROR, not a FATAL) rolled the
/// transaction back.
pub async fn settled<T>(
    commit: impl Future<Output = Result<T, sqlx::Error>>,
    pid: Option<i32>,
    options: &PgConnectOptions,
) -> Result<T> {
    tokio::pin!(commit);
    let mut alive_at = Instant::now();
    loop {
        if let Ok(done) = tokio::time::timeout(PROBE_EVERY, &mut commit).await {
            return done.map_err(classify);
        }
        match probe(options, pid).await {
            Some(true) => alive_at = Instant::now(),
            Some(false) => {
                return Err(StoreError::OutcomeUnknown(
                    "the session that sent the COMMIT is gone from the server".into(),
                ));
            }
            None if alive_at.elapsed() >= LIVENESS => {
                return Err(StoreError::OutcomeUnknown(format!(
                    "no answer from the database for {} s while a COMMIT was under way",
                    LIVENESS.as_secs()
                )));
            }
            None => {}
        }
    }
}

/// A COMMIT's failure: rolled back when the database answered an ERROR; unknowable when
/// the connection broke, or the session ended (FATAL, PANIC: a terminated backend, a
/// server shutting down), since that may come after the commit was made.
fn classify(err: sqlx::Error) -> StoreError {
    let ended = match &err {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<PgDatabaseError>()
            .is_none_or(|pg| !matches!(pg.severity(), sqlx::postgres::PgSeverity::Error)),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    if ended {
        StoreError::OutcomeUnknown(format!("the connection failed during a COMMIT: {err}"))
    } else {
        err.into()
    }
}

/// Asks the database, on a connection of its own, whether backend `pid` is still there:
/// `Some(false)` when it is gone, `None` when the database did not answer in time. Without
/// a pid, an answer at all counts as alive.
async fn probe(options: &PgConnectOptions, pid: Option<i32>) -> Option<bool> {
    let ask = async {
        let mut conn = PgConnection::connect_with(options).await.ok()?;
        let alive = match pid {
            Some(pid) => sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)",
            )
            .bind(pid)
            .fetch_one(&mut conn)
            .await
            .ok()?,
            None => {
                sqlx::query("SELECT 1").execute(&mut conn).await.ok()?;
                true
            }
        };
        let _ = conn.close().await;
        Some(alive)
    };
    tokio::time::timeout(PROBE_TIMEOUT, ask)
        .await
        .ok()
        .flatten()
}
