//! `/v1/holds`: legal holds on users. While a hold is active, erasing the
//! user's memories answers 409 `legal_hold` and the retention sweep leaves
//! them alone (`domain::holds`). Operator routes: an `admin` key's; placing
//! and releasing are audited. Handlers parse and map; the work is
//! `jobs::erasure`'s.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::extract::{AdminActor, AdminTenant, ValidJson, from_value};
use crate::app::AppState;
use crate::domain::holds::{self, Hold, MAX_REASON_CHARS};
use crate::error::{ApiError, ErrorBody};

/// A hold to place on a user.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateHoldRequest {
    /// The user whose memories the hold keeps (every agent's).
    #[schema(min_length = 1, max_length = 64)]
    pub user_id: String,
    /// Why (a case or matter reference). Not memory content; not copied to
    /// the audit log.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: Option<String>,
}

/// A legal hold.
#[derive(Debug, Serialize, ToSchema)]
pub struct HoldResponse {
    pub id: Uuid,
    pub user_id: String,
    pub reason: Option<String>,
    pub placed_at: DateTime<Utc>,
    /// The id of the API key that placed it (`keyless` without keys).
    pub placed_by: String,
    /// Whether the hold is in force (not released).
    pub active: bool,
    /// When it was released; `null` while active.
    pub released_at: Option<DateTime<Utc>>,
    pub released_by: Option<String>,
}

impl From<Hold> for HoldResponse {
    fn from(h: Hold) -> Self {
        HoldResponse {
            id: h.id,
            active: h.is_active(),
            user_id: h.user_id,
            reason: h.reason,
            placed_at: h.placed_at,
            placed_by: h.placed_by,
            released_at: h.released_at,
            released_by: h.released_by,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HoldListResponse {
    /// Active holds, oldest first.
    pub holds: Vec<HoldResponse>,
}

fn hold_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse().map_err(|_| ApiError::field("id", "must be a UUID"))
}

/// Place a legal hold on a user.
///
/// While the hold is active, an erasure that would touch the user's
/// memories (by `user_id`, or by `memory_ids` of the user or anything the
/// erasure follows to) answers 409 `legal_hold` naming the hold, and the
/// retention sweep (expiry and decay), its preview and its backlog leave the
/// user's persistent memories alone; expired ones stay hidden from reads.
/// Working memory is outside holds (it lapses with its session). Refused
/// with 409 `erasure_in_progress` while an erasure of the user is
/// unfinished. Several holds may stand on one user. Needs an `admin` key
/// when the server has keys; audited (`legal_hold_placed`).
#[utoipa::path(
    post, path = "/v1/holds", tag = "erasure",
    request_body = CreateHoldRequest,
    responses(
        (status = 201, description = "Placed (see Location)", body = HoldResponse,
            headers(("Location" = String, description = "The hold"))),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 409, description = "An erasure of the user is unfinished (erasure_in_progress)", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "The body is not `application/json`", body = ErrorBody),
        (status = 422, description = "Invalid user id or reason", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn place_hold(
    State(state): State<AppState>,
    actor: AdminActor,
    body: ValidJson<serde_json::Value>,
) -> Result<Response, ApiError> {
    let request = from_value::<CreateHoldRequest>(body.value)?;
    holds::validate(&request.user_id, request.reason.as_deref())?;
    let hold = state.eraser.place_hold(&actor.tenant, &actor.key_id, request.user_id, request.reason).await?;
    let location = format!("/v1/holds/{}", hold.id);
    let mut response = (StatusCode::CREATED, Json(HoldResponse::from(hold))).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(response)
}

/// The tenant's active legal holds, oldest first.
///
/// `user_id` narrows the list to one user's holds. Needs an `admin` key when
/// the server has keys.
#[utoipa::path(
    get, path = "/v1/holds", tag = "erasure",
    params(("user_id" = Option<String>, Query, min_length = 1, max_length = 64, description = "Only this user's holds")),
    responses(
        (status = 200, description = "The holds", body = HoldListResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 422, description = "Bad parameter", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn list_holds(
    State(state): State<AppState>,
    AdminTenant(tenant): AdminTenant,
    RawQuery(query): RawQuery,
) -> Result<Json<HoldListResponse>, ApiError> {
    let pairs = super::extract::query_pairs(query.as_deref())?;
    let mut user_id = None;
    for (k, v) in pairs {
        match k.as_str() {
            "user_id" => {
                crate::domain::validate::identifier("user_id", &v)?;
                user_id = Some(v);
            }
            other => return Err(ApiError::field(other, "is not a parameter of this route")),
        }
    }
    let holds = state.eraser.active_holds(&tenant, user_id.as_deref()).await?;
    Ok(Json(HoldListResponse { holds: holds.into_iter().map(Into::into).collect() }))
}

/// A legal hold, active or released.
#[utoipa::path(
    get, path = "/v1/holds/{id}", tag = "erasure",
    params(("id" = Uuid, Path, description = "Hold id")),
    responses(
        (status = 200, description = "The hold", body = HoldResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 404, description = "No such hold for this tenant (hold_not_found)", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn get_hold(
    State(state): State<AppState>,
    AdminTenant(tenant): AdminTenant,
    Path(id): Path<String>,
) -> Result<Json<HoldResponse>, ApiError> {
    let id = hold_id(&id)?;
    let hold = state.eraser.hold(&tenant, id).await?.ok_or(ApiError::HoldNotFound)?;
    Ok(Json(hold.into()))
}

/// Release a legal hold.
///
/// The hold stays on record, released. Erasure of the user is possible
/// again, and the next retention sweep deletes what expired or decayed
/// meanwhile. Releasing a hold already released changes nothing and answers
/// it as it is. Needs an `admin` key when the server has keys; audited
/// (`legal_hold_released`).
#[utoipa::path(
    delete, path = "/v1/holds/{id}", tag = "erasure",
    params(("id" = Uuid, Path, description = "Hold id")),
    responses(
        (status = 200, description = "Released (or already released)", body = HoldResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 404, description = "No such hold for this tenant (hold_not_found)", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn release_hold(
    State(state): State<AppState>,
    actor: AdminActor,
    Path(id): Path<String>,
) -> Result<Json<HoldResponse>, ApiError> {
    let id = hold_id(&id)?;
    let hold = state.eraser.release_hold(&actor.tenant, &actor.key_id, id).await?.ok_or(ApiError::HoldNotFound)?;
    Ok(Json(hold.into()))
}

// Keeps the documented bound and the domain's in one place.
const _: () = assert!(MAX_REASON_CHARS == 1000);
const _: () = assert!(crate::domain::validate::MAX_ID_CHARS == 64);
