//! Operational routes: liveness, readiness, metrics, the OpenAPI document and
//! its docs page (served from the binary, so it renders with no internet).
//! Liveness and readiness's status answer anyone (probes send no key); what
//! says more about the deployment (readiness's checks, metrics) needs an
//! admin key when the server has keys.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::AppState;
use crate::config::Scope;
use crate::error::{ApiError, ErrorBody};

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
}

#[derive(Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` when every backend answers.
    pub status: &'static str,
    /// Per backend: `ok`, `unavailable` or `timed_out` (the cause is logged,
    /// not shown). Only for an admin key, or on a server without keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checks: Option<std::collections::BTreeMap<&'static str, &'static str>>,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "The process is up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Every backend in use answers (database, working memory).
///
/// Anyone may ask for the status; the per-backend `checks` are shown to an
/// admin key (`Authorization: Bearer`), or to anyone on a server without keys.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Every backend answers", body = Readiness), (status = 503, description = "A backend does not answer", body = Readiness)))]
pub async fn readyz(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let limit = Duration::from_secs(2);
    let (db, redis) = tokio::join!(
        tokio::time::timeout(limit, state.service.store.ping()),
        tokio::time::timeout(limit, state.service.working.ping()),
    );
    // Anyone may ask, so the answer is one fixed word per check; what went
    // wrong (hosts, users, driver messages) goes to the log.
    let verdict = |check: &'static str, r: Result<Result<(), crate::store::StoreError>, _>| match r {
        Ok(Ok(())) => "ok",
        Ok(Err(e)) => {
            tracing::warn!(error = %e, check, "readiness check failed");
            "unavailable"
        }
        Err(_) => {
            tracing::warn!(check, "readiness check timed out");
            "timed_out"
        }
    };
    let mut checks = std::collections::BTreeMap::new();
    checks.insert("database", verdict("database", db));
    checks.insert("working_memory", verdict("working_memory", redis));
    let ready = checks.values().all(|v| *v == "ok");
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    // Which backend is down is the operator's business; a wrong or missing
    // key is no error here, it only hides the details.
    let checks = state.auth.authorize(&headers, Scope::Admin).is_ok().then_some(checks);
    (status, Json(Readiness { status: if ready { "ready" } else { "not_ready" }, checks })).into_response()
}

/// Prometheus metrics: per-route latency histograms, store latencies, pool
/// gauges, retention (deleted, backlog) and in-process index sizes.
///
/// On a server with keys, for admin keys only, unless `auth.open_metrics`.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format", content_type = "text/plain"),
        (status = 401, description = "Missing or unknown API key (when the server has keys and auth.open_metrics is false)", body = ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
    ),
    security(("bearer" = ["admin"])))]
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    if !state.auth.open_metrics {
        state.auth.authorize(&headers, Scope::Admin)?;
    }
    let (open, idle) = state.db_pool.connections();
    metrics::gauge!("engram_db_pool_connections", "state" => "open").set(f64::from(open));
    metrics::gauge!("engram_db_pool_connections", "state" => "idle").set(idle as f64);
    // The backlog is counted in the database: a scrape must not wait out a
    // pool timeout when it is down (the gauges then keep their last values).
    let _ = tokio::time::timeout(Duration::from_secs(1), state.retention.observe()).await;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response())
}

pub async fn openapi_json(State(state): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], state.openapi_json.as_ref().clone()).into_response()
}

pub async fn docs_page() -> Html<&'static str> {
    Html(include_str!("../../assets/docs.html"))
}

pub async fn docs_css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css"), (header::CACHE_CONTROL, "public, max-age=86400")],
        include_str!("../../assets/swagger-ui/swagger-ui.css"),
    )
        .into_response()
}

pub async fn docs_js() -> Response {
    (
        [(header::CONTENT_TYPE, "application/javascript"), (header::CACHE_CONTROL, "public, max-age=86400")],
        include_str!("../../assets/swagger-ui/swagger-ui-bundle.js"),
    )
        .into_response()
}
