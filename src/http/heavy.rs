//! Heavy pure work of a request (plans, distributions) on a few threads of its own, at a
//! lower priority, so the async workers keep answering every other request while it runs.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, mpsc};

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::{Semaphore, oneshot};

use super::error::ApiError;

/// One piece of work for a heavy-work thread.
type Job = Box<dyn FnOnce() + Send>;

/// Runs CPU-heavy request work off the async workers, on `threads` threads of its own.
///
/// A request waits for a thread under its timeout, and work whose client left before its
/// turn never runs; once started, work runs to its end even if the client is gone, so
/// abandoned requests never add up to more than `threads` pieces of work in flight.
#[derive(Debug, Clone)]
pub struct HeavyWork {
    permits: Arc<Semaphore>,
    jobs: mpsc::Sender<Job>,
}

impl HeavyWork {
    /// Starts `threads` (at least one) heavy-work threads; they end with the last clone.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("keyspread-heavy-{i}"))
                .spawn(move || {
                    lower_priority();
                    while let Ok(job) = queue.lock().expect("queue lock poisoned").recv() {
                        job();
                    }
                })
                .expect("start a heavy-work thread");
        }
        HeavyWork {
            permits: Arc::new(Semaphore::new(threads)),
            jobs,
        }
    }

    /// One fewer than the cores this process may use (at least one), so a core stays for
    /// the async workers and the database.
    pub fn for_this_machine() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        HeavyWork::new(cores.saturating_sub(1))
    }

    /// Runs `work` on a heavy-work thread once one is free and answers its result as JSON,
    /// serialized on that thread too (big plans make bodies of tens of MB).
    pub async fn json<T, F>(&self, work: F) -> Result<Response, ApiError>
    where
        T: Serialize,
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    {
        let body = self
            .run(move || {
                let value = work()?;
                serde_json::to_vec(&value).map_err(|e| ApiError::internal(&e))
            })
            .await?;
        let json = HeaderValue::from_static("application/json");
        Ok(([(header::CONTENT_TYPE, json)], body).into_response())
    }

    /// One of the pool's turns, for heavy work that is not a closure (reading a table into
    /// a spool): held, it counts against the threads as running work does.
    pub async fn turn(&self) -> tokio::sync::OwnedSemaphorePermit {
        Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Runs `work` on a heavy-work thread once one is free and answers what it made.
    pub async fn run<T, F>(&self, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let span = tracing::Span::current();
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move || {
            let _span = span.enter();
            let made = catch_unwind(AssertUnwindSafe(work));
            // The thread is free before anyone hears the answer.
            drop(permit);
            // Without a receiver the client is gone: there is no one to answer.
            let _ = answer.send(made);
        });
        self.jobs
            .send(job)
            .expect("heavy-work threads live as long as a sender");
        answered
            .await
            .map_err(|e| ApiError::internal(&e))?
            .map_err(|_| ApiError::internal(&"heavy work panicked"))?
    }
}

/// Lowers the calling thread's scheduling priority (nice 10; per thread on Linux), so the
/// async workers win the CPU whenever they have something to answer.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    /// Work that waits for a word on `go` before it answers.
    fn held(go: mpsc::Receiver<()>) -> impl FnOnce() -> Result<u8, ApiError> + Send {
        move || {
            go.recv().ok();
            Ok(1)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn abandoned_work_keeps_its_permit_until_it_ends() {
        let heavy = HeavyWork::new(1);
        let (go, wait) = mpsc::channel();
        let first = tokio::spawn({
            let heavy = heavy.clone();
            async move { heavy.json(held(wait)).await }
        });
        while heavy.permits.available_permits() == 1 {
            tokio::task::yield_now().await;
        }
        // The client goes away: its work still holds the permit.
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert_eq!(heavy.permits.available_permits(), 0);

        // Work queued behind it and abandoned before a permit came never runs.
        let ran = Arc::new(AtomicBool::new(false));
        let queued = tokio::spawn({
            let (heavy, ran) = (heavy.clone(), Arc::clone(&ran));
            async move {
                heavy
                    .json(move || {
                        ran.store(true, Ordering::SeqCst);
                        Ok(())
                    })
                    .await
            }
        });
        tokio::task::yield_now().await;
        queued.abort();
        assert!(queued.await.unwrap_err().is_cancelled());

        go.send(()).unwrap();
        let answer = heavy.json(|| Ok("after")).await.unwrap();
        assert_eq!(answer.status(), 200);
        assert!(!ran.load(Ordering::SeqCst));
        assert_eq!(heavy.permits.available_permits(), 1);
    }

    #[tokio::test]
    async fn answers_json_or_the_work_s_error() {
        let heavy = HeavyWork::new(1);
        let ok = heavy.json(|| Ok(vec![1, 2])).await.unwrap();
        assert_eq!(ok.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(ok.into_body(), 100).await.unwrap();
        assert_eq!(&body[..], b"[1,2]");
        let failed = heavy
            .json(|| Err::<u8, _>(ApiError::not_found("no such stream")))
            .await
            .unwrap_err();
        assert_eq!(failed.status(), 404);
    }

    #[tokio::test]
    async fn work_that_panics_answers_500_and_leaves_its_thread_working() {
        let heavy = HeavyWork::new(1);
        let panicked = heavy
            .json(|| -> Result<u8, ApiError> { panic!("a bug in a planner") })
            .await
            .unwrap_err();
        assert_eq!(panicked.status(), 500);
        assert_eq!(heavy.json(|| Ok(1)).await.unwrap().status(), 200);
    }
}
