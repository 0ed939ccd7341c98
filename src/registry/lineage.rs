//! The lineage file beside a SQLite database: the log the file held and the newest event
//! applied from it, so that an older copy of the file put in its place is found at
//! start-up, when no running replica remembers how far the log had gone.
//!
//! Written after commits (coalesced, at most every [`PAUSE`]) by renaming a fresh file
//! over it, never synced: a machine crash may leave it behind the database, which only
//! misses a rewind, never reports one that did not happen. Postgres keeps no such file
//! (its point-in-time restores and timelines are for the database to say).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Error, Registry};
use crate::store::{LogEnd, LogId, Store};

/// Least time between two writes of the file.
const PAUSE: Duration = Duration::from_millis(10);

/// What the file holds.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Lineage {
    log_id: String,
    end: i64,
}

/// The lineage file of `store`'s database, if it is a SQLite file.
fn path(store: &Store) -> Option<PathBuf> {
    match store {
        // Named as SQLite names the files beside a database (`-wal`, `-shm`), so two
        // databases in one directory never share one.
        Store::Sqlite(pools) if pools.file.is_file() => Some(beside(&pools.file, "-lineage")),
        _ => None,
    }
}

/// `file`'s name with `suffix` appended, in the same directory.
fn beside(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The lineage the file at `path` holds, if it holds one.
fn read(path: &Path) -> Option<Lineage> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Writes `lineage` to `path`, unless the file names the same log further along (another
/// process on the file applied more).
fn write(path: &Path, lineage: &Lineage) -> std::io::Result<()> {
    if read(path).is_some_and(|held| held.log_id == lineage.log_id && held.end >= lineage.end) {
        return Ok(());
    }
    let fresh = beside(path, &format!(".{}", std::process::id()));
    std::fs::write(&fresh, serde_json::to_vec(lineage)?)?;
    std::fs::rename(&fresh, path)
}

/// At start-up, before the table is read: when the lineage file says this database's log
/// went further than it now does (an older copy of the file), gives the log a new name,
/// so that every reader that followed it further starts again from a snapshot.
pub(super) async fn check(store: &Store) -> Result<(), Error> {
    let Some(seen) = path(store).as_deref().and_then(read) else {
        return Ok(());
    };
    let rewound = |now: &LogEnd| now.log_id.to_string() == seen.log_id && now.end < seen.end;
    if !rewound(&store.log_end().await?) {
        return Ok(());
    }
    // Judged again under the write lock: processes starting together rename it once.
    let mut tx = store.begin().await?;
    let now = tx.log_end().await?;
    if rewound(&now) {
        let named = tx.rename_log(now.log_id, LogId::fresh()).await?;
        tx.commit().await?;
        tracing::warn!(
            was = %now.log_id,
            now = %named,
            end = now.end,
            served = seen.end,
            "the database file ends before events served from it (an older copy of the file): it is a new log now, and its readers start again from a snapshot"
        );
    }
    Ok(())
}

impl Registry {
    /// Keeps the lineage file (SQLite only) naming the log memory follows and the newest
    /// event applied, until the registry is dropped.
    pub(super) fn keep_lineage(&self) {
        let Some(path) = path(&self.store) else {
            return;
        };
        let mut applied = self.applied.subscribe();
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                let lineage = {
                    let head = applied.borrow_and_update();
                    Lineage {
                        log_id: head.log.to_string(),
                        end: head.event,
                    }
                };
                let file = path.clone();
                let written = tokio::task::spawn_blocking(move || write(&file, &lineage)).await;
                match written {
                    Ok(Err(err)) if !failing => {
                        tracing::warn!(%err, path = %path.display(), "cannot write the lineage file: an older copy of the database put in its place would go unnoticed");
                        failing = true;
                    }
                    Ok(Ok(())) => failing = false,
                    _ => {}
                }
                tokio::time::sleep(PAUSE).await;
                if applied.changed().await.is_err() {
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_databases_in_one_directory_keep_lineages_of_their_own() {
        let db = beside(Path::new("/srv/keyspread/registry.db"), "-lineage");
        let sqlite = beside(Path::new("/srv/keyspread/registry.sqlite"), "-lineage");
        let bare = beside(Path::new("/srv/keyspread/registry"), "-lineage");
        assert_eq!(db, Path::new("/srv/keyspread/registry.db-lineage"));
        assert_ne!(db, sqlite);
        assert_ne!(db, bare);
        assert_ne!(sqlite, bare);
    }
}
