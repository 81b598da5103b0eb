//! `/v1/consolidation`: run consolidation for an agent now, and follow the
//! job. Handlers parse and map; the work is `jobs::consolidation`'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::extract::{Agents, KeyId, ReadTenant, Tenant, ValidJson, from_value};
use crate::app::AppState;
use crate::domain::consolidate::{Job, JobReport, JobState};
use crate::domain::validate;
use crate::error::{ApiError, ErrorBody};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsolidationRequest {
    /// The agent whose episodes are consolidated.
    #[schema(min_length = 1, max_length = 64)]
    pub agent_id: String,
}

/// A consolidation job and, once it ends, what it produced.
#[derive(Debug, Serialize, ToSchema)]
pub struct ConsolidationJobResponse {
    pub id: Uuid,
    pub agent_id: String,
    /// `queued`, `running`, `completed` or `failed`.
    pub state: JobState,
    /// The id of the API key that asked for it (`keyless` without keys),
    /// or `schedule` for a scheduled run.
    pub requested_by: String,
    pub requested_at: DateTime<Utc>,
    /// Episodes ingested at or before this instant are taken
    /// (`consolidation.min_age_secs` before the request).
    pub cutoff: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// What it produced (zeros until it ends).
    pub report: JobReport,
    /// Why it failed; `null` unless `state` is `failed`.
    pub error: Option<String>,
}

impl From<Job> for ConsolidationJobResponse {
    fn from(j: Job) -> Self {
        ConsolidationJobResponse {
            id: j.id,
            agent_id: j.agent_id,
            state: j.state,
            requested_by: j.requested_by,
            requested_at: j.requested_at,
            cutoff: j.cutoff,
            started_at: j.started_at,
            finished_at: j.finished_at,
            report: j.report,
            error: j.error,
        }
    }
}

/// Consolidate an agent's episodes now.
///
/// Takes every episode of the agent ingested at least
/// `consolidation.min_age_secs` ago that is not consolidated yet: each
/// group of one user's session becomes a summary (sentences of its
/// episodes, verbatim; `metadata.consolidation` names the method and the
/// source episodes), and first-person statements become facts of the user
/// (`source_episode_id`, trust `consolidated`, written by the ordinary
/// rules: dedup, and never replacing a fact stated by the agent or user).
/// Each episode is consolidated once. Answers 202 at once; follow the job
/// at its Location.
#[utoipa::path(
    post, path = "/v1/consolidation", tag = "consolidation",
    request_body = ConsolidationRequest,
    responses(
        (status = 202, description = "Queued (see Location)", body = ConsolidationJobResponse,
            headers(("Location" = String, description = "The job"))),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "The key is bound to other agents (agent_not_allowed), or its scope is too small (insufficient_scope; needs `read_write`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "The body is not `application/json`", body = ErrorBody),
        (status = 422, description = "Invalid agent id", body = ErrorBody),
    ),
    security(("bearer" = ["read_write"]))
)]
pub async fn request_consolidation(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    KeyId(key_id): KeyId,
    agents: Agents,
    body: ValidJson<serde_json::Value>,
) -> Result<Response, ApiError> {
    let r = from_value::<ConsolidationRequest>(body.value)?;
    validate::identifier("/agent_id", &r.agent_id)?;
    agents.check("/agent_id", &r.agent_id)?;
    let job = state.consolidator.request(&tenant, &r.agent_id, &key_id).await?;
    let location = format!("/v1/consolidation/{}", job.id);
    let mut response = (StatusCode::ACCEPTED, Json(ConsolidationJobResponse::from(job))).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(response)
}

/// A consolidation job: its state and, once `completed`, what it produced.
#[utoipa::path(
    get, path = "/v1/consolidation/{id}", tag = "consolidation",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job's state and report", body = ConsolidationJobResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `read`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 404, description = "No such job for this tenant (or another agent's for a key bound to agents)", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn get_consolidation(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
    agents: Agents,
    Path(id): Path<String>,
) -> Result<Json<ConsolidationJobResponse>, ApiError> {
    let id: Uuid = id.parse().map_err(|_| ApiError::field("id", "must be a UUID"))?;
    match state.consolidator.find(&tenant, id).await? {
        Some(job) if agents.allows(&job.agent_id) => Ok(Json(job.into())),
        _ => Err(ApiError::JobNotFound),
    }
}
