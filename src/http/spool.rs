//! A long answer written to a temporary file at the database's pace and sent from there at
//! the client's, so whatever its writer holds (a read transaction, a heavy-work turn) is
//! let go as soon as the answer is written, however slowly the client reads it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// Answers spooled or sent from a spool at once, and so the bound on the disk they take:
/// this many times the largest answer.
pub const SPOOLS: usize = 8;

/// Bytes read from a spool for each piece of the body.
const CHUNK: usize = 128 * 1024;

/// Pieces of the body read ahead of a client.
const READ_AHEAD: usize = 2;

/// The places for spools: a request waits for one (under its timeout).
#[derive(Debug, Clone)]
pub struct Spools(Arc<Semaphore>);

impl Default for Spools {
    fn default() -> Self {
        Spools(Arc::new(Semaphore::new(SPOOLS)))
    }
}

impl Spools {
    /// A new spool once a place is free: a file in the temporary directory, unlinked at
    /// once, so it goes with its last handle whatever happens to the process.
    pub async fn open(&self) -> std::io::Result<(Spool, Progress)> {
        let place = Arc::clone(&self.0)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let file = tokio::task::spawn_blocking(tempfile::tempfile)
            .await
            .map_err(std::io::Error::other)??;
        let file = Arc::new(Mutex::new(file));
        let place = Arc::new(place);
        let (written, seen) = watch::channel(Written::default());
        let spool = Spool {
            file: Arc::clone(&file),
            written,
            _place: Arc::clone(&place),
        };
        let progress = Progress {
            file,
            seen,
            _place: place,
        };
        Ok((spool, progress))
    }
}

/// How far a spool is written, and how it ended.
#[derive(Debug, Clone, Default)]
struct Written {
    bytes: u64,
    /// `Some` once the writer is done: `Err` says why the answer is cut short.
    end: Option<Result<(), String>>,
}

/// The writing end of a spool.
pub struct Spool {
    file: Arc<Mutex<File>>,
    written: watch::Sender<Written>,
    _place: Arc<OwnedSemaphorePermit>,
}

impl Spool {
    /// Appends `bytes`; the reader may send them from now on.
    pub async fn write(&self, bytes: Bytes) -> std::io::Result<()> {
        let file = Arc::clone(&self.file);
        let len = bytes.len() as u64;
        tokio::task::spawn_blocking(move || {
            let mut file = file.lock().expect("spool lock poisoned");
            file.seek(SeekFrom::End(0))?;
            file.write_all(&bytes)
        })
        .await
        .map_err(std::io::Error::other)??;
        self.written.send_modify(|w| w.bytes += len);
        Ok(())
    }

    /// Whether the client is gone (or was cut off): nothing more needs writing.
    pub fn abandoned(&self) -> bool {
        self.written.is_closed()
    }

    /// Ends the answer: whole, or cut short for `err` after what was written.
    pub fn finish(self, result: Result<(), String>) {
        self.written.send_modify(|w| w.end = Some(result));
    }
}

/// The reading end of a spool, which becomes the answer's body.
pub struct Progress {
    file: Arc<Mutex<File>>,
    seen: watch::Receiver<Written>,
    _place: Arc<OwnedSemaphorePermit>,
}

impl Progress {
    /// The body: the spool's bytes as they are written, at the client's pace. A client that
    /// takes nothing for `stall` has its answer cut short, and the spool goes.
    pub fn into_body(self, stall: Duration) -> Body {
        let (pieces, body) = mpsc::channel(READ_AHEAD);
        tokio::spawn(self.send(pieces, stall));
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(body))
    }

    async fn send(mut self, pieces: mpsc::Sender<std::io::Result<Bytes>>, stall: Duration) {
        let mut sent = 0u64;
        loop {
            let piece = match self.next(sent).await {
                None => return,
                Some(Ok(bytes)) => {
                    sent += bytes.len() as u64;
                    Ok(bytes)
                }
                Some(Err(err)) => Err(err),
            };
            let failed = piece.is_err();
            let taken = tokio::time::timeout(stall, pieces.send(piece)).await;
            if !matches!(taken, Ok(Ok(()))) || failed {
                return;
            }
        }
    }

    /// The bytes after the first `sent` once some are written; `None` at the end of a
    /// whole answer, an error at the end of one cut short.
    async fn next(&mut self, sent: u64) -> Option<std::io::Result<Bytes>> {
        let written = match self
            .seen
            .wait_for(|w| w.bytes > sent || w.end.is_some())
            .await
        {
            Ok(written) => written.clone(),
            Err(_) => return Some(Err(std::io::Error::other("the spool's writer stopped"))),
        };
        if written.bytes > sent {
            let len = CHUNK.min((written.bytes - sent) as usize);
            return Some(read_at(Arc::clone(&self.file), sent, len).await);
        }
        // Nothing new, so the writer is done.
        match written.end {
            Some(Err(err)) => Some(Err(std::io::Error::other(err))),
            _ => None,
        }
    }
}

/// `len` bytes of `file` from `offset`, read off the async workers.
async fn read_at(file: Arc<Mutex<File>>, offset: u64, len: usize) -> std::io::Result<Bytes> {
    tokio::task::spawn_blocking(move || {
        let mut file = file.lock().expect("spool lock poisoned");
        file.seek(SeekFrom::Start(offset))?;
        let mut out = vec![0; len];
        file.read_exact(&mut out)?;
        Ok(out.into())
    })
    .await
    .map_err(std::io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(progress: Progress) -> Result<Bytes, axum::Error> {
        axum::body::to_bytes(progress.into_body(Duration::from_secs(5)), usize::MAX).await
    }

    #[tokio::test]
    async fn the_body_is_what_was_written_read_while_it_is_written() {
        let (spool, progress) = Spools::default().open().await.unwrap();
        let body = tokio::spawn(body_of(progress));
        let piece = Bytes::from(vec![b'x'; CHUNK + 17]);
        for _ in 0..3 {
            spool.write(piece.clone()).await.unwrap();
            tokio::task::yield_now().await;
        }
        spool.finish(Ok(()));
        let body = body.await.unwrap().unwrap();
        assert_eq!(body.len(), 3 * piece.len());
        assert!(body.iter().all(|b| *b == b'x'));
    }

    #[tokio::test]
    async fn a_spool_cut_short_ends_its_body_with_an_error() {
        let (spool, progress) = Spools::default().open().await.unwrap();
        spool.write(Bytes::from_static(b"head\n")).await.unwrap();
        spool.finish(Err("the database went away".into()));
        assert!(body_of(progress).await.is_err());

        let (spool, progress) = Spools::default().open().await.unwrap();
        spool.write(Bytes::from_static(b"head\n")).await.unwrap();
        drop(spool);
        assert!(body_of(progress).await.is_err(), "a writer that stopped");
    }

    #[tokio::test]
    async fn a_client_that_goes_leaves_the_spool_abandoned() {
        let (spool, progress) = Spools::default().open().await.unwrap();
        assert!(!spool.abandoned());
        drop(progress.into_body(Duration::from_secs(5)));
        spool.write(Bytes::from_static(b"head\n")).await.unwrap();
        // The sender task sees its body gone once it has a piece to send.
        for _ in 0..1000 {
            if spool.abandoned() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the spool is still wanted after its client went");
    }

    #[tokio::test]
    async fn spools_past_the_bound_wait_for_one_to_go() {
        let spools = Spools::default();
        let mut open = Vec::new();
        for _ in 0..SPOOLS {
            open.push(spools.open().await.unwrap());
        }
        let next = tokio::spawn({
            let spools = spools.clone();
            async move { spools.open().await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!next.is_finished(), "a spool past the bound");
        drop(open.pop());
        next.await.unwrap().unwrap();
    }
}
