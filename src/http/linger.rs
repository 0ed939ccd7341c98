//! A lingering close: a request body the service left unread (refused 413 from its
//! declared length, or answered before it was read) is read and discarded, within bounds.
//!
//! Many clients (Python's urllib and requests among them) write the whole body before they
//! read the answer. Closing on unread data makes the kernel reset the connection, and they
//! see a broken pipe instead of the 413. Draining lets them finish writing and read it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{Request, header};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};

/// Most bytes of an unread body discarded; a longer one is cut off (the connection closes).
pub const LINGER_BYTES: u64 = 8 << 20;

/// Longest time spent discarding one body, so a trickling client cannot hold on.
pub const LINGER_TIME: Duration = Duration::from_secs(5);

/// A request body that, dropped unread, is drained in the background within the bounds.
#[derive(Debug)]
pub struct Lingering {
    body: Option<Incoming>,
    /// The client waits for `100 Continue` before it sends the body: never ask for it.
    expects_continue: bool,
}

impl Lingering {
    /// `request` with its body wrapped.
    pub fn wrap(request: Request<Incoming>) -> Request<Lingering> {
        let expects_continue = request.headers().contains_key(header::EXPECT);
        request.map(|body| Lingering {
            body: Some(body),
            expects_continue,
        })
    }
}

impl Body for Lingering {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.body.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(body) = self.body.take() else {
            return;
        };
        // A declared length past the bound would be cut off anyway: close at once.
        let worth_it = !body.is_end_stream()
            && !self.expects_continue
            && body.size_hint().lower() <= LINGER_BYTES;
        if worth_it && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(discard(body));
        }
    }
}

/// Reads `body` to its end, or until [`LINGER_BYTES`] or [`LINGER_TIME`] run out.
async fn discard(mut body: Incoming) {
    let deadline = tokio::time::Instant::now() + LINGER_TIME;
    let mut read = 0;
    while read <= LINGER_BYTES {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        match tokio::time::timeout_at(deadline, frame).await {
            Ok(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |data| data.len() as u64);
            }
            _ => return,
        }
    }
}
