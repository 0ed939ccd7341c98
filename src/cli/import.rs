//! `keyspread import` of a CSV of `account,weight[,hash_key[,fanout]]` rows: an existing
//! table moved into keyspread, keeping the keys rows bring.
//!
//! Three phases, each in transactions of at most 10,000 rows or 16,384 keys: rows that bring
//! a key (key 0 alone, at its share of the weight), rows without one (keys from the walk),
//! then the other keys of rows that brought key 0 of several. Each phase decides from what
//! the database holds and places in file order, every pick steered by the ones before, so an
//! import stopped anywhere and run again ends with the table an uninterrupted one makes.

use std::sync::Arc;

use super::{Row, Rows};
use crate::keyspace;
use crate::registry::{Allocated, Grow, NewAccount, Registry, Ticket};
use crate::store::Actor;

/// What `keyspread import` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ImportSummary {
    pub rows: u64,
    /// Accounts given a key by the walk.
    pub allocated: u64,
    /// Accounts that brought their own key and kept it.
    pub kept: u64,
    /// Accounts keyspread already had (left as they were, but for the keys a stopped import
    /// had yet to give them).
    pub present: u64,
    /// Rows refused, with their line numbers and why.
    pub refused: Vec<(u64, String)>,
}

/// Rows per transaction: large enough to amortize the commit, small enough to show progress.
const IMPORT_CHUNK: usize = 10_000;

/// Most keys one import transaction places, over its rows' fanouts.
const IMPORT_CHUNK_KEYS: u64 = 16_384;

/// The two passes over an import file. Rows that bring their key go first, so that no row
/// left to the walk takes a key a later row of the file brings.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Rows with a hash key, and every refused row.
    Keyed,
    /// Rows without one.
    Keyless,
}

/// `keyspread import`: places every row (a header line is skipped), `open` called once per
/// pass over the file; a row that brings key 0 of several gets its other keys once every
/// brought key is placed, so that none of them takes one a later row brings. `progress` is
/// called after each transaction with the rows handled so far. A file without a row is an
/// error.
pub async fn import<R: std::io::Read>(
    registry: &Arc<Registry>,
    open: impl Fn() -> std::io::Result<R>,
    mut progress: impl FnMut(u64),
) -> Result<ImportSummary, String> {
    let mut summary = ImportSummary::default();
    let mut grow = Vec::new();
    for pass in [Pass::Keyed, Pass::Keyless] {
        let csv = open().map_err(|e| format!("cannot read the file: {e}"))?;
        import_pass(registry, csv, pass, &mut summary, &mut grow, &mut progress).await?;
    }
    if summary.rows == 0 {
        return Err(
            "the file holds no rows: nothing to import (expected account,weight[,hash_key[,fanout]] rows)"
                .into(),
        );
    }
    let import = Actor::new(Actor::IMPORT);
    let mut grow = grow.into_iter().peekable();
    while grow.peek().is_some() {
        let mut keys = 0;
        let chunk: Vec<Grow> = std::iter::from_fn(|| {
            grow.next_if(|g| keys == 0 || keys + u64::from(g.fanout) <= IMPORT_CHUNK_KEYS)
                .inspect(|g| keys += u64::from(g.fanout))
        })
        .collect();
        registry
            .grow_imported(chunk, &import)
            .await
            .map_err(|e| format!("import stopped after {} rows: {e}", summary.rows))?;
        progress(summary.rows);
    }
    Ok(summary)
}

/// One pass over the file: places the rows `pass` handles, in chunks of [`IMPORT_CHUNK`]
/// rows or [`IMPORT_CHUNK_KEYS`] keys; notes in `grow`, in file order, the rows that
/// brought key 0 of several (placed now, or by an import that stopped).
async fn import_pass(
    registry: &Arc<Registry>,
    csv: impl std::io::Read,
    pass: Pass,
    summary: &mut ImportSummary,
    grow: &mut Vec<Grow>,
    progress: &mut impl FnMut(u64),
) -> Result<(), String> {
    let mut rows = Rows::new(csv, registry.keyspace());
    let mut chunk = Vec::with_capacity(IMPORT_CHUNK);
    let mut keys = 0u64;
    loop {
        let next = rows.next().transpose()?;
        let more = next.is_some();
        if let Some(Row { line, parsed }) = next {
            match parsed {
                Ok(row) if row.key.is_some() != (pass == Pass::Keyed) => {}
                Err(why) if pass == Pass::Keyed => {
                    summary.rows += 1;
                    summary.refused.push((line, why));
                }
                Err(_) => {}
                Ok(row) => {
                    summary.rows += 1;
                    let several = (row.key.zip((row.fanout > 1).then_some(row.fanout))).map(
                        |(key, fanout)| Grow {
                            account: row.account.clone(),
                            key,
                            weight: row.weight,
                            fanout,
                        },
                    );
                    if registry.lookup(row.account.as_str()).is_some() {
                        summary.present += 1;
                        grow.extend(several);
                    } else if let Some(key) = row.key
                        && registry.is_held(key).await
                    {
                        let why = format!("hash key {key} is already held by another account");
                        summary.refused.push((line, why));
                    } else if let Some(several) = several {
                        keys += 1;
                        chunk.push(NewAccount {
                            weight: keyspace::key_weight(row.weight, row.fanout, 0),
                            fanout: 1,
                            ..row
                        });
                        grow.push(several);
                    } else {
                        keys += u64::from(row.fanout);
                        chunk.push(row);
                    }
                }
            }
        }
        let full = chunk.len() >= IMPORT_CHUNK || keys >= IMPORT_CHUNK_KEYS;
        if full || (!more && !chunk.is_empty()) {
            keys = 0;
            place(registry, std::mem::take(&mut chunk), pass, summary).await?;
            progress(summary.rows);
        }
        if !more {
            return Ok(());
        }
    }
}

/// Gives one chunk of rows their keys, in one transaction, and counts what it did.
async fn place(
    registry: &Arc<Registry>,
    chunk: Vec<NewAccount>,
    pass: Pass,
    summary: &mut ImportSummary,
) -> Result<(), String> {
    let answers = registry
        .allocate_many(chunk, &Actor::new(Actor::IMPORT), &Ticket::unbounded())
        .await
        .map_err(|e| format!("import stopped after {} rows: {e}", summary.rows))?;
    let created = answers
        .iter()
        .filter(|a| matches!(a, Allocated::Created(_)))
        .count() as u64;
    match pass {
        Pass::Keyed => summary.kept += created,
        Pass::Keyless => summary.allocated += created,
    }
    summary.present += answers.len() as u64 - created;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;
    use crate::keyspace::{Allocator, Keyspace};
    use crate::store::Store;

    /// The first keys the walk hands out from empty: the ones a keyless row would take.
    fn first_picks(n: usize) -> Vec<u128> {
        let mut walk = Allocator::new(Keyspace::KINESIS);
        (0..n).map(|_| walk.allocate(1).unwrap().0).collect()
    }

    /// A file of keyed rows (distinct keys, most of them the walk's first picks) and keyless
    /// rows, shuffled: `(account, weight, key)` per row.
    fn files() -> impl Strategy<Value = Vec<(String, u64, Option<u128>)>> {
        let keys = prop::sample::subsequence(first_picks(16), 0..=12)
            .prop_flat_map(|keys| (Just(keys), prop::collection::vec(any::<u128>(), 0..3)));
        (keys, 0usize..12)
            .prop_flat_map(|((mut keys, random), keyless)| {
                keys.extend(random.into_iter().filter(|k| !first_picks(16).contains(k)));
                let rows = keys
                    .into_iter()
                    .map(Some)
                    .chain(std::iter::repeat_n(None, keyless))
                    .collect::<Vec<_>>();
                let weights = prop::collection::vec(1u64..=3, rows.len());
                (Just(rows), weights)
            })
            .prop_map(|(keys, weights)| {
                keys.into_iter()
                    .zip(weights)
                    .enumerate()
                    .map(|(i, (key, weight))| (format!("acct-{i}"), weight, key))
                    .collect::<Vec<_>>()
            })
            .prop_shuffle()
    }

    async fn import_file(
        rows: &[(String, u64, Option<u128>)],
    ) -> (ImportSummary, Vec<(String, u128)>) {
        let csv: String = rows
            .iter()
            .map(|(account, weight, key)| match key {
                Some(key) => format!("{account},{weight},{key}\n"),
                None => format!("{account},{weight}\n"),
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("k.db").display());
        let store = Store::connect(&url).await.unwrap();
        let registry = Registry::open(store, Keyspace::KINESIS, None)
            .await
            .unwrap();
        let summary = import(&registry, || Ok(csv.as_bytes()), |_| {})
            .await
            .unwrap();
        let held = rows
            .iter()
            .filter_map(|(account, ..)| registry.lookup(account))
            .map(|a| (a.hash_key().0, a.account.into_string()))
            .map(|(key, account)| (account, key))
            .collect();
        (summary, held)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever the order of the file, every row is placed, each keyed row on exactly its
        /// key, and no key twice.
        #[test]
        fn keyed_rows_keep_their_keys_in_any_order(rows in files()) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let (summary, held) = runtime.block_on(import_file(&rows));
            let keyed = rows.iter().filter(|r| r.2.is_some()).count() as u64;
            prop_assert_eq!(
                (summary.kept, summary.allocated, summary.present, summary.refused.len()),
                (keyed, rows.len() as u64 - keyed, 0, 0)
            );
            prop_assert_eq!(held.len(), rows.len());
            for ((account, _, brought), (held_by, key)) in rows.iter().zip(&held) {
                prop_assert_eq!(account, held_by);
                if let Some(brought) = brought {
                    prop_assert_eq!(brought, key);
                }
            }
            let distinct: HashSet<u128> = held.iter().map(|(_, key)| *key).collect();
            prop_assert_eq!(distinct.len(), held.len());
        }
    }
}
