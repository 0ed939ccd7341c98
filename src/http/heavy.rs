//! Heavy pure work of a request (plans, distributions) on blocking threads, a few at a time,
//! so the async workers keep answering every other request while it runs.

use std::sync::Arc;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::Semaphore;

use super::error::ApiError;

/// Runs CPU-heavy request work off the async workers, at most `permits` pieces at once.
///
/// A request waits for a permit under its timeout; once its work has started, the work
/// runs to the end even if the client is gone, holding its permit, so abandoned requests
/// never add up to more than `permits` pieces of work in flight.
#[derive(Debug, Clone)]
pub struct HeavyWork {
    permits: Arc<Semaphore>,
}

impl HeavyWork {
    /// At most `permits` (at least one) pieces of heavy work at once.
    pub fn new(permits: usize) -> Self {
        HeavyWork {
            permits: Arc::new(Semaphore::new(permits.max(1))),
        }
    }

    /// One fewer than the cores this process may use (at least one), so a core stays for
    /// the async workers and the database.
    pub fn for_this_machine() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        HeavyWork::new(cores.saturating_sub(1))
    }

    /// Runs `work` on a blocking thread once a permit is free and answers its result as
    /// JSON, serialized on that thread too (big plans make bodies of tens of MB).
    pub async fn json<T, F>(&self, work: F) -> Result<Response, ApiError>
    where
        T: Serialize,
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let span = tracing::Span::current();
        let body = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let _span = span.enter();
            work().and_then(|value| serde_json::to_vec(&value).map_err(|e| ApiError::internal(&e)))
        })
        .await
        .map_err(|e| ApiError::internal(&e))??;
        let json = HeaderValue::from_static("application/json");
        Ok(([(header::CONTENT_TYPE, json)], body).into_response())
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
}
