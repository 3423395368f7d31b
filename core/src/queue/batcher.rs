//! Group commit for single reports, without an actor: a report that finds no batch being
//! applied starts one (a task of its own, so a client that hangs up cannot strand it) and the
//! reports arriving meanwhile wait for the next, applied together. One transaction when idle,
//! large batches when busy, and no hop through the queue actor.

use std::sync::Mutex;

use tokio::sync::oneshot;

use super::repo::{Report, ReportOutcome};
use super::{JobError, Jobs, QueueError};

type Reply = oneshot::Sender<Result<ReportOutcome, JobError>>;

#[derive(Default)]
pub(crate) struct ReportBatcher {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    pending: Vec<(Report, Reply)>,
    applying: bool,
}

/// Reports applied together at most.
const MAX_BATCH: usize = 1000;

impl ReportBatcher {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Applies `report` with the others that arrive while a batch is applied; answers its own
/// outcome.
pub(crate) async fn submit(jobs: &Jobs, report: Report) -> Result<ReportOutcome, JobError> {
    let (reply, answer) = oneshot::channel();
    let lead = {
        let mut state = jobs.reports.lock();
        state.pending.push((report, reply));
        !std::mem::replace(&mut state.applying, true)
    };
    if lead {
        tokio::spawn(apply_pending(jobs.clone()));
    }
    answer.await.unwrap_or(Err(JobError::Queue(QueueError::Stopped)))
}

/// Applies the waiting reports, batch after batch, until none wait.
async fn apply_pending(jobs: Jobs) {
    loop {
        let batch: Vec<(Report, Reply)> = {
            let mut state = jobs.reports.lock();
            if state.pending.is_empty() {
                state.applying = false;
                return;
            }
            let take = state.pending.len().min(MAX_BATCH);
            state.pending.drain(..take).collect()
        };
        let (reports, replies): (Vec<Report>, Vec<Reply>) = batch.into_iter().unzip();
        match super::service::reports(&jobs, reports).await {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(err) => {
                tracing::error!(
                    error = &err as &dyn std::error::Error,
                    reports = replies.len(),
                    "applying job reports failed"
                );
                for reply in replies {
                    let _ = reply.send(Err(JobError::Queue(QueueError::Batch)));
                }
            }
        }
    }
}
