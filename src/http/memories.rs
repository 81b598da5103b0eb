//! `/v1/memories`: write, read, list, update, delete and fact history.
//! Handlers parse, call the service, and map; rules live in the service and
//! the domain.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::dto::{
    BatchRequest, CreateMemoriesBody, CreateMemoryRequest, HistoryResponse, ListResponse, UpdateMemoryRequest,
};
use super::extract::{Agents, ReadTenant, Tenant, ValidJson, from_value};
use super::response::{MemoryResponse, WriteResponse, write_body};
use crate::app::AppState;
use crate::domain::Tier;
use crate::domain::validate::{self, FieldError};
use crate::error::{ApiError, ErrorBody};
use crate::service::Written;
use crate::store::{Cursor, IdempotencyKey, ListFilter};

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 200;

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse().map_err(|_| ApiError::field("id", "must be a UUID"))
}

fn idempotency_key(headers: &HeaderMap, body_sha256: &str) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else { return Ok(None) };
    let key = v
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| ApiError::field("Idempotency-Key", "must be 1-255 visible ASCII characters"))?;
    Ok(Some(IdempotencyKey { key: key.to_string(), request_hash: body_sha256.to_string() }))
}

/// Write one memory or a batch.
///
/// Working memory goes to the session in Redis; the other tiers are committed
/// to the database before the 201 is sent. A batch is all or nothing. A fact
/// identical to a valid fact of the same agent and namespace returns the
/// existing one with `deduplicated: true`. With an `Idempotency-Key`, the same
/// key and body within 24 h return the first response; the same key with
/// another body is 409.
#[utoipa::path(
    post, path = "/v1/memories", tag = "memories",
    request_body = CreateMemoriesBody,
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
        description = "Makes retries safe: same key and body, same response (1-255 visible ASCII characters)")),
    responses(
        (status = 200, description = "A replay of an earlier request with this Idempotency-Key answered 200", body = WriteResponse),
        (status = 201, description = "Written, in request order", body = WriteResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "The key is bound to other agents than an agent_id written (agent_not_allowed), or its scope is too small (insufficient_scope; needs `read_write`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 409, description = "Idempotency key reused with another body, or still in progress", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 415, description = "The body is not sent as `Content-Type: application/json`", body = ErrorBody),
        (status = 422, description = "A field is missing, mistyped, repeated or out of range", body = ErrorBody),
    ),
    security(("bearer" = ["read_write"]))
)]
pub async fn create_memories(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    agents: Agents,
    headers: HeaderMap,
    body: ValidJson<serde_json::Value>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, &body.body_sha256)?;
    let now = state.service.clock.now();
    let batch = body.value.as_object().is_some_and(|o| o.contains_key("memories"));
    let drafts = if batch {
        let req: BatchRequest = from_value(body.value)?;
        validate::batch_size("/memories", req.memories.len())?;
        req.memories
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.into_draft(&format!("/memories/{i}"), now))
            .collect::<Result<Vec<_>, FieldError>>()?
    } else {
        let req: CreateMemoryRequest = from_value(body.value)?;
        vec![req.into_draft("", now)?]
    };
    let pointer = move |i: usize| if batch { format!("/memories/{i}") } else { String::new() };
    for (i, draft) in drafts.iter().enumerate() {
        agents.check(&format!("{}/agent_id", pointer(i)), &draft.agent_id)?;
    }
    match state.service.write(&tenant, drafts, &pointer, key).await? {
        Written::Fresh(memories) => Ok((StatusCode::CREATED, Json(write_body(&memories))).into_response()),
        Written::Replayed { status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::CREATED);
            let mut response = (status, Json(body)).into_response();
            response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(response)
        }
    }
}

/// Read one memory.
#[utoipa::path(
    get, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = Uuid, Path, description = "Memory id")),
    responses(
        (status = 200, description = "The memory", body = MemoryResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `read`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 404, description = "No such memory for this tenant (or expired, or another agent's for a key bound to agents)", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn get_memory(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
    agents: Agents,
    Path(id): Path<String>,
) -> Result<Json<MemoryResponse>, ApiError> {
    let id = parse_id(&id)?;
    let memory = state.service.get(&tenant, id).await?;
    if !agents.allows(&memory.agent_id) {
        return Err(ApiError::MemoryNotFound);
    }
    Ok(Json(memory.into()))
}

/// For a key bound to agents: 404, as for a memory that does not exist,
/// unless the memory is one of its agents' (a bound key learns nothing of
/// other agents' memories, not even that they exist).
async fn require_own(state: &AppState, tenant: &str, agents: &Agents, id: Uuid) -> Result<(), ApiError> {
    if agents.bound().is_some() && !agents.allows(&state.service.get(tenant, id).await?.agent_id) {
        return Err(ApiError::MemoryNotFound);
    }
    Ok(())
}

/// Change content (re-embedded), importance, metadata (merge patch) or retention.
#[utoipa::path(
    patch, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = Uuid, Path, description = "Memory id")),
    request_body = UpdateMemoryRequest,
    responses(
        (status = 200, description = "The memory as updated", body = MemoryResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `read_write`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 404, description = "No such memory for this tenant (or expired, or another agent's for a key bound to agents)", body = ErrorBody),
        (status = 409, description = "The new content duplicates another valid fact", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 415, description = "The body is not sent as `Content-Type: application/json`", body = ErrorBody),
        (status = 422, description = "The id is not a UUID, or a field is mistyped, repeated or out of range", body = ErrorBody),
    ),
    security(("bearer" = ["read_write"]))
)]
pub async fn update_memory(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    agents: Agents,
    Path(id): Path<String>,
    body: ValidJson<serde_json::Value>,
) -> Result<Json<MemoryResponse>, ApiError> {
    let id = parse_id(&id)?;
    let patch = from_value::<UpdateMemoryRequest>(body.value)?.into_patch()?;
    require_own(&state, &tenant, &agents, id).await?;
    Ok(Json(state.service.update(&tenant, id, patch).await?.into()))
}

/// Delete a memory for good, with every copy (Redis included).
#[utoipa::path(
    delete, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = Uuid, Path, description = "Memory id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `read_write`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 404, description = "No such memory for this tenant (or another agent's for a key bound to agents)", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = ["read_write"]))
)]
pub async fn delete_memory(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    agents: Agents,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&id)?;
    require_own(&state, &tenant, &agents, id).await?;
    state.service.delete(&tenant, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A fact's supersede chain, oldest first (a single memory for other tiers).
#[utoipa::path(
    get, path = "/v1/memories/{id}/history", tag = "memories",
    params(("id" = Uuid, Path, description = "Memory id")),
    responses(
        (status = 200, description = "The fact and the chain it superseded", body = HistoryResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `read`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 404, description = "No such memory for this tenant (or another agent's for a key bound to agents)", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn memory_history(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
    agents: Agents,
    Path(id): Path<String>,
) -> Result<Json<HistoryResponse>, ApiError> {
    let id = parse_id(&id)?;
    let memories = state.service.history(&tenant, id).await?;
    // A chain is one agent's: the facts that replace each other share it.
    if memories.iter().any(|m| !agents.allows(&m.agent_id)) {
        return Err(ApiError::MemoryNotFound);
    }
    Ok(Json(HistoryResponse { memories: memories.into_iter().map(MemoryResponse::from).collect() }))
}

/// List memories, newest first, with keyset pagination.
///
/// Filters: `agent_id`, `user_id`, `session_id`, `tier` (comma-separated),
/// `created_after`, `created_before` (RFC 3339), `metadata.KEY=VALUE`
/// (equality, compared as text), `include_superseded` (facts replaced by a
/// newer one), `as_of` (RFC 3339: what the agent knew then: memories
/// ingested by then, and of facts the one valid then, candidates left out;
/// overrides `include_superseded`), `valid_at` (RFC 3339: of facts, those
/// that held in the world then, as in search; also overrides
/// `include_superseded`). Working memory is listed when `agent_id` and `session_id` are
/// given; when it cannot be read (Redis down) the page holds the persistent
/// tiers only and `warnings` says so (`tier=working` alone is 503 instead).
/// `limit` 1-200 (default 50); pass `next_cursor` back as `cursor`. A key
/// bound to one agent lists that agent's memories when `agent_id` is not
/// given; a key bound to several must name one.
#[utoipa::path(
    get, path = "/v1/memories", tag = "memories",
    params(
        ("agent_id" = Option<String>, Query, min_length = 1, max_length = 64),
        ("user_id" = Option<String>, Query, min_length = 1, max_length = 64),
        ("session_id" = Option<String>, Query, min_length = 1, max_length = 64),
        ("tier" = Option<String>, Query, description = "e.g. episodic,semantic"),
        ("created_after" = Option<DateTime<Utc>>, Query), ("created_before" = Option<DateTime<Utc>>, Query),
        ("include_superseded" = Option<bool>, Query),
        ("as_of" = Option<DateTime<Utc>>, Query),
        ("valid_at" = Option<DateTime<Utc>>, Query),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 200, description = "Default 50"),
        ("cursor" = Option<String>, Query, description = "A `next_cursor` from an earlier page"),
    ),
    responses(
        (status = 200, description = "One page of memories", body = ListResponse),
        (status = 400, description = "Bad cursor", body = ErrorBody),
        (status = 403, description = "The key is bound to other agents than agent_id (agent_not_allowed), or its scope is too small (insufficient_scope; needs `read`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 422, description = "Bad parameter, or no agent_id with a key bound to several agents", body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn list_memories(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
    agents: Agents,
    RawQuery(query): RawQuery,
) -> Result<Json<ListResponse>, ApiError> {
    let mut filter = parse_list_query(query.as_deref().unwrap_or(""))?;
    match (&filter.agent_id, agents.bound()) {
        (Some(agent), _) => agents.check("agent_id", agent)?,
        (None, Some([only])) => filter.agent_id = Some(only.clone()),
        (None, Some(_)) => {
            return Err(ApiError::field("agent_id", "is required: this API key acts for several agents; name one"));
        }
        (None, None) => {}
    }
    let listing = state.service.list(&tenant, &filter).await?;
    let mut memories = listing.memories;
    let next_cursor = if memories.len() > filter.limit {
        memories.truncate(filter.limit);
        memories.last().map(|m| encode_cursor(Cursor { created_at: m.created_at, id: m.id }))
    } else {
        None
    };
    Ok(Json(ListResponse {
        memories: memories.into_iter().map(MemoryResponse::from).collect(),
        next_cursor,
        warnings: listing.warnings,
    }))
}

pub fn encode_cursor(c: Cursor) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}|{}", c.created_at.timestamp_micros(), c.id))
}

pub fn decode_cursor(s: &str) -> Option<Cursor> {
    let raw = String::from_utf8(URL_SAFE_NO_PAD.decode(s).ok()?).ok()?;
    let (micros, id) = raw.split_once('|')?;
    Some(Cursor { created_at: DateTime::from_timestamp_micros(micros.parse().ok()?)?, id: id.parse().ok()? })
}

fn parse_time(name: &str, v: &str) -> Result<DateTime<Utc>, ApiError> {
    let t = DateTime::parse_from_rfc3339(v)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| ApiError::field(name, "must be an RFC 3339 timestamp"))?;
    validate::timestamp(name, t)?;
    Ok(t)
}

pub fn parse_list_query(query: &str) -> Result<ListFilter, ApiError> {
    let pairs = super::extract::query_pairs(Some(query))?;
    let mut f = ListFilter { limit: DEFAULT_LIMIT, ..Default::default() };
    for (k, v) in pairs {
        match k.as_str() {
            "agent_id" | "user_id" | "session_id" => {
                validate::identifier(&k, &v)?;
                let slot = match k.as_str() {
                    "agent_id" => &mut f.agent_id,
                    "user_id" => &mut f.user_id,
                    _ => &mut f.session_id,
                };
                *slot = Some(v);
            }
            "tier" => {
                for t in v.split(',').filter(|t| !t.is_empty()) {
                    f.tiers.push(Tier::parse(t).ok_or_else(|| {
                        ApiError::field(
                            "tier",
                            format!("unknown tier `{t}`; expected working, episodic, semantic or procedural"),
                        )
                    })?);
                }
            }
            "created_after" => f.created_after = Some(parse_time(&k, &v)?),
            "created_before" => f.created_before = Some(parse_time(&k, &v)?),
            "as_of" => f.as_of = Some(parse_time(&k, &v)?),
            "valid_at" => f.valid_at = Some(parse_time(&k, &v)?),
            "include_superseded" => {
                f.include_superseded = v.parse().map_err(|_| ApiError::field(&k, "must be true or false"))?
            }
            "limit" => {
                f.limit = v
                    .parse()
                    .ok()
                    .filter(|l| (1..=MAX_LIMIT).contains(l))
                    .ok_or_else(|| ApiError::field("limit", format!("must be an integer from 1 to {MAX_LIMIT}")))?
            }
            "cursor" => f.after = Some(decode_cursor(&v).ok_or(ApiError::InvalidCursor)?),
            other => match other.strip_prefix("metadata.") {
                Some(key) if !key.is_empty() => {
                    validate::storable(other, key)?;
                    validate::visible(other, key)?;
                    validate::storable(other, &v)?;
                    f.metadata.push((key.to_string(), v))
                }
                _ => return Err(ApiError::field(other, "is not a filter of this route")),
            },
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let c =
            Cursor { created_at: DateTime::from_timestamp_micros(1_780_000_000_123_456).unwrap(), id: Uuid::now_v7() };
        assert_eq!(decode_cursor(&encode_cursor(c)), Some(c));
        assert_eq!(decode_cursor("not-a-cursor"), None);
        assert!(matches!(parse_list_query("cursor=zzz"), Err(ApiError::InvalidCursor)));
    }

    #[test]
    fn list_query_parses_filters_and_names_bad_ones() {
        let f = parse_list_query("agent_id=a1&tier=episodic,semantic&metadata.topic=travel&limit=10").unwrap();
        assert_eq!(f.agent_id.as_deref(), Some("a1"));
        assert_eq!(f.tiers, vec![Tier::Episodic, Tier::Semantic]);
        assert_eq!(f.metadata, vec![("topic".to_string(), "travel".to_string())]);
        assert_eq!(f.limit, 10);
        let field = |q: &str| match parse_list_query(q) {
            Err(ApiError::InvalidField(fe)) => fe.field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field("limit=0"), "limit");
        assert_eq!(field("limit=201"), "limit");
        assert_eq!(field("tier=dream"), "tier");
        assert_eq!(field("colour=red"), "colour");
        assert_eq!(field("created_after=yesterday"), "created_after");
    }
}
