//! Background work that runs inside the server: each job is a `run_once`
//! (which tests call directly) and a loop around it. Jobs take Postgres
//! advisory locks, so any number of replicas can run them.

pub mod access;
pub mod consolidation;
pub mod erasure;
pub mod maintenance;
pub mod outbox;
pub mod reembed;
pub mod retention;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::App;

pub fn spawn_all(tracker: &TaskTracker, app: &mut App, shutdown: CancellationToken) {
    if let Some(rx) = app.access_rx.take() {
        let flusher = access::AccessFlusher {
            store: app.state.service.store.clone(),
            clock: app.state.service.clock.clone(),
            rx,
            // Validated at start: at most a year.
            interval: chrono::Duration::seconds(app.config.search.access_interval_secs as i64),
        };
        tracker.spawn(flusher.run(std::time::Duration::from_millis(500), shutdown.clone()));
    }
    let job = maintenance::Maintenance { store: app.storage.clone(), clock: app.state.service.clock.clone() };
    tracker.spawn(job.run(
        std::time::Duration::from_secs(6 * 3600),
        std::time::Duration::from_secs(30),
        shutdown.clone(),
    ));
    if app.config.redis.outbox_interval_secs > 0 {
        let job = outbox::Outbox { service: app.state.service.clone() };
        tracker.spawn(job.run(std::time::Duration::from_secs(app.config.redis.outbox_interval_secs), shutdown.clone()));
    }
    let every = std::time::Duration::from_secs(app.config.erasure.poll_interval_secs);
    tracker.spawn(app.state.eraser.clone().run(every, shutdown.clone()));
    tracker.spawn(app.state.consolidator.clone().run(shutdown.clone()));
    if app.config.retention.sweep_interval_secs > 0 {
        let every = std::time::Duration::from_secs(app.config.retention.sweep_interval_secs);
        tracker.spawn(app.state.retention.clone().run(every, shutdown.clone()));
    }
    if let Some(embedder) = app.state.service.embedder.clone().filter(|_| app.config.embedding.reembed_batch > 0) {
        let job = reembed::Reembed {
            store: app.storage.clone(),
            embedder,
            clock: app.state.service.clock.clone(),
            batch: app.config.embedding.reembed_batch,
            pause: std::time::Duration::from_millis(app.config.embedding.reembed_pause_ms),
        };
        tracker.spawn(job.run(shutdown));
    }
}
