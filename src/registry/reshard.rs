//! Reshards keyspread carries out. A job lives in the database and says what is wanted;
//! one replica at a time drives it (a claim with a lease), making one SplitShard or
//! MergeShards call at a time, each worked out from a fresh DescribeStreamSummary (ACTIVE)
//! and ListShards just before it is made. A replica killed mid-job leaves it to another, or
//! to itself restarted, which goes on from the stream's real state: no call is made twice
//! and no closed shard is named. At the end the stream's map is registered and, on the
//! primary stream, one rebalance is applied, staged, its moves saying `reason: reshard`.

use std::sync::Arc;
use std::time::Duration;

use super::{Committed, Error, Registry, Source, Stream, StreamMap, Ticket, detached};
use crate::keyspace::{self, Reshard, calls_since, calls_to};
use crate::kinesis::{Kinesis, KinesisError, KinesisLink, StreamStatus};
use crate::store::{
    Actor, JobProgress, JobState, KinesisStream, MoveReason, ReshardJob, StoreError,
};

/// How often each replica looks for a running job to drive (or a job it drives is looked
/// at again while its stream is not ACTIVE).
const JOB_POLL: Duration = Duration::from_secs(1);

/// A job as it is answered: the job, its calls (those made, then those still to make,
/// worked out from the stream's map as keyspread last registered it), and that map's open
/// shard count.
#[derive(Debug, Clone)]
pub struct ReshardView {
    pub job: ReshardJob,
    pub steps: Vec<Reshard>,
    pub open_shards: usize,
}

/// Why a reshard was refused, or cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum ReshardError {
    #[error(transparent)]
    Registry(#[from] Error),
    #[error(transparent)]
    Kinesis(#[from] KinesisError),
    #[error(
        "stream {0:?} is not watched: keyspread reshards only streams whose shards it lists \
         itself (PUT /streams/{0} with {{\"watch\": true}})"
    )]
    NotWatched(String),
    #[error(
        "stream {0:?} is in on-demand capacity mode: Kinesis sizes it itself and refuses \
         SplitShard and MergeShards (switch it to provisioned mode to reshard it)"
    )]
    OnDemand(String),
    #[error(
        "{target} open shards for stream {stream:?} would pass the account's shard limit of \
         {limit}: the account has {open} open shards, {current} of them this stream's, so \
         this stream can have at most {most}; ask AWS for a higher limit, or a smaller target"
    )]
    ShardLimit {
        stream: String,
        target: u32,
        current: u32,
        open: u32,
        limit: u32,
        most: u32,
    },
    #[error(
        "stream {stream:?} is being resharded already (job {id}): one job runs per stream; \
         GET /streams/{stream}/reshard follows it"
    )]
    Running { stream: String, id: i64 },
}

impl ReshardError {
    /// Whether a job meeting this may go on later (Kinesis or the database away, throttled,
    /// the stream busy), rather than end `failed`.
    fn passing(&self) -> bool {
        match self {
            ReshardError::Kinesis(e) => !matches!(
                e,
                KinesisError::NotFound(_) | KinesisError::LimitExceeded(_) | KinesisError::Other(_)
            ),
            ReshardError::Registry(e) => !matches!(
                e,
                Error::UnknownStream(_) | Error::Keyspace(_) | Error::SchemaNewer { .. }
            ),
            _ => false,
        }
    }
}

/// What a look at a job did.
enum Step {
    /// Made a call; the next look waits for the stream to be ACTIVE again.
    Made,
    /// The stream is not ACTIVE yet: look again later.
    Waiting,
    /// Another replica holds the job.
    Elsewhere,
    /// The job ended.
    Ended(JobState),
}

impl Registry {
    /// Starts resharding watched stream `name` to `target` open shards, refusing what
    /// Kinesis would refuse (on-demand mode, a target past the account's shard limit when
    /// DescribeLimits can say); an unwatched stream is refused before Kinesis is asked. The split plan is made over the stream's live shards and the
    /// keys held now; the moves of the rebalance at the end switch `switch_after_ms` after
    /// it. Answers the job, kept for the ticket's Idempotency-Key with it.
    pub async fn start_reshard(
        self: &Arc<Self>,
        link: &KinesisLink,
        name: String,
        target: u32,
        switch_after_ms: i64,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<ReshardView, ReshardError> {
        let stream = self
            .stream(&name)
            .ok_or_else(|| Error::UnknownStream(name.clone()))?;
        if !watched(&stream) {
            return Err(ReshardError::NotWatched(name));
        }
        let kinesis = link.client().await?;
        if kinesis.summary(&name).await?.on_demand {
            return Err(ReshardError::OnDemand(name));
        }
        let listing = kinesis.list_shards(&name, self.keyspace).await?.map;
        let current = listing.map.len() as u32;
        if let Some(limits) = kinesis.shard_limit().await? {
            let others = limits.open_shards.saturating_sub(current);
            let most = limits.shard_limit.saturating_sub(others);
            if target > current && target > most {
                return Err(ReshardError::ShardLimit {
                    stream: name,
                    target,
                    current,
                    open: limits.open_shards,
                    limit: limits.shard_limit,
                    most,
                });
            }
        }
        let this = Arc::clone(self);
        let next = listing.next_shard;
        let (map, plan) = tokio::task::spawn_blocking(move || {
            let keys = this.keys();
            let plan =
                keyspace::split_plan(this.keyspace, &listing.map, next, &keys, target as usize);
            (listing.map, plan)
        })
        .await
        .expect("split plans do not panic");
        let plan = plan.map_err(Error::from)?;
        let job = ReshardJob {
            id: 0,
            stream: name,
            target,
            starts: plan.shards.iter().skip(1).map(|(s, _)| s.start).collect(),
            switch_after_ms,
            state: JobState::Running,
            done: 0,
            error: None,
            started_by: actor.clone(),
            started_at: 0,
            updated_at: 0,
            first_shard: next,
        };
        let view = ReshardView {
            job,
            steps: plan.operations,
            open_shards: map.len(),
        };
        let (this, actor, ticket) = (Arc::clone(self), actor.clone(), ticket.clone());
        let started = detached(async move {
            let mut w = this.writer.lock().await;
            if !ticket.wanted() {
                return Err(Error::NotMade.into());
            }
            let (mut tx, at) = this.begin(&mut w).await?;
            let mut view = view;
            (view.job.started_at, view.job.updated_at) = (at, at);
            view.job.id = match tx.start_reshard(&view.job).await {
                Ok(id) => id,
                Err(StoreError::Conflict) => {
                    let stream = view.job.stream;
                    let running = this.store.latest_reshard(&stream).await;
                    let id = running.ok().flatten().map_or(0, |job| job.id);
                    return Err(ReshardError::Running { stream, id });
                }
                Err(err) => return Err(Error::from(err).into()),
            };
            ticket.keep_in(&mut tx, &actor, Ok(&view), at).await?;
            this.commit(&mut w, tx, Committed::Moves(0), &[&ticket])
                .await?;
            Ok(view)
        })
        .await?;
        self.reshard_wake.notify_one();
        Ok(started)
    }

    /// Stream `name`'s newest reshard job, if it ever had one: its calls made, as the
    /// lineage of the map keyspread registered shows them, then (while it runs) those still
    /// to make from that map.
    pub async fn reshard(&self, name: &str) -> Result<Option<ReshardView>, Error> {
        let Some(job) = self.store.latest_reshard(name).await? else {
            return Ok(None);
        };
        let Some(stream) = self.stream(name) else {
            let steps = Vec::new();
            return Ok(Some(ReshardView {
                job,
                steps,
                open_shards: 0,
            }));
        };
        let mut steps = calls_since(&stream.lease_shards, job.first_shard);
        if job.state == JobState::Running {
            steps.extend(calls_to(&stream.map, stream.next_shard, &job.starts)?.0);
        }
        Ok(Some(ReshardView {
            job,
            steps,
            open_shards: stream.map.len(),
        }))
    }

    /// Drives running reshard jobs until the process ends: every [`JOB_POLL`] (or at once
    /// when one starts here), each running job not held by another replica is claimed for
    /// `lease` and taken as far as it goes now.
    pub fn drive_reshards(
        self: &Arc<Self>,
        kinesis: Arc<KinesisLink>,
        lease: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        let holder = uuid::Uuid::new_v4().to_string();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(JOB_POLL) => {}
                    () = this.reshard_wake.notified() => {}
                }
                let jobs = match this.store.running_reshards().await {
                    Ok(jobs) => jobs,
                    Err(err) => {
                        tracing::warn!(%err, "reshard jobs cannot be read now");
                        continue;
                    }
                };
                for job in jobs {
                    this.drive(&kinesis, &holder, lease, job).await;
                }
            }
        })
    }

    /// Takes `job` as far as it goes now: call after call while the stream is ACTIVE after
    /// each, until it ends, the stream is busy, or another replica holds it. A passing
    /// failure is noted on the job, which goes on at a later look; any other ends it.
    async fn drive(
        self: &Arc<Self>,
        link: &KinesisLink,
        holder: &str,
        lease: Duration,
        job: ReshardJob,
    ) {
        let (id, stream) = (job.id, job.stream.clone());
        let mut done = job.done;
        loop {
            let looked = async {
                if !self.claim_job(job.id, holder, lease).await? {
                    return Ok(Step::Elsewhere);
                }
                self.step(&link.client().await?, holder, lease, &job, &mut done)
                    .await
            };
            let failure = match looked.await {
                Ok(Step::Made) => continue,
                Ok(Step::Ended(state)) => {
                    tracing::info!(job = id, %stream, state = state.as_str(), "reshard ended");
                    return;
                }
                Ok(Step::Waiting | Step::Elsewhere) => return,
                Err(err) => err,
            };
            tracing::warn!(job = id, %stream, err = %failure, "reshard: a step failed");
            let progress = JobProgress {
                state: JobState::Running,
                done,
                error: Some(failure.to_string()),
            };
            let noted = if failure.passing() {
                self.note_job(job.id, holder, &progress).await.map(|_| ())
            } else {
                self.end_job(holder, &job, done, Some(failure.to_string()))
                    .await
                    .map(|_| ())
            };
            if let Err(err) = noted {
                tracing::warn!(job = id, %stream, %err, "reshard: the job's state cannot be written now");
            }
            return;
        }
    }

    /// One look at `job`'s stream: registers its real map, and makes the next call towards
    /// the job's shards if one is still needed, or ends the job. `done` is set to the calls
    /// the stream's lineage shows were made.
    async fn step(
        self: &Arc<Self>,
        kinesis: &Kinesis,
        holder: &str,
        lease: Duration,
        job: &ReshardJob,
        done: &mut u32,
    ) -> Result<Step, ReshardError> {
        let name = &job.stream;
        let stream = self
            .stream(name)
            .ok_or_else(|| Error::UnknownStream(name.clone()))?;
        if !watched(&stream) {
            return Err(ReshardError::NotWatched(name.clone()));
        }
        let summary = kinesis.summary(name).await?;
        if summary.on_demand {
            return Err(ReshardError::OnDemand(name.clone()));
        }
        if summary.status != StreamStatus::Active {
            return Ok(Step::Waiting);
        }
        let listing = kinesis.list_shards(name, self.keyspace).await?.map;
        let lineage = listing.lease_shards.as_deref().unwrap_or_default();
        *done = calls_since(lineage, job.first_shard).len() as u32;
        let done = *done;
        let (calls, _) =
            calls_to(&listing.map, listing.next_shard, &job.starts).map_err(Error::from)?;
        let open = listing.map.len();
        let listed = KinesisStream {
            arn: summary.arn,
            created_at_ms: summary.created_at_ms,
        };
        self.register_reshard_listing(&stream, listing, listed)
            .await?;
        let Some(call) = calls.first() else {
            return self.finish(holder, job, done, None).await;
        };
        let progress = JobProgress {
            state: JobState::Running,
            done,
            error: None,
        };
        // Checked again just before the call: a job another replica took is not its to
        // make calls for.
        if !self.note_job(job.id, holder, &progress).await?
            || !self.claim_job(job.id, holder, lease).await?
        {
            return Ok(Step::Elsewhere);
        }
        let total = done as usize + calls.len();
        tracing::info!(job = job.id, stream = %name, call = %Said(call), made = done, total, "reshard: making a call");
        let made = match call {
            Reshard::Split {
                shard,
                new_starting_hash_key,
                ..
            } => {
                kinesis
                    .split_shard(name, shard, *new_starting_hash_key)
                    .await
            }
            Reshard::Merge {
                shard, adjacent, ..
            } => kinesis.merge_shards(name, shard, adjacent).await,
        };
        match made {
            Ok(()) => Ok(Step::Made),
            Err(KinesisError::LimitExceeded(why)) => {
                let failure = format!(
                    "stopped after {done} of {total} calls: Kinesis refused the next, {} ({why}); \
                     the stream has {open} open shards, and keyspread's map is that",
                    Said(call)
                );
                self.finish(holder, job, done, Some(failure)).await
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Ends `job` as [`Registry::end_job`] does, answering its state.
    async fn finish(
        self: &Arc<Self>,
        holder: &str,
        job: &ReshardJob,
        done: u32,
        failure: Option<String>,
    ) -> Result<Step, ReshardError> {
        let state = if failure.is_some() {
            JobState::Failed
        } else {
            JobState::Done
        };
        Ok(match self.end_job(holder, job, done, failure).await? {
            true => Step::Ended(state),
            false => Step::Elsewhere,
        })
    }

    /// Registers `listing` as `stream`'s map, listed from Kinesis stream `listed` (logged
    /// as Kinesis'), unless it is the map registered already.
    async fn register_reshard_listing(
        self: &Arc<Self>,
        stream: &Stream,
        listing: StreamMap,
        listed: KinesisStream,
    ) -> Result<(), Error> {
        let same = *stream.map == listing.map
            && stream.next_shard == listing.next_shard
            && listing.lease_shards.as_deref() == Some(&stream.lease_shards[..]);
        if same {
            return Ok(());
        }
        let (name, source) = (stream.name.clone(), Source::Resharding(listed));
        let by = Actor::new(Actor::KINESIS);
        let ticket = Ticket::unbounded();
        (self.put_stream_from(name, Some(listing), None, source, &by, &ticket)).await?;
        Ok(())
    }

    /// Ends `job` after `done` calls, done or (with `failure`) failed, if `holder` still
    /// holds it (`false` if not): in one transaction, on the primary stream, with the
    /// rebalance over its map as registered, staged and logged as the job's starter's with
    /// `reason: reshard` (unless the job failed before any call).
    async fn end_job(
        self: &Arc<Self>,
        holder: &str,
        job: &ReshardJob,
        done: u32,
        failure: Option<String>,
    ) -> Result<bool, Error> {
        let this = Arc::clone(self);
        let (holder, job) = (holder.to_owned(), job.clone());
        detached(async move {
            let mut w = this.writer.lock().await;
            let (mut tx, at) = this.begin(&mut w).await?;
            let primary = this.stream(&job.stream).filter(|s| s.primary);
            let rebalance = primary.filter(|_| failure.is_none() || done > 0);
            let progress = JobProgress {
                state: match failure {
                    None => JobState::Done,
                    Some(_) => JobState::Failed,
                },
                done,
                error: failure,
            };
            if !tx.note_reshard(job.id, &holder, at, &progress).await? {
                return Ok(false);
            }
            let moves = match rebalance {
                Some(stream) => this.plan(&mut w, &stream.map, at)?.moves,
                None => Vec::new(),
            };
            let switch_at = at + job.switch_after_ms;
            let by = &job.started_by;
            (this.apply_staged(&mut w, tx, at, switch_at, moves, MoveReason::Reshard, by)).await?;
            Ok(true)
        })
        .await
    }

    /// Takes (or keeps) job `id` for `holder` for `lease`, by the database's clock: `false`
    /// while another replica holds it, or once it has ended.
    async fn claim_job(&self, id: i64, holder: &str, lease: Duration) -> Result<bool, Error> {
        let mut tx = self.store.begin().await?;
        let now = tx.clock_ms().await?;
        let claimed = (tx.claim_reshard(id, holder, now, lease.as_millis() as i64)).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    /// Writes how job `id` stands, if `holder` holds it (`false` if not).
    async fn note_job(&self, id: i64, holder: &str, progress: &JobProgress) -> Result<bool, Error> {
        let mut tx = self.store.begin().await?;
        let now = tx.clock_ms().await?;
        let noted = tx.note_reshard(id, holder, now, progress).await?;
        tx.commit().await?;
        Ok(noted)
    }
}

/// Whether keyspread lists `stream`'s shards itself.
fn watched(stream: &Stream) -> bool {
    stream.watch
}

/// A call as the AWS CLI names it, for logs and a failed job's error.
struct Said<'a>(&'a Reshard);

impl std::fmt::Display for Said<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Reshard::Split {
                shard,
                new_starting_hash_key,
                ..
            } => write!(f, "split-shard {shard} at {new_starting_hash_key}"),
            Reshard::Merge {
                shard, adjacent, ..
            } => write!(f, "merge-shards {shard} {adjacent}"),
        }
    }
}
