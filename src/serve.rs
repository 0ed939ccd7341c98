//! The accept loop: connections within `--max-connections`, long polls of the log beside
//! them, and a stop that ends within `--shutdown-timeout-s` whatever clients do.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{AppState, app, http};

/// Serves `state` on `listener` until `shutdown` resolves, then drains in-flight requests
/// for the shutdown timeout at most, and drops the connections still open after it.
///
/// Connections past `max_connections` wait in the listen backlog; a client that is slow to
/// send its headers, or leaves its connection idle, is disconnected after `header_timeout`.
/// A long poll of the log gives its connection's place to another while it waits (up to
/// `max_connections` of them; past that it keeps its place), and takes a place back before
/// it answers. A body left unread (a 413, say) is discarded within bounds before the
/// connection closes.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt as _;

    let limits = state.connections;
    let registry = Arc::clone(&state.registry);
    let app = app(state);
    let places = Places::new(limits.max_connections);
    let graceful = GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        let place = tokio::select! {
            place = places.take() => place,
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, say: wait for some to close, do not spin.
                    tracing::warn!(%err, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (app, place) = (app.clone(), Arc::new(place));
        let service = tower::service_fn(move |mut request: hyper::Request<_>| {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let long_poll = !http::long_poll(request.uri()).is_zero();
            // Bodies left unread are drained, so their clients read the answer.
            let answer = app.clone().oneshot(http::Lingering::wrap(request));
            let place = Arc::clone(&place);
            async move {
                if long_poll {
                    place.lend_while(answer).await
                } else {
                    answer.await
                }
            }
        });
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        connections.spawn(async move {
            // Errors here are the client's doing (a reset, a timeout): nothing to report.
            if let Err(err) = connection.await {
                tracing::debug!(%err, %peer, "connection closed");
            }
        });
    }
    drop(listener);
    // Long-polls of the log answer now, rather than hold the drain for up to a minute.
    registry.end_long_polls();
    let drained = tokio::time::timeout(limits.shutdown_timeout, graceful.shutdown()).await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            timeout_s = limits.shutdown_timeout.as_secs(),
            "requests still in flight at the shutdown timeout: their connections are dropped"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// The places of `--max-connections`, and as many again for long polls while they wait.
#[derive(Clone)]
struct Places {
    connections: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
}

impl Places {
    fn new(max_connections: usize) -> Places {
        Places {
            connections: Arc::new(Semaphore::new(max_connections)),
            waiting: Arc::new(Semaphore::new(max_connections)),
        }
    }

    /// A connection's place, once one is free.
    async fn take(&self) -> Place {
        let held = Arc::clone(&self.connections)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        Place {
            held: Mutex::new(Some(held)),
            places: self.clone(),
        }
    }
}

/// One connection's place among `--max-connections`.
struct Place {
    held: Mutex<Option<OwnedSemaphorePermit>>,
    places: Places,
}

impl Place {
    /// Runs `work` (a long poll) with this place given back to others, if a place for a
    /// waiting long poll is free; takes a place again before answering what it made.
    async fn lend_while<F: Future>(&self, work: F) -> F::Output {
        let Ok(waiting) = Arc::clone(&self.places.waiting).try_acquire_owned() else {
            return work.await;
        };
        drop(self.held.lock().expect("place lock poisoned").take());
        let made = work.await;
        let back = Arc::clone(&self.places.connections)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        *self.held.lock().expect("place lock poisoned") = Some(back);
        drop(waiting);
        made
    }
}
