//! The core's background tasks, registered in one tracker so that shutdown can await every
//! one of them (docs/ARCHITECTURE.md lists them with their stop order).

use std::future::Future;

use tokio_util::task::TaskTracker;

/// Every loop the core starts, by name. Each logs `task started` and `task stopped` with its
/// name (the operator, and the process-level shutdown test, read the pairs).
#[derive(Clone, Default)]
pub struct Tasks {
    tracker: TaskTracker,
}

impl Tasks {
    /// Runs `work` on the runtime (`tokio::spawn`), tracked under `name`. A task the
    /// runtime drops unfinished (a test's runtime ending) is dropped inside the runtime's
    /// context, where the database driver can still hand its connections back; a task on
    /// actix's local set would be dropped after it, and sqlx would panic in a destructor.
    pub fn spawn<F>(&self, name: &'static str, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tracing::info!(task = name, "task started");
        tokio::spawn(self.tracker.track_future(async move {
            work.await;
            tracing::info!(task = name, "task stopped");
        }));
    }

    /// Takes no new task and waits for every running one to end (each ends on the stop
    /// signal or when its input closes).
    pub async fn wait(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }
}
