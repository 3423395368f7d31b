//! Group commit without an actor: items that arrive while a batch is being applied wait for
//! the next. The first item to find no batch applying leads (its caller starts the applying
//! task); the task takes what waits, batch after batch, until none does. Used for single
//! reports (`queue::service::report`).

use std::sync::Mutex;

use tokio::sync::oneshot;

/// An item waiting, with where its answer goes.
type Waiting<T, O> = (T, oneshot::Sender<O>);

/// The items waiting, and whether a batch is being applied.
struct State<T, O> {
    waiting: Vec<Waiting<T, O>>,
    applying: bool,
}

pub(crate) struct GroupCommit<T, O> {
    state: Mutex<State<T, O>>,
}

impl<T, O> Default for GroupCommit<T, O> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                waiting: Vec::new(),
                applying: false,
            }),
        }
    }
}

impl<T, O> GroupCommit<T, O> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<T, O>> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `item`; answers where its outcome will come, and whether the caller leads
    /// (must start a task that applies with [`GroupCommit::next_batch`] until it is `None`).
    pub(crate) fn push(&self, item: T) -> (oneshot::Receiver<O>, bool) {
        let (reply, answer) = oneshot::channel();
        let mut state = self.lock();
        state.waiting.push((item, reply));
        let lead = !std::mem::replace(&mut state.applying, true);
        (answer, lead)
    }

    /// The applying task is unwinding (a bug): the next item to arrive leads again and its
    /// task takes what still waits.
    pub(crate) fn abandon(&self) {
        self.lock().applying = false;
    }

    /// Up to `max` waiting items; `None` once none waits (the applying ends with it).
    pub(crate) fn next_batch(&self, max: usize) -> Option<Vec<Waiting<T, O>>> {
        let mut state = self.lock();
        if state.waiting.is_empty() {
            state.applying = false;
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
}
