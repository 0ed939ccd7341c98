//! Group commit: single allocations that arrive together share one transaction, and so do
//! single releases, so one disk sync acknowledges them all. Every answer still waits for
//! its own commit.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot};

use super::{Allocated, Error, NewAccount, Registry, Ticket};
use crate::keyspace::AccountId;
use crate::store::{Actor, Assignment};

/// Most changes one transaction takes.
const MAX_GROUP: usize = 256;

/// Longest a group waits for the callers of the last one to come back (the timer's
/// resolution is a millisecond, so it may be up to twice that).
const LINGER: std::time::Duration = std::time::Duration::from_millis(1);

/// A change waiting for the next group of its kind, and where its answer goes.
pub(super) struct Pending<R, A> {
    request: R,
    reply: oneshot::Sender<Result<A, Error>>,
}

/// The queues single changes wait in, each with the actor that asked for it (a group's
/// events each record their own request's) and its ticket.
#[derive(Debug)]
pub(super) struct Queues {
    allocations: mpsc::Sender<Pending<(NewAccount, Actor, Ticket), Allocated>>,
    releases: mpsc::Sender<Pending<(AccountId, Actor, Ticket), Assignment>>,
}

impl Registry {
    /// Starts the tasks that commit queued allocations and releases in groups.
    pub(super) fn start_group_commit(self: &Arc<Self>) -> Queues {
        Queues {
            allocations: self.start_grouping("allocation", |registry, group| async move {
                registry.commit_allocations(group).await
            }),
            releases: self.start_grouping("release", |registry, group| async move {
                registry.commit_releases(group).await
            }),
        }
    }

    /// Starts a task that gathers what arrives on a queue into groups and hands each
    /// group to `commit`, one group at a time.
    fn start_grouping<R, A, F, Fut>(
        self: &Arc<Self>,
        kind: &'static str,
        commit: F,
    ) -> mpsc::Sender<Pending<R, A>>
    where
        R: Send + 'static,
        A: Send + 'static,
        F: Fn(Arc<Registry>, Vec<Pending<R, A>>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let (queue, mut waiting) = mpsc::channel::<Pending<R, A>>(4 * MAX_GROUP);
        let registry: Weak<Registry> = Arc::downgrade(self);
        tokio::spawn(async move {
            // The size of the last group: under load, about as many callers come back.
            let mut expected = 1;
            while let Some(first) = waiting.recv().await {
                let mut group = vec![first];
                // Changes sent together reach this queue one request at a time, as the
                // server reads them: let the ones already read arrive before committing, or
                // a busy server alternates between a group of one and a group of the rest.
                // Each yield lets ready requests run; a round that brings none ends the wait.
                loop {
                    tokio::task::yield_now().await;
                    let before = group.len();
                    take_queued(&mut waiting, &mut group);
                    if group.len() == before || group.len() == MAX_GROUP {
                        break;
                    }
                }
                // The callers the last group answered may still be sending their next
                // changes: wait a little for as many as that group held, rather than commit
                // a few now and the rest one commit later.
                let until = tokio::time::Instant::now() + LINGER;
                while group.len() < expected.min(MAX_GROUP) {
                    match tokio::time::timeout_at(until, waiting.recv()).await {
                        Ok(Some(next)) => {
                            group.push(next);
                            take_queued(&mut waiting, &mut group);
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
                expected = group.len();
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                let (size, started) = (group.len(), std::time::Instant::now());
                commit(registry, group).await;
                tracing::debug!(
                    kind,
                    size,
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "group committed"
                );
            }
        });
        queue
    }

    /// Queues one allocation for the next group and waits for its commit.
    pub(super) async fn allocate_in_group(
        &self,
        request: (NewAccount, Actor, Ticket),
    ) -> Result<Allocated, Error> {
        let queues = self.group.get().expect("group commit started in open");
        wait_in(&queues.allocations, request).await
    }

    /// Queues one release for the next group and waits for its commit.
    pub(super) async fn release_in_group(
        &self,
        request: (AccountId, Actor, Ticket),
    ) -> Result<Assignment, Error> {
        let queues = self.group.get().expect("group commit started in open");
        wait_in(&queues.releases, request).await
    }

    async fn commit_allocations(
        self: &Arc<Self>,
        group: Vec<Pending<(NewAccount, Actor, Ticket), Allocated>>,
    ) {
        let allocate = |requests| async move {
            let answers = self.allocate_each(requests, false).await?;
            Ok(answers.into_iter().map(Ok).collect())
        };
        // A second ask for the same account finds the key the first one got.
        let again = |first: &Result<Allocated, Error>,
                     (request, ..): &(NewAccount, Actor, Ticket)| match first {
            Ok(Allocated::Created(a) | Allocated::Existing(a)) => {
                Ok(Allocated::Existing(a.clone()))
            }
            // Not reached: an allocation group answers every request or fails as a whole.
            Err(_) => Err(Error::NotFound(request.account.clone())),
        };
        commit_group(group, |(r, ..)| &r.account, |(.., t)| t, allocate, again).await;
    }

    async fn commit_releases(
        self: &Arc<Self>,
        group: Vec<Pending<(AccountId, Actor, Ticket), Assignment>>,
    ) {
        let release = |accounts| self.release_many(accounts);
        // A second release of the same account comes after the first, as if one by one:
        // it finds nothing to release.
        let again = |_: &Result<Assignment, Error>, (account, ..): &(AccountId, Actor, Ticket)| {
            Err(Error::NotFound(account.clone()))
        };
        commit_group(group, |(account, ..)| account, |(.., t)| t, release, again).await;
    }
}

/// Commits `group` in one transaction through `commit`, which takes one request per
/// account and answers each in order, or fails as a whole. A second ask for an account
/// in the group gets `again(first answer, request)`. If the transaction fails, each
/// request is committed again on its own: one bad request (the keyspace full, a row
/// another writer changed, a caller that gave up at the commit point) must not fail the
/// others, and every caller gets its own answer.
async fn commit_group<R, A, F, Fut>(
    group: Vec<Pending<R, A>>,
    account: impl Fn(&R) -> &AccountId,
    ticket: impl Fn(&R) -> &Ticket,
    commit: F,
    again: impl Fn(&Result<A, Error>, &R) -> Result<A, Error>,
) where
    R: Clone,
    F: Fn(Vec<R>) -> Fut,
    Fut: Future<Output = Result<Vec<Result<A, Error>>, Error>>,
{
    // A change whose caller stopped waiting (answered 503 already), or whose deadline
    // passed while it queued, is never made: refused now, for good.
    let (group, late): (Vec<_>, Vec<_>) = group
        .into_iter()
        .partition(|p| !p.reply.is_closed() && ticket(&p.request).wanted());
    for p in late {
        ticket(&p.request).refuse();
        let _ = p.reply.send(Err(Error::NotMade));
    }
    if group.is_empty() {
        return;
    }
    let (requests, replies) = by_account(group, account);
    let single = requests.len() == 1 && replies[0].len() == 1;
    match commit(requests.clone()).await {
        Ok(answers) => {
            for ((answer, senders), request) in answers.into_iter().zip(replies).zip(&requests) {
                let mut senders = senders.into_iter();
                let first = senders.next().expect("one sender at least");
                for later in senders {
                    let _ = later.send(again(&answer, request));
                }
                let _ = first.send(answer);
            }
        }
        Err(err) if single => send_only(replies, Err(err)),
        // The database failed, not one request: each again alone would only wait again.
        Err(Error::Unavailable) => {
            for reply in replies.into_iter().flatten() {
                let _ = reply.send(Err(Error::Unavailable));
            }
        }
        // The group's COMMIT was sent and its answer lost: every change in it may or may
        // not have been made, and none may be tried again as if it had not.
        Err(Error::OutcomeUnknown(cause)) => {
            for reply in replies.into_iter().flatten() {
                let _ = reply.send(Err(Error::OutcomeUnknown(cause.clone())));
            }
        }
        Err(_) => {
            for (request, senders) in requests.into_iter().zip(replies) {
                for reply in senders.into_iter().filter(|r| !r.is_closed()) {
                    if !ticket(&request).wanted() {
                        ticket(&request).refuse();
                        let _ = reply.send(Err(Error::NotMade));
                        continue;
                    }
                    let answer = commit(vec![request.clone()])
                        .await
                        .and_then(|mut answers| answers.pop().expect("one answer"));
                    let _ = reply.send(answer);
                }
            }
        }
    }
}

/// Moves what is already queued into `group`, up to [`MAX_GROUP`].
fn take_queued<T>(waiting: &mut mpsc::Receiver<T>, group: &mut Vec<T>) {
    while group.len() < MAX_GROUP {
        match waiting.try_recv() {
            Ok(next) => group.push(next),
            Err(_) => break,
        }
    }
}

/// Sends `request` down `queue` and waits for its answer.
async fn wait_in<R, A>(queue: &mpsc::Sender<Pending<R, A>>, request: R) -> Result<A, Error> {
    let (reply, answer) = oneshot::channel();
    queue
        .send(Pending { request, reply })
        .await
        .map_err(|_| Error::Unavailable)?;
    answer.await.map_err(|_| Error::Unavailable)?
}

type Replies<A> = Vec<Vec<oneshot::Sender<Result<A, Error>>>>;

/// The group's requests with one per account (the first), each with every reply that
/// waits on that account, in arrival order.
fn by_account<R, A>(
    group: Vec<Pending<R, A>>,
    account: impl Fn(&R) -> &AccountId,
) -> (Vec<R>, Replies<A>) {
    let mut requests: Vec<R> = Vec::with_capacity(group.len());
    let mut replies: Replies<A> = Vec::new();
    let mut position: HashMap<AccountId, usize> = HashMap::new();
    for Pending { request, reply } in group {
        match position.get(account(&request)) {
            Some(&i) => replies[i].push(reply),
            None => {
                position.insert(account(&request).clone(), requests.len());
                requests.push(request);
                replies.push(vec![reply]);
            }
        }
    }
    (requests, replies)
}

/// Answers the group's only request.
fn send_only<A>(mut replies: Replies<A>, answer: Result<A, Error>) {
    let reply = replies.pop().and_then(|mut s| s.pop()).expect("one sender");
    let _ = reply.send(answer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{AccountId, Keyspace};
    use crate::store::Store;

    async fn open() -> (tempfile::TempDir, Store, Arc<Registry>) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("k.db").display());
        let store = Store::connect(&url).await.unwrap();
        let registry = Registry::open(store.clone(), Keyspace::KINESIS, None)
            .await
            .unwrap();
        (dir, store, registry)
    }

    fn account(i: usize) -> AccountId {
        AccountId::parse(format!("acct-{i}")).unwrap()
    }

    /// A client of its own for each account.
    fn by(i: usize) -> Actor {
        Actor::new(&format!("client-{i}"))
    }

    /// Asserts that every event of the log records the actor of its own account's request.
    async fn each_by_its_own(store: &Store) {
        for logged in store.log(0, 1000).await.unwrap() {
            let account = match &logged.event.change {
                crate::store::Change::Allocate { account, .. }
                | crate::store::Change::Release { account, .. } => account,
                other => panic!("unexpected {other:?}"),
            };
            let i: usize = account
                .as_str()
                .trim_start_matches("acct-")
                .parse()
                .unwrap();
            assert_eq!(logged.actor, by(i), "{logged:?}");
        }
    }

    /// Under load, the callers a group answered come back one by one, as the server reads
    /// their next requests: the first one back is not committed alone while the others
    /// are on their way.
    #[tokio::test]
    async fn a_group_waits_for_the_callers_of_the_last_one() {
        let (_dir, _store, registry) = open().await;
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = Arc::clone(&sizes);
        let queue = registry.start_grouping("test", move |_, group: Vec<Pending<u32, u32>>| {
            recorded.lock().unwrap().push(group.len());
            for Pending { request, reply } in group {
                let _ = reply.send(Ok(request));
            }
            async {}
        });
        // Four callers, three changes each; after each answer, caller 0 sends its next
        // change at once and the others a few scheduler rounds later.
        let callers: Vec<_> = (0..4u32)
            .map(|caller| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    for _ in 0..3 {
                        assert_eq!(wait_in(&queue, caller).await.unwrap(), caller);
                        for _ in 0..10 * caller {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.await.unwrap();
        }
        assert_eq!(*sizes.lock().unwrap(), [4, 4, 4]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_allocations_share_transactions() {
        let (_dir, store, registry) = open().await;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..64 {
            let registry = Arc::clone(&registry);
            tasks.spawn(async move {
                registry
                    .allocate(account(i), 1, 1, &by(i), &Ticket::unbounded())
                    .await
            });
        }
        while let Some(answer) = tasks.join_next().await {
            assert!(matches!(answer.unwrap(), Ok(Allocated::Created(_))));
        }
        // 64 allocations queued at once take far fewer than 64 transactions.
        let events = store.events_after(0, 1000).await.unwrap();
        assert_eq!(events.len(), 64);
        each_by_its_own(&store).await;
        let transactions = registry.transactions();
        assert!(
            transactions < 16,
            "{transactions} transactions for 64 allocations"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_releases_share_transactions_and_each_gets_its_answer() {
        let (_dir, store, registry) = open().await;
        let mut keys = HashMap::new();
        for i in 0..64 {
            let Allocated::Created(a) = registry
                .allocate(account(i), 1, 1, &by(i), &Ticket::unbounded())
                .await
                .unwrap()
            else {
                panic!("acct-{i} existed");
            };
            keys.insert(a.account.clone(), a.hash_key());
        }
        let before = registry.transactions();
        // Every account released once, acct-0 twice, and one that never had a key.
        let mut tasks = tokio::task::JoinSet::new();
        for i in (0..64).chain([0, 1000]) {
            let registry = Arc::clone(&registry);
            tasks.spawn(async move {
                (
                    i,
                    registry
                        .release(account(i), &by(i), &Ticket::unbounded())
                        .await,
                )
            });
        }
        let (mut released, mut not_found) = (Vec::new(), Vec::new());
        while let Some(answer) = tasks.join_next().await {
            match answer.unwrap() {
                (_, Ok(a)) => {
                    assert_eq!(Some(&a.hash_key()), keys.get(&a.account), "{}", a.account);
                    released.push(a.account);
                }
                (i, Err(Error::NotFound(a))) => {
                    assert_eq!(a, account(i));
                    not_found.push(i);
                }
                (i, Err(err)) => panic!("acct-{i}: {err}"),
            }
        }
        released.sort();
        released.dedup();
        not_found.sort();
        assert_eq!(released.len(), 64, "every account released once");
        assert_eq!(not_found, [0, 1000], "the second release and the stranger");
        let transactions = registry.transactions() - before;
        assert!(
            transactions < 16,
            "{transactions} transactions for 64 releases"
        );
        // Committed, in the database and in memory.
        assert!(store.list(None, 100, 16_384).await.unwrap().0.is_empty());
        assert!(registry.lookup("acct-5").is_none());
        let events = store.events_after(0, 1000).await.unwrap();
        assert_eq!(events.len(), 128);
        each_by_its_own(&store).await;
    }
}
