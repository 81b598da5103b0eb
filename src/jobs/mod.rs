//! Background work that runs inside the server: each job is a `run_once`
//! (which tests call directly) and a loop around it. Jobs take Postgres
//! advisory locks, so any number of replicas can run them.

pub mod maintenance;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::App;

pub fn spawn_all(tracker: &TaskTracker, app: &App, shutdown: CancellationToken) {
    let job = maintenance::Maintenance {
        store: app.pg.clone(),
        clock: app.state.service.clock.clone(),
        partitions_ahead_months: app.config.database.partitions_ahead_months,
    };
    tracker.spawn(job.run(std::time::Duration::from_secs(6 * 3600), shutdown));
}
