//! Group commit: single allocations that arrive together share one transaction, so one
//! disk sync acknowledges them all. Every answer still waits for its own commit.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot};

use super::{Allocated, Error, NewAccount, Registry};

/// Most allocations one transaction takes.
const MAX_GROUP: usize = 256;

/// An allocation waiting for the next group.
pub(super) struct Pending {
    request: NewAccount,
    reply: oneshot::Sender<Result<Allocated, Error>>,
}

impl Registry {
    /// Starts the task that commits queued allocations in groups.
    pub(super) fn start_group_commit(self: &Arc<Self>) -> mpsc::Sender<Pending> {
        let (queue, mut waiting) = mpsc::channel::<Pending>(4 * MAX_GROUP);
        let registry: Weak<Registry> = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(first) = waiting.recv().await {
                let mut group = vec![first];
                // Allocations sent together reach this queue one request at a time, as the
                // server reads them: let the ones already read arrive before committing, or
                // a busy server alternates between a group of one and a group of the rest.
                // Each yield lets ready requests run; a round that brings none ends the wait.
                loop {
                    tokio::task::yield_now().await;
                    let before = group.len();
                    while group.len() < MAX_GROUP {
                        match waiting.try_recv() {
                            Ok(next) => group.push(next),
                            Err(_) => break,
                        }
                    }
                    if group.len() == before || group.len() == MAX_GROUP {
                        break;
                    }
                }
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                let (size, started) = (group.len(), std::time::Instant::now());
                registry.commit_group(group).await;
                tracing::debug!(
                    size,
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "allocation group committed"
                );
            }
        });
        queue
    }

    /// Queues one allocation for the next group and waits for its commit.
    pub(super) async fn allocate_in_group(&self, request: NewAccount) -> Result<Allocated, Error> {
        let (reply, answer) = oneshot::channel();
        let queue = self.group.get().expect("group commit started in open");
        queue
            .send(Pending { request, reply })
            .await
            .map_err(|_| Error::Unavailable)?;
        answer.await.map_err(|_| Error::Unavailable)?
    }

    async fn commit_group(self: &Arc<Self>, group: Vec<Pending>) {
        // One request per account; a second ask for the same account shares the answer.
        let mut requests: Vec<NewAccount> = Vec::with_capacity(group.len());
        let mut replies: Vec<Vec<oneshot::Sender<Result<Allocated, Error>>>> = Vec::new();
        let mut position: HashMap<_, usize> = HashMap::new();
        for Pending { request, reply } in group {
            match position.get(&request.account) {
                Some(&i) => replies[i].push(reply),
                None => {
                    position.insert(request.account.clone(), requests.len());
                    requests.push(request);
                    replies.push(vec![reply]);
                }
            }
        }
        let single = requests.len() == 1 && replies[0].len() == 1;
        match self.allocate_many(requests.clone()).await {
            Ok(answers) => {
                for (answer, senders) in answers.into_iter().zip(replies) {
                    let existing = match &answer {
                        Allocated::Created(a) | Allocated::Existing(a) => {
                            Allocated::Existing(a.clone())
                        }
                    };
                    let mut senders = senders.into_iter();
                    let _ = senders
                        .next()
                        .expect("one sender at least")
                        .send(Ok(answer));
                    for later in senders {
                        let _ = later.send(Ok(existing.clone()));
                    }
                }
            }
            Err(err) if single => {
                let _ = replies
                    .pop()
                    .and_then(|mut s| s.pop())
                    .expect("one sender")
                    .send(Err(err));
            }
            // One bad request (the keyspace full, say) must not fail the others: each
            // one again on its own, so every caller gets its own answer.
            Err(_) => {
                for (request, senders) in requests.into_iter().zip(replies) {
                    for reply in senders {
                        let answer = self
                            .allocate_many(vec![request.clone()])
                            .await
                            .map(|mut a| a.pop().expect("one answer"));
                        let _ = reply.send(answer);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{AccountId, Keyspace};
    use crate::store::Store;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_allocations_share_transactions() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("k.db").display());
        let store = Store::connect(&url).await.unwrap();
        let registry = Registry::open(store.clone(), Keyspace::KINESIS, None)
            .await
            .unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..64 {
            let registry = Arc::clone(&registry);
            let account = AccountId::parse(format!("acct-{i}")).unwrap();
            tasks.spawn(async move { registry.allocate(account, 1).await });
        }
        while let Some(answer) = tasks.join_next().await {
            assert!(matches!(answer.unwrap(), Ok(Allocated::Created(_))));
        }
        // 64 allocations queued at once take far fewer than 64 transactions.
        let events = store.events_after(0, 1000).await.unwrap();
        assert_eq!(events.len(), 64);
        let groups = registry.allocation_groups();
        assert!(groups < 16, "{groups} transactions for 64 allocations");
    }
}
