//! Answers kept for Idempotency-Keys: the first committed answer to a change sent with a
//! key, per actor, written in the change's own transaction (migration 0015 / 0019).

use super::{Actor, Result, Store, Tx};

/// An answer as its client was told it: what a repeat of the request is told again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// SHA-256 of the request's method, path and body.
    pub fingerprint: [u8; 32],
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// The same statements on either backend (`$N` placeholders, `ON CONFLICT`, window
/// functions), stamped out per sqlx database type.
macro_rules! kept_queries {
    ($db:ty) => {
        use super::super::{Actor, Result, StoreError};
        use super::Kept;

        type Conn = <$db as sqlx::Database>::Connection;

        pub async fn keep(conn: &mut Conn, by: &Actor, key: &str, kept: &Kept, at: i64) -> Result<bool> {
            let done = sqlx::query(
                "INSERT INTO idempotency (actor, key, fingerprint, status, content_type, size, body, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (actor, key) DO NOTHING",
            )
            .bind(by.as_str())
            .bind(key)
            .bind(&kept.fingerprint[..])
            .bind(i64::from(kept.status))
            .bind(kept.content_type.as_deref())
            .bind(kept.body.len() as i64)
            .bind(&kept.body[..])
            .bind(at)
            .execute(&mut *conn)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        pub async fn kept(conn: &mut Conn, by: &Actor, key: &str, since: i64) -> Result<Option<Kept>> {
            let row: Option<(Vec<u8>, i64, Option<String>, Vec<u8>)> = sqlx::query_as(
                "SELECT fingerprint, status, content_type, body FROM idempotency \
                 WHERE actor = $1 AND key = $2 AND created_at >= $3",
            )
            .bind(by.as_str())
            .bind(key)
            .bind(since)
            .fetch_optional(&mut *conn)
            .await?;
            row.map(|(fingerprint, status, content_type, body)| {
                let corrupt = || StoreError::Corrupt(format!("kept answer of {by}'s key {key:?}"));
                Ok(Kept {
                    fingerprint: fingerprint.try_into().map_err(|_| corrupt())?,
                    status: u16::try_from(status).map_err(|_| corrupt())?,
                    content_type,
                    body,
                })
            })
            .transpose()
        }

        pub async fn forget(conn: &mut Conn, before: i64, most: i64, most_bytes: i64) -> Result<u64> {
            let old = sqlx::query("DELETE FROM idempotency WHERE created_at < $1")
                .bind(before)
                .execute(&mut *conn)
                .await?;
            // Each actor's newest answers up to the bounds stay; only actors past one are
            // ranked.
            let over = sqlx::query(
                "DELETE FROM idempotency WHERE (actor, key) IN ( \
                   SELECT actor, key FROM ( \
                     SELECT actor, key, \
                       row_number() OVER (PARTITION BY actor ORDER BY created_at DESC, key) AS n, \
                       sum(size) OVER (PARTITION BY actor ORDER BY created_at DESC, key) AS bytes \
                     FROM idempotency WHERE actor IN ( \
                       SELECT actor FROM idempotency GROUP BY actor \
                       HAVING count(*) > $1 OR sum(size) > $2)) AS ranked \
                   WHERE n > $1 OR bytes > $2)",
            )
            .bind(most)
            .bind(most_bytes)
            .execute(&mut *conn)
            .await?;
            Ok(old.rows_affected() + over.rows_affected())
        }
    };
}

mod sqlite {
    use sqlx::Sqlite;
    kept_queries!(Sqlite);
}

mod postgres {
    use sqlx::Postgres;
    kept_queries!(Postgres);
}

impl Tx {
    /// Keeps `kept` as the answer to `by`'s key `key`, in this transaction: `false` when an
    /// answer is kept for that key already (another request with it committed first).
    pub async fn keep(&mut self, by: &Actor, key: &str, kept: &Kept, at: i64) -> Result<bool> {
        match self {
            Tx::Sqlite(tx, health) => {
                let done = sqlite::keep(tx, by, key, kept, at).await;
                health.observe(&done);
                done
            }
            Tx::Postgres(tx) => postgres::keep(tx, by, key, kept, at).await,
        }
    }
}

impl Store {
    /// The answer kept for `by`'s key `key`, if one was kept at or after `since` (Unix ms).
    pub async fn kept(&self, by: &Actor, key: &str, since: i64) -> Result<Option<Kept>> {
        match self {
            Store::Sqlite(pools) => {
                let mut conn = pools.reads.acquire().await?;
                sqlite::kept(&mut conn, by, key, since).await
            }
            Store::Postgres(pool) => {
                let mut conn = pool.acquire().await?;
                postgres::kept(&mut conn, by, key, since).await
            }
        }
    }

    /// Keeps `kept` for `by`'s key `key` in a statement of its own; `false` when an answer
    /// was kept for it already.
    pub async fn keep_alone(&self, by: &Actor, key: &str, kept: &Kept, at: i64) -> Result<bool> {
        match self {
            Store::Sqlite(pools) => {
                let mut conn = pools.writes.acquire().await?;
                let done = sqlite::keep(&mut conn, by, key, kept, at).await;
                pools.health.observe(&done);
                done
            }
            Store::Postgres(pool) => {
                let mut conn = pool.acquire().await?;
                postgres::keep(&mut conn, by, key, kept, at).await
            }
        }
    }

    /// Forgets the answers kept before `before` (Unix ms), and each actor's oldest past its
    /// newest `most`, or past `most_bytes` of bodies. Answers how many went.
    pub async fn forget_kept(&self, before: i64, most: i64, most_bytes: i64) -> Result<u64> {
        match self {
            Store::Sqlite(pools) => {
                let mut conn = pools.writes.acquire().await?;
                let done = sqlite::forget(&mut conn, before, most, most_bytes).await;
                pools.health.observe(&done);
                done
            }
            Store::Postgres(pool) => {
                let mut conn = pool.acquire().await?;
                postgres::forget(&mut conn, before, most, most_bytes).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(size: usize) -> Kept {
        Kept {
            fingerprint: [7; 32],
            status: 201,
            content_type: Some("application/json".into()),
            body: vec![b'x'; size],
        }
    }

    async fn kept_keys(store: &Store, by: &Actor, keys: impl Iterator<Item = String>) -> usize {
        let mut held = 0;
        for key in keys {
            held += usize::from(store.kept(by, &key, 0).await.unwrap().is_some());
        }
        held
    }

    #[tokio::test]
    async fn answers_are_forgotten_by_age_and_past_each_actors_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("k.db").display());
        let store = Store::connect(&url).await.unwrap();
        let (busy, quiet) = (Actor::new("busy"), Actor::new("quiet"));
        for i in 0..20 {
            store
                .keep_alone(&busy, &format!("k{i}"), &answer(10), 1000 + i)
                .await
                .unwrap();
        }
        for i in 0..3 {
            store
                .keep_alone(&quiet, &format!("k{i}"), &answer(10), i)
                .await
                .unwrap();
        }
        assert!(
            !store
                .keep_alone(&busy, "k0", &answer(99), 5000)
                .await
                .unwrap(),
            "a key keeps its first answer"
        );
        assert_eq!(
            store
                .kept(&busy, "k0", 0)
                .await
                .unwrap()
                .unwrap()
                .body
                .len(),
            10
        );

        // At most 10 per actor: the busy one's 10 newest stay, the quiet one is untouched.
        assert_eq!(store.forget_kept(0, 10, 1 << 20).await.unwrap(), 10);
        assert_eq!(
            kept_keys(&store, &busy, (10..20).map(|i| format!("k{i}"))).await,
            10
        );
        assert_eq!(
            kept_keys(&store, &busy, (0..10).map(|i| format!("k{i}"))).await,
            0
        );
        assert_eq!(
            kept_keys(&store, &quiet, (0..3).map(|i| format!("k{i}"))).await,
            3
        );
        // At most 35 bytes per actor: 3 answers of 10.
        assert_eq!(store.forget_kept(0, 10, 35).await.unwrap(), 7);
        assert_eq!(
            kept_keys(&store, &busy, (17..20).map(|i| format!("k{i}"))).await,
            3
        );
        // Older than the age bound.
        assert_eq!(store.forget_kept(1018, 10, 1 << 20).await.unwrap(), 4);
        assert_eq!(
            kept_keys(&store, &busy, (18..20).map(|i| format!("k{i}"))).await,
            2
        );
        // A kept answer older than the caller's window is not replayed.
        assert!(store.kept(&busy, "k19", 1020).await.unwrap().is_none());
    }
}
