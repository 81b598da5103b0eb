//! `/v1/erasure` (the right to be forgotten) and `/v1/audit` (the
//! append-only log of erasures, exports, imports and legal holds). Operator routes: an
//! `admin` key's. Handlers parse and map; the work is `jobs::erasure`'s.

use std::collections::BTreeMap;

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
use crate::domain::erasure::{AuditEntry, ErasureRecord, ErasureState, MAX_MEMORY_IDS, Subject};
use crate::error::{ApiError, ErrorBody};

/// Whose memories to erase: a user (optionally with one agent only), or
/// memories by id. Exactly one of `user_id` and `memory_ids`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErasureRequest {
    /// Every memory of this user, in every tier and store.
    #[schema(min_length = 1, max_length = 200)]
    pub user_id: Option<String>,
    /// With `user_id`: only the user's memories with this agent.
    #[schema(min_length = 1, max_length = 200)]
    pub agent_id: Option<String>,
    /// These memories (ids the tenant does not have are ignored).
    #[schema(min_items = 1, max_items = 1000)]
    pub memory_ids: Option<Vec<Uuid>>,
}

impl ErasureRequest {
    fn into_subject(self) -> Result<Subject, ApiError> {
        let subject = match (self.user_id, self.memory_ids) {
            (Some(user_id), None) => Subject::User { user_id, agent_id: self.agent_id },
            (None, Some(memory_ids)) => {
                if self.agent_id.is_some() {
                    return Err(ApiError::field("/agent_id", "narrows a `user_id` erasure only"));
                }
                Subject::Memories { memory_ids }
            }
            (Some(_), Some(_)) => {
                return Err(ApiError::field("/memory_ids", "give `user_id` or `memory_ids`, not both"));
            }
            (None, None) => return Err(ApiError::field("/user_id", "give `user_id` or `memory_ids`")),
        };
        subject.validate()?;
        Ok(subject)
    }
}

/// An erasure's state and receipt. Never holds memory content.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErasureResponse {
    pub id: Uuid,
    /// `pending` (accepted: the subject is already hidden from every read),
    /// `running`, `retrying` (a store was unavailable; see `last_error`),
    /// `completed` (deleted, and verification found nothing left) or
    /// `failed` (verification found records left; see `verification`).
    pub state: ErasureState,
    pub tenant: String,
    /// What was asked: `{"user_id", "agent_id"?}` or `{"memory_ids"}`.
    #[schema(value_type = std::collections::HashMap<String, serde_json::Value>)]
    pub selector: serde_json::Value,
    /// The id of the API key that asked (`keyless` without keys).
    pub requested_by: String,
    pub requested_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    /// Why the last attempt stopped, while `retrying`.
    pub last_error: Option<String>,
    /// Per store, how many records of each kind were erased (rows per tier,
    /// working-memory entries, remembered idempotent responses, outbox
    /// entries, skill-cache evictions).
    pub deleted: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per store, how many of the subject's records each check found after
    /// the deletion, from queries of each store (all 0 when completed); with
    /// a read replica, `postgres_replica` holds the same checks run there,
    /// once it has replayed the deletion.
    pub verification: BTreeMap<String, BTreeMap<String, u64>>,
    pub verified_at: Option<DateTime<Utc>>,
    /// What was done about the deleted bytes, per store.
    pub purge: BTreeMap<String, String>,
    /// The hash of the erasure's entry in the audit log.
    pub audit_hash: Option<String>,
}

impl From<ErasureRecord> for ErasureResponse {
    fn from(r: ErasureRecord) -> Self {
        ErasureResponse {
            id: r.id,
            state: r.state,
            tenant: r.tenant,
            selector: serde_json::to_value(&r.subject).unwrap_or_default(),
            requested_by: r.requested_by,
            requested_at: r.requested_at,
            completed_at: r.completed_at,
            attempts: r.attempts,
            last_error: r.last_error,
            deleted: r.receipt.deleted,
            verification: r.receipt.verification,
            verified_at: r.receipt.verified_at,
            purge: r.receipt.purge,
            audit_hash: r.receipt.audit_hash,
        }
    }
}

/// Erase a data subject's memories (the right to be forgotten).
///
/// Accepted once the request is stored and the subject's memories are
/// hidden from every read (get, list, search, context, history, export);
/// they are then deleted from every store (database rows and superseded
/// versions, facts derived from them, working memory, the skill cache, the
/// in-process indexes, remembered idempotent responses that show them),
/// the deleted bytes purged, and every store queried again to verify.
/// `GET /v1/erasure/{id}` gives the state and receipt. An unknown user is
/// accepted and completes with nothing found. Refused with 409 `legal_hold`,
/// naming the holds, when anything the erasure would touch belongs to a
/// user under an active legal hold (`/v1/holds`). Needs an `admin` key when
/// the server has keys; audited.
#[utoipa::path(
    post, path = "/v1/erasure", tag = "erasure",
    request_body = ErasureRequest,
    responses(
        (status = 202, description = "Accepted: the subject is hidden; deletion follows (see Location)", body = ErasureResponse,
            headers(("Location" = String, description = "The erasure's receipt"))),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 409, description = "Memories the erasure would touch are under legal hold (legal_hold; the message names the holds)", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "The body is not `application/json`", body = ErrorBody),
        (status = 422, description = "Invalid selector", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn request_erasure(
    State(state): State<AppState>,
    actor: AdminActor,
    body: ValidJson<serde_json::Value>,
) -> Result<Response, ApiError> {
    let subject = from_value::<ErasureRequest>(body.value)?.into_subject()?;
    let record = state.eraser.request(&actor.tenant, &actor.key_id, subject).await?;
    let location = format!("/v1/erasure/{}", record.id);
    let mut response = (StatusCode::ACCEPTED, Json(ErasureResponse::from(record))).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(response)
}

/// An erasure's state and receipt.
#[utoipa::path(
    get, path = "/v1/erasure/{id}", tag = "erasure",
    params(("id" = Uuid, Path, description = "Erasure id")),
    responses(
        (status = 200, description = "The erasure's state and receipt", body = ErasureResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 404, description = "No such erasure for this tenant (erasure_not_found)", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn get_erasure(
    State(state): State<AppState>,
    AdminTenant(tenant): AdminTenant,
    Path(id): Path<String>,
) -> Result<Json<ErasureResponse>, ApiError> {
    let id: Uuid = id.parse().map_err(|_| ApiError::field("id", "must be a UUID"))?;
    let record = state.eraser.receipt(&tenant, id).await?.ok_or(ApiError::ErasureNotFound)?;
    Ok(Json(record.into()))
}

/// An audit entry: who did what to how much, when; never content.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditEntryResponse {
    /// Position in the log (increasing; a cursor for `after`).
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// The API key's id (`keyless` without keys; `cli` for the command line).
    pub actor: String,
    /// `erasure`, `subject_export`, `export`, `import`, `legal_hold_placed`
    /// or `legal_hold_released`.
    pub operation: String,
    /// What it applied to.
    #[schema(value_type = std::collections::HashMap<String, serde_json::Value>)]
    pub target: serde_json::Value,
    /// How much it touched.
    #[schema(value_type = std::collections::HashMap<String, serde_json::Value>)]
    pub counts: serde_json::Value,
    /// The hash of the tenant's entry before it (64 zeros for the first).
    pub prev_hash: String,
    /// SHA-256 over `prev_hash` and this entry's fields.
    pub hash: String,
}

impl From<AuditEntry> for AuditEntryResponse {
    fn from(e: AuditEntry) -> Self {
        AuditEntryResponse {
            seq: e.seq,
            at: e.at,
            actor: e.actor,
            operation: e.operation,
            target: serde_json::from_str(&e.target).unwrap_or(serde_json::Value::String(e.target)),
            counts: serde_json::from_str(&e.counts).unwrap_or(serde_json::Value::String(e.counts)),
            prev_hash: e.prev_hash,
            hash: e.hash,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AuditPageResponse {
    /// Oldest first.
    pub entries: Vec<AuditEntryResponse>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<i64>,
}

const AUDIT_DEFAULT_LIMIT: usize = 100;
const AUDIT_MAX_LIMIT: usize = 1000;

/// The tenant's audit log, oldest first.
///
/// `after` (an entry's `seq`) and `limit` (1-1000, default 100) page
/// through it. Needs an `admin` key when the server has keys.
#[utoipa::path(
    get, path = "/v1/audit", tag = "erasure",
    params(("after" = Option<i64>, Query, minimum = 0), ("limit" = Option<usize>, Query, minimum = 1, maximum = 1000)),
    responses(
        (status = 200, description = "One page of the audit log", body = AuditPageResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 422, description = "Bad parameter", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn list_audit(
    State(state): State<AppState>,
    AdminTenant(tenant): AdminTenant,
    RawQuery(query): RawQuery,
) -> Result<Json<AuditPageResponse>, ApiError> {
    let (mut after, mut limit) = (0i64, AUDIT_DEFAULT_LIMIT);
    let pairs = super::extract::query_pairs(query.as_deref())?;
    for (k, v) in pairs {
        match k.as_str() {
            "after" => {
                after = v
                    .parse()
                    .ok()
                    .filter(|a| *a >= 0)
                    .ok_or_else(|| ApiError::field("after", "must be a whole number, 0 or more"))?
            }
            "limit" => {
                limit = v.parse().ok().filter(|l| (1..=AUDIT_MAX_LIMIT).contains(l)).ok_or_else(|| {
                    ApiError::field("limit", format!("must be an integer from 1 to {AUDIT_MAX_LIMIT}"))
                })?
            }
            other => return Err(ApiError::field(other, "is not a parameter of this route")),
        }
    }
    let mut entries = state.eraser.erasure.audit_page(Some(&tenant), after, limit + 1).await?;
    let more = entries.len() > limit;
    entries.truncate(limit);
    let next_after = if more { entries.last().map(|e| e.seq) } else { None };
    Ok(Json(AuditPageResponse { entries: entries.into_iter().map(Into::into).collect(), next_after }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AuditVerificationResponse {
    /// Whether every entry's hash matches its fields and the entry before it.
    pub valid: bool,
    /// Entries checked before the first broken one (all of them when valid).
    pub checked: u64,
    /// The first broken entry's `seq`, when not valid.
    pub first_broken_seq: Option<i64>,
    /// What is wrong with it.
    pub reason: Option<String>,
}

/// Recompute the tenant's audit chain and name the first broken entry.
#[utoipa::path(
    get, path = "/v1/audit/verify", tag = "erasure",
    responses(
        (status = 200, description = "The result of the verification", body = AuditVerificationResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn verify_audit(
    State(state): State<AppState>,
    AdminTenant(tenant): AdminTenant,
) -> Result<Json<AuditVerificationResponse>, ApiError> {
    let (checked, broken) = state.eraser.verify_audit(Some(&tenant)).await?;
    Ok(Json(AuditVerificationResponse {
        valid: broken.is_none(),
        checked,
        first_broken_seq: broken.as_ref().map(|b| b.seq),
        reason: broken.map(|b| b.reason),
    }))
}

/// Export every memory of one user (a data subject's right of access).
///
/// Every live memory of the user in every tier, with every field the API
/// shows (provenance included), as JSON Lines: one memory object per line,
/// the persistent tiers newest first, then the user's working-memory
/// entries. Needs an `admin` key when the server has keys; audited
/// (operation `subject_export`).
#[utoipa::path(
    get, path = "/v1/subjects/{user_id}/export", tag = "erasure",
    params(("user_id" = String, Path, min_length = 1, max_length = 200, description = "The user")),
    responses(
        (status = 200, description = "One memory object per line", content_type = "application/x-ndjson",
            body = super::response::MemoryResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 422, description = "Invalid user id", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn export_subject(
    State(state): State<AppState>,
    actor: AdminActor,
    Path(user_id): Path<String>,
) -> Result<Response, ApiError> {
    crate::domain::validate::identifier("user_id", &user_id)?;
    let memories = state.service.subject_memories(&actor.tenant, &user_id).await?;
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut body = Vec::new();
    for m in memories {
        *counts.entry(m.tier.as_str()).or_default() += 1;
        serde_json::to_writer(&mut body, &super::response::MemoryResponse::from(m))
            .map_err(|e| ApiError::Internal(e.into()))?;
        body.push(b'\n');
    }
    let entry = crate::domain::erasure::NewAuditEntry {
        tenant: actor.tenant.clone(),
        at: state.service.clock.now(),
        actor: actor.key_id,
        operation: "subject_export".into(),
        target: serde_json::json!({"user_id": user_id}),
        counts: serde_json::to_value(&counts).unwrap_or_default(),
    };
    state.eraser.audit(&entry).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

// Keeps the documented bound and the domain's in one place.
const _: () = assert!(MAX_MEMORY_IDS == 1000);
