//! Group commit without an actor: items that arrive while a batch is being applied wait for
//! the next. The first item to find no batch applying leads (its caller starts the applying
//! task); the task takes what waits, batch after batch, until none does. Used for single
//! reports (`queue::service::report`).

use std::sync::Mutex;

use tokio::sync::oneshot;

/// The items waiting, each with where its answer goes, and whether a batch is being applied.
pub(crate) struct GroupCommit<T, O> {
    state: Mutex<(Vec<(T, oneshot::Sender<O>)>, bool)>,
}

impl<T, O> Default for GroupCommit<T, O> {
    fn default() -> Self {
        Self {
            state: Mutex::new((Vec::new(), false)),
        }
    }
}

impl<T, O> GroupCommit<T, O> {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<(T, oneshot::Sender<O>)>, bool)> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `item`; answers where its outcome will come, and whether the caller leads
    /// (must start a task that applies with [`GroupCommit::next_batch`] until it is `None`).
    pub(crate) fn push(&self, item: T) -> (oneshot::Receiver<O>, bool) {
        let (reply, answer) = oneshot::channel();
        let mut state = self.lock();
        state.0.push((item, reply));
        let lead = !std::mem::replace(&mut state.1, true);
        (answer, lead)
    }

    /// Up to `max` waiting items; `None` once none waits (the applying ends with it).
    pub(crate) fn next_batch(&self, max: usize) -> Option<Vec<(T, oneshot::Sender<O>)>> {
        let mut state = self.lock();
        if state.0.is_empty() {
            state.1 = false;
            return None;
        }
        let take = state.0.len().min(max);
        Some(state.0.drain(..take).collect())
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
    }
}
