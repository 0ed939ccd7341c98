//! Reshard jobs (migration 0017 / 0021): what each job wants and how it stands, and the
//! claim of the replica driving it.

use super::{Actor, Result, Store, StoreError, Tx, decode_key};
use crate::keyspace::HashKey;

/// Where a reshard job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Running,
    Done,
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Option<JobState> {
        match text {
            "running" => Some(JobState::Running),
            "done" => Some(JobState::Done),
            "failed" => Some(JobState::Failed),
            _ => None,
        }
    }
}

/// A reshard job as committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReshardJob {
    /// Set by the database; ignored when a job is started.
    pub id: i64,
    pub stream: String,
    /// The open shards wanted.
    pub target: u32,
    /// Where they start, but the first (at 0), in key order: the split plan's cuts.
    pub starts: Vec<HashKey>,
    /// How long after the end the staged rebalance switches.
    pub switch_after_ms: i64,
    pub state: JobState,
    /// SplitShard / MergeShards calls made.
    pub done: u32,
    pub error: Option<String>,
    pub started_by: Actor,
    /// Unix milliseconds, by the database's clock.
    pub started_at: i64,
    pub updated_at: i64,
    /// The number Kinesis was to give the stream's next shard when the job started.
    pub first_shard: u64,
}

/// How a job stands after a look at the stream: what [`Tx::note_reshard`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobProgress {
    pub state: JobState,
    pub done: u32,
    pub error: Option<String>,
}

/// The job columns, in [`decode`]'s order.
const JOB: &str = "SELECT id, stream, target, starts, switch_after_ms, state, done, error, \
    started_by, started_at, updated_at, first_shard FROM reshard_jobs";

type JobTuple = (
    i64,
    String,
    i64,
    Vec<u8>,
    i64,
    String,
    i64,
    Option<String>,
    String,
    i64,
    i64,
    i64,
);

fn decode(row: JobTuple) -> Result<ReshardJob> {
    let (id, stream, target, starts, switch_after, state, done, error, by, started, updated, first) =
        row;
    let corrupt = |what: String| StoreError::Corrupt(format!("reshard job {id}: {what}"));
    Ok(ReshardJob {
        id,
        stream,
        target: u32::try_from(target).map_err(|_| corrupt(format!("target {target}")))?,
        starts: starts.chunks(16).map(decode_key).collect::<Result<_>>()?,
        switch_after_ms: switch_after,
        state: JobState::parse(&state).ok_or_else(|| corrupt(format!("state {state:?}")))?,
        done: u32::try_from(done).map_err(|_| corrupt(format!("done {done}")))?,
        error,
        started_by: Actor::new(&by),
        started_at: started,
        updated_at: updated,
        first_shard: u64::try_from(first).map_err(|_| corrupt(format!("first shard {first}")))?,
    })
}

/// The same statements on either backend, stamped out per sqlx database type.
macro_rules! reshard_queries {
    ($db:ty) => {
        use super::super::Result;
        use super::{JOB, JobProgress, JobTuple, ReshardJob, decode};

        type Conn = <$db as sqlx::Database>::Connection;

        pub async fn start(conn: &mut Conn, job: &ReshardJob) -> Result<i64> {
            Ok(sqlx::query_scalar(
                "INSERT INTO reshard_jobs (stream, target, starts, switch_after_ms, state, done, \
                 started_by, started_at, updated_at, first_shard) \
                 VALUES ($1, $2, $3, $4, 'running', 0, $5, $6, $6, $7) RETURNING id",
            )
            .bind(&job.stream)
            .bind(i64::from(job.target))
            .bind(
                job.starts
                    .iter()
                    .flat_map(|k| k.to_be_bytes())
                    .collect::<Vec<u8>>(),
            )
            .bind(job.switch_after_ms)
            .bind(job.started_by.as_str())
            .bind(job.started_at)
            .bind(job.first_shard as i64)
            .fetch_one(&mut *conn)
            .await?)
        }

        pub async fn latest(conn: &mut Conn, stream: &str) -> Result<Option<ReshardJob>> {
            let row: Option<JobTuple> =
                sqlx::query_as(&format!("{JOB} WHERE stream = $1 ORDER BY id DESC LIMIT 1"))
                    .bind(stream)
                    .fetch_optional(&mut *conn)
                    .await?;
            row.map(decode).transpose()
        }

        pub async fn runs_on(conn: &mut Conn, stream: &str) -> Result<bool> {
            let running: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM reshard_jobs WHERE stream = $1 AND state = 'running'",
            )
            .bind(stream)
            .fetch_optional(&mut *conn)
            .await?;
            Ok(running.is_some())
        }

        pub async fn running(conn: &mut Conn) -> Result<Vec<ReshardJob>> {
            let rows: Vec<JobTuple> =
                sqlx::query_as(&format!("{JOB} WHERE state = 'running' ORDER BY id"))
                    .fetch_all(&mut *conn)
                    .await?;
            rows.into_iter().map(decode).collect()
        }

        pub async fn claim(
            conn: &mut Conn,
            id: i64,
            holder: &str,
            now: i64,
            lease_ms: i64,
        ) -> Result<bool> {
            let done = sqlx::query(
                "UPDATE reshard_jobs SET holder = $2, held_until = $3 + $4 \
                 WHERE id = $1 AND state = 'running' AND (holder = $2 OR held_until <= $3)",
            )
            .bind(id)
            .bind(holder)
            .bind(now)
            .bind(lease_ms)
            .execute(&mut *conn)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        pub async fn note(
            conn: &mut Conn,
            id: i64,
            holder: &str,
            now: i64,
            progress: &JobProgress,
        ) -> Result<bool> {
            let done = sqlx::query(
                "UPDATE reshard_jobs SET state = $3, done = $4, error = $5, updated_at = $6 \
                 WHERE id = $1 AND holder = $2 AND state = 'running'",
            )
            .bind(id)
            .bind(holder)
            .bind(progress.state.as_str())
            .bind(i64::from(progress.done))
            .bind(progress.error.as_deref())
            .bind(now)
            .execute(&mut *conn)
            .await?;
            Ok(done.rows_affected() == 1)
        }
    };
}

mod sqlite {
    use sqlx::Sqlite;
    reshard_queries!(Sqlite);
}

mod postgres {
    use sqlx::Postgres;
    reshard_queries!(Postgres);
}

/// Runs `$call` on this transaction's backend, reporting to SQLite's health.
macro_rules! in_job_tx {
    ($tx:expr, $call:ident($($arg:expr),*)) => {
        match $tx {
            Tx::Sqlite(tx, health) => {
                let done = sqlite::$call(tx, $($arg),*).await;
                health.observe(&done);
                done
            }
            Tx::Postgres(tx) => postgres::$call(tx, $($arg),*).await,
        }
    };
}

impl Tx {
    /// Starts `job` (its id, state, progress and `updated_at` are the database's); a
    /// running job on the same stream makes it fail with [`StoreError::Conflict`].
    pub async fn start_reshard(&mut self, job: &ReshardJob) -> Result<i64> {
        in_job_tx!(self, start(job))
    }

    /// Whether a job of `stream` is running.
    pub async fn reshard_runs_on(&mut self, stream: &str) -> Result<bool> {
        in_job_tx!(self, runs_on(stream))
    }

    /// Takes job `id` for `holder` until `now + lease_ms` (Unix ms, the database's clock),
    /// or renews it: `false` while another holder's claim runs, or once the job has ended.
    pub async fn claim_reshard(
        &mut self,
        id: i64,
        holder: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<bool> {
        in_job_tx!(self, claim(id, holder, now, lease_ms))
    }

    /// Writes how running job `id` stands, if `holder` still holds it: `false` if not.
    pub async fn note_reshard(
        &mut self,
        id: i64,
        holder: &str,
        now: i64,
        progress: &JobProgress,
    ) -> Result<bool> {
        in_job_tx!(self, note(id, holder, now, progress))
    }
}

impl Store {
    /// The newest job of `stream`, if it ever had one.
    pub async fn latest_reshard(&self, stream: &str) -> Result<Option<ReshardJob>> {
        on_backend!(self, c => latest(stream))
    }

    /// Every running job, oldest first.
    pub async fn running_reshards(&self) -> Result<Vec<ReshardJob>> {
        on_backend!(self, c => running())
    }
}
