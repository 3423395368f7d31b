//! Group commit without an actor: items that arrive while every applier is busy wait for the
//! next batch. An item that finds an applier's place free leads (its caller starts an
//! applying task); the task takes what waits, batch after batch, until none does. Used for
//! single reports (`queue::service::report`, one applier) and for claims (`queue::claims`,
//! one group per action, up to `queue.claims_in_flight` statements at once).

use std::sync::Mutex;

use tokio::sync::oneshot;

/// One value per job action (a group commit per action, say).
pub(crate) struct PerAction<T>([T; 4]);

impl<T> PerAction<T> {
    pub(crate) fn new(mut make: impl FnMut() -> T) -> Self {
        Self(std::array::from_fn(|_| make()))
    }

    pub(crate) fn of(&self, action: crate::domain::JobAction) -> &T {
        let index = crate::domain::JobAction::ALL
            .iter()
            .position(|a| *a == action)
            .unwrap_or(0);
        &self.0[index]
    }
}

/// An item waiting, with where its answer goes.
type Waiting<T, O> = (T, oneshot::Sender<O>);

/// The items waiting, and how many tasks are applying batches.
struct State<T, O> {
    waiting: Vec<Waiting<T, O>>,
    applying: usize,
}

pub(crate) struct GroupCommit<T, O> {
    state: Mutex<State<T, O>>,
    /// Applying tasks at most (1: one batch at a time).
    appliers: usize,
}

impl<T, O> Default for GroupCommit<T, O> {
    fn default() -> Self {
        Self::new(1)
    }
}

impl<T, O> GroupCommit<T, O> {
    /// A group with up to `appliers` batches applied at once (at least one).
    pub(crate) fn new(appliers: usize) -> Self {
        Self {
            state: Mutex::new(State {
                waiting: Vec::new(),
                applying: 0,
            }),
            appliers: appliers.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T, O>> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `item`; answers where its outcome will come, and whether the caller leads
    /// (must start a task that applies with [`GroupCommit::next_batch`] until it is `None`).
    pub(crate) fn push(&self, item: T) -> (oneshot::Receiver<O>, bool) {
        let (reply, answer) = oneshot::channel();
        let mut state = self.lock();
        state.waiting.push((item, reply));
        let lead = state.applying < self.appliers;
        if lead {
            state.applying += 1;
        }
        (answer, lead)
    }

    /// An applying task is unwinding (a bug): its place is free again, so the next item to
    /// arrive leads and its task takes what still waits.
    pub(crate) fn abandon(&self) {
        let mut state = self.lock();
        state.applying = state.applying.saturating_sub(1);
    }

    /// Up to `max` waiting items; `None` once none waits (the applying ends with it).
    pub(crate) fn next_batch(&self, max: usize) -> Option<Vec<Waiting<T, O>>> {
        let mut state = self.lock();
        if state.waiting.is_empty() {
            state.applying = state.applying.saturating_sub(1);
            return None;
        }
        let take = state.waiting.len().min(max);
        Some(state.waiting.drain(..take).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_leads_the_rest_wait_for_the_next_batch() {
        let group: GroupCommit<u32, u32> = GroupCommit::default();
        let (_a, lead_a) = group.push(1);
        let (_b, lead_b) = group.push(2);
        assert!(lead_a && !lead_b);
        let batch = group.next_batch(10).unwrap();
        assert_eq!(batch.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1, 2]);
        // Applying: a newcomer does not lead; it is in the next batch.
        let (_c, lead_c) = group.push(3);
        assert!(!lead_c);
        assert_eq!(group.next_batch(10).unwrap().len(), 1);
        assert!(group.next_batch(10).is_none());
        // Done: the next item leads again.
        assert!(group.push(4).1);
        // A leader that unwound mid-batch: the next item leads, and what waited is taken.
        group.abandon();
        assert!(group.push(5).1);
        assert_eq!(group.next_batch(10).unwrap().len(), 2);
    }

    #[test]
    fn up_to_the_appliers_lead_at_once_then_items_wait() {
        let group: GroupCommit<u32, u32> = GroupCommit::new(2);
        assert!(group.push(1).1);
        assert!(group.push(2).1);
        // Both places taken: the third waits for whichever applier asks next.
        assert!(!group.push(3).1);
        assert_eq!(group.next_batch(10).unwrap().len(), 3);
        // The first applier finds none and ends; a newcomer leads in its place.
        assert!(group.next_batch(10).is_none());
        assert!(group.push(4).1);
        assert!(!group.push(5).1);
        assert_eq!(group.next_batch(1).unwrap().len(), 1);
        assert_eq!(group.next_batch(1).unwrap().len(), 1);
        assert!(group.next_batch(1).is_none());
        assert!(group.next_batch(1).is_none());
        assert!(group.push(6).1);
    }
}
