//! A change's ticket: what its caller and the change agree on, so that an answer is always
//! the outcome. The caller may give up on a change (answer 503 or 408) only while the
//! change has not reached its commit point; the change may commit only while its caller
//! still waits and its deadline has not passed. Whichever comes first decides, once.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::keep::Keep;

/// Neither side has decided yet.
const PENDING: u8 = 0;
/// The change is past its commit point: its caller waits for the commit's result.
const COMMITTING: u8 = 1;
/// The caller stopped waiting, or the deadline passed: the change is never made.
const REFUSED: u8 = 2;

/// Shared between a change and the request waiting for it (cheap to clone).
#[derive(Debug, Clone)]
pub struct Ticket(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    state: AtomicU8,
    /// The change commits before this instant, or not at all.
    deadline: Option<Instant>,
    /// The request's Idempotency-Key, if it sent one, and how its answer is told.
    keep: OnceLock<Keep>,
    /// Whether the change kept its answer in its own transaction.
    kept: AtomicBool,
}

impl Ticket {
    /// A ticket whose change must reach its commit point within `budget` from now.
    pub fn new(budget: Duration) -> Ticket {
        Ticket::with_deadline(Instant::now().checked_add(budget))
    }

    /// A ticket whose change must reach its commit point before `deadline` (`None`: no
    /// deadline).
    pub fn with_deadline(deadline: Option<Instant>) -> Ticket {
        Ticket(Arc::new(Inner {
            state: AtomicU8::new(PENDING),
            deadline,
            keep: OnceLock::new(),
            kept: AtomicBool::new(false),
        }))
    }

    /// A ticket for work with no caller to answer in time: the controller's rounds, an
    /// import, start-up.
    pub fn unbounded() -> Ticket {
        Ticket::with_deadline(None)
    }

    /// The instant by which the change must reach its commit point, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.0.deadline
    }

    /// Whether the change may still be made: nobody refused it and its deadline has not
    /// passed. Work that is not wanted any more is skipped before it starts.
    pub fn wanted(&self) -> bool {
        match self.0.state.load(Ordering::Acquire) {
            PENDING => !self.overdue(),
            COMMITTING => true,
            _ => false,
        }
    }

    /// The change's commit point, just before it sends COMMIT under the write lock: `true`
    /// when it may commit (its caller then waits for the result, whatever the clock says);
    /// `false` when it was refused, or its deadline passed (it is refused now), and the
    /// change must roll back. A ticket already past its commit point passes again (a
    /// change of several transactions decides with its first).
    pub fn commit_point(&self) -> bool {
        if self.overdue() {
            let _ = self.0.state.compare_exchange(
                PENDING,
                REFUSED,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        match self.0.state.compare_exchange(
            PENDING,
            COMMITTING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(now) => now == COMMITTING,
        }
    }

    /// Back before the commit point: the transaction it was for was rolled back by the
    /// database (a definite failure), so the change is not made, and may be tried again.
    pub fn rolled_back(&self) {
        let _ =
            self.0
                .state
                .compare_exchange(COMMITTING, PENDING, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The caller gives up: `true` when the change is now refused for good (it had not
    /// reached its commit point, or already was refused), `false` when it is committing
    /// and the caller must wait for its result instead.
    pub fn refuse(&self) -> bool {
        match self
            .0
            .state
            .compare_exchange(PENDING, REFUSED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == REFUSED,
        }
    }

    /// Gives the change the request's Idempotency-Key and how its answer is told (once).
    pub fn set_keep(&self, keep: Keep) {
        let _ = self.0.keep.set(keep);
    }

    /// The request's Idempotency-Key, if it sent one.
    pub fn keep(&self) -> Option<&Keep> {
        self.0.keep.get()
    }

    /// Whether the change kept its answer in its own transaction (else, if its answer is
    /// one to keep, it made no change, and the answer is kept on its own).
    pub fn was_kept(&self) -> bool {
        self.0.kept.load(Ordering::Acquire)
    }

    pub(super) fn note_kept(&self) {
        self.0.kept.store(true, Ordering::Release);
    }

    fn overdue(&self) -> bool {
        self.0.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// Passes every ticket's commit point together, or none: when one of them was refused,
/// the ones already passed go back, and the refused ones are answered (`Err` with their
/// positions) so the change can be decided again without them.
pub fn commit_all(tickets: &[&Ticket]) -> Result<(), Vec<usize>> {
    let refused: Vec<usize> = (tickets.iter().enumerate())
        .filter(|(_, t)| !t.commit_point())
        .map(|(i, _)| i)
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    for (i, ticket) in tickets.iter().enumerate() {
        if !refused.contains(&i) {
            ticket.rolled_back();
        }
    }
    Err(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_to_decide_wins() {
        let committed = Ticket::new(Duration::from_secs(60));
        assert!(committed.commit_point());
        assert!(!committed.refuse(), "a committing change is waited for");
        assert!(
            committed.commit_point(),
            "a second transaction of it passes too"
        );

        let refused = Ticket::new(Duration::from_secs(60));
        assert!(refused.refuse());
        assert!(refused.refuse(), "refusing twice is still a refusal");
        assert!(!refused.commit_point(), "a refused change never commits");
        assert!(!refused.wanted());
    }

    #[test]
    fn a_passed_deadline_refuses_at_the_commit_point() {
        let late = Ticket::with_deadline(Some(Instant::now()));
        assert!(!late.wanted());
        assert!(!late.commit_point());
        assert!(late.refuse(), "the caller sees the refusal the change made");
        assert!(Ticket::unbounded().commit_point());
    }

    #[test]
    fn a_rolled_back_commit_may_be_refused_or_tried_again() {
        let ticket = Ticket::new(Duration::from_secs(60));
        assert!(ticket.commit_point());
        ticket.rolled_back();
        assert!(ticket.wanted());
        assert!(ticket.refuse());
    }

    #[test]
    fn a_group_passes_together_or_not_at_all() {
        let (a, b, c) = (
            Ticket::new(Duration::from_secs(60)),
            Ticket::new(Duration::from_secs(60)),
            Ticket::new(Duration::from_secs(60)),
        );
        assert!(b.refuse());
        assert_eq!(commit_all(&[&a, &b, &c]), Err(vec![1]));
        // The others went back: their callers may still give up on them.
        assert!(a.refuse());
        assert!(c.wanted());
        assert_eq!(commit_all(&[&c]), Ok(()));
        assert!(!c.refuse());
    }
}
