//! `/v1/share`: one agent's memories copied to others of the same tenant,
//! under a grant, redacted, with provenance; grants and teams. Handlers parse
//! and map; the work is `sharing`'s.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::erasure::ErasureResponse;
use super::extract::{AdminActor, Agents, ReadTenant, Tenant, ValidJson, from_value};
use super::response::{MemoryResponse, WrittenMemoryResponse};
use crate::app::AppState;
use crate::domain::share::{Grant, GrantTarget, Refusal};
use crate::domain::validate;
use crate::error::{ApiError, ErrorBody};
use crate::sharing::{Selection, ShareError, ShareRequest, Targets};
use crate::store::share::Copies;

/// Most agents one grant or one share names.
const MAX_AGENTS: usize = 100;
/// The default of a share by query.
const DEFAULT_TOP_K: usize = 5;

impl From<ShareError> for ApiError {
    fn from(e: ShareError) -> Self {
        match e {
            e @ ShareError::NotGranted { .. } => ApiError::ShareNotGranted(e.to_string()),
            ShareError::GrantNotFound => ApiError::GrantNotFound,
            e @ ShareError::ConfiguredGrant => ApiError::Conflict(e.to_string()),
            ShareError::Service(e) => e.into(),
        }
    }
}

fn agent_list(field: &str, agents: &[String]) -> Result<(), ApiError> {
    if agents.is_empty() || agents.len() > MAX_AGENTS {
        return Err(ApiError::field(field, format!("must name 1 to {MAX_AGENTS} agents")));
    }
    for (i, a) in agents.iter().enumerate() {
        validate::identifier(&format!("{field}/{i}"), a)?;
    }
    Ok(())
}

fn target_of(to_agent_ids: Option<Vec<String>>, team: Option<String>) -> Result<Targets, ApiError> {
    match (to_agent_ids, team) {
        (Some(agents), None) => {
            agent_list("/to_agent_ids", &agents)?;
            Ok(Targets::Agents(agents))
        }
        (None, Some(team)) => {
            validate::identifier("/team", &team)?;
            Ok(Targets::Team(team))
        }
        _ => Err(ApiError::field("/to_agent_ids", "give either to_agent_ids or team")),
    }
}

/// A grant to make.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateGrantRequest {
    /// The agent that may share.
    #[schema(min_length = 1, max_length = 64)]
    pub from_agent_id: String,
    /// The agents it may share with; or `team`.
    #[schema(min_items = 1, max_items = 100)]
    pub to_agent_ids: Option<Vec<String>>,
    /// A team whose members (at the time of each share) it may share with.
    #[schema(min_length = 1, max_length = 64)]
    pub team: Option<String>,
}

/// A sharing grant: `from_agent_id` may share with `to_agent_ids` or the
/// members of `team`.
#[derive(Debug, Serialize, ToSchema)]
pub struct GrantResponse {
    pub id: Uuid,
    pub from_agent_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_agent_ids: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The id of the API key that made it; `config` for a grant from the
    /// configuration (`[[sharing.grants]]`), which the API cannot revoke.
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<Grant> for GrantResponse {
    fn from(g: Grant) -> Self {
        let (to_agent_ids, team) = match g.target {
            GrantTarget::Agents(a) => (Some(a), None),
            GrantTarget::Team(t) => (None, Some(t)),
        };
        GrantResponse {
            id: g.id,
            from_agent_id: g.from_agent_id,
            to_agent_ids,
            team,
            created_by: g.created_by,
            created_at: g.created_at,
            revoked_at: g.revoked_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GrantListResponse {
    /// The configuration's grants, then the API's, oldest first.
    pub grants: Vec<GrantResponse>,
}

/// What revoking did.
#[derive(Debug, Serialize, ToSchema)]
pub struct RevokeResponse {
    pub grant: GrantResponse,
    /// With `withdraw=true` and copies to withdraw: the erasure that removes
    /// them from their targets (follow it at `/v1/erasure/{id}`).
    pub withdrawal: Option<ErasureResponse>,
}

const SCOPE_403_READ: &str = "The key's scope is too small (insufficient_scope; needs `read`), or, without API keys, Host or Origin names a host not allowed";
const SCOPE_403_READ_AGENT: &str = "The key is bound to other agents (agent_not_allowed), or its scope is too small (insufficient_scope; needs `read`), or, without API keys, Host or Origin names a host not allowed";
const SCOPE_403_ADMIN: &str = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed";

/// Let an agent share with other agents or a team.
///
/// Sharing stays inside the tenant of the key. Grants are one way: a grant
/// from `a` to `b` lets `a` share with `b`, not `b` with `a`. Needs an
/// `admin` key when the server has keys: an agent's key cannot grant itself
/// a reader.
#[utoipa::path(
    post, path = "/v1/share/grants", tag = "sharing",
    request_body = CreateGrantRequest,
    responses(
        (status = 201, description = "The grant, created", body = GrantResponse, headers(("Location" = String, description = "The grant"))),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = SCOPE_403_ADMIN, body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "The body is not `application/json`", body = ErrorBody),
        (status = 422, description = "Invalid agent ids, team, or both or neither given", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn create_grant(
    State(state): State<AppState>,
    actor: AdminActor,
    body: ValidJson<serde_json::Value>,
) -> Result<Response, ApiError> {
    let r = from_value::<CreateGrantRequest>(body.value)?;
    validate::identifier("/from_agent_id", &r.from_agent_id)?;
    let target = match target_of(r.to_agent_ids, r.team)? {
        Targets::Agents(agents) => {
            if agents.contains(&r.from_agent_id) {
                return Err(ApiError::field("/to_agent_ids", "must not name from_agent_id"));
            }
            GrantTarget::Agents(agents)
        }
        Targets::Team(team) => GrantTarget::Team(team),
    };
    let grant = state.sharing.create_grant(&actor.tenant, &actor.key_id, r.from_agent_id, target).await?;
    let mut response = (StatusCode::CREATED, Json(GrantResponse::from(grant.clone()))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/share/grants/{}", grant.id)) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(response)
}

/// The tenant's grants, revoked ones included.
#[utoipa::path(
    get, path = "/v1/share/grants", tag = "sharing",
    responses(
        (status = 200, description = "The grants", body = GrantListResponse),
        (status = 403, description = SCOPE_403_READ, body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn list_grants(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
) -> Result<Json<GrantListResponse>, ApiError> {
    let grants = state.sharing.grants(&tenant).await?;
    Ok(Json(GrantListResponse { grants: grants.into_iter().map(GrantResponse::from).collect() }))
}

/// Revoke a grant; `withdraw=true` also erases the copies made under it.
///
/// Revoking stops new shares; copies already made stay unless withdrawn.
/// Withdrawing goes through an erasure of the copies (so a legal hold on
/// their user answers 409 `legal_hold` and nothing is revoked). Revoking a
/// revoked grant changes nothing. Grants from the configuration answer 409.
#[utoipa::path(
    delete, path = "/v1/share/grants/{id}", tag = "sharing",
    params(
        ("id" = Uuid, Path, description = "The grant"),
        ("withdraw" = Option<bool>, Query, description = "Also erase the copies shared under the grant"),
    ),
    responses(
        (status = 200, description = "The grant, revoked", body = RevokeResponse),
        (status = 403, description = SCOPE_403_ADMIN, body = ErrorBody),
        (status = 404, description = "No such grant in this tenant (grant_not_found)", body = ErrorBody),
        (status = 409, description = "A grant from the configuration (conflict), or a legal hold on a copy's user (legal_hold)", body = ErrorBody),
        (status = 422, description = "Bad id or parameter", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn revoke_grant(
    State(state): State<AppState>,
    actor: AdminActor,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<RevokeResponse>, ApiError> {
    let id: Uuid = id.parse().map_err(|_| ApiError::field("id", "must be a UUID"))?;
    let pairs = super::extract::query_pairs(query.as_deref())?;
    let mut withdraw = false;
    for (k, v) in pairs {
        match (k.as_str(), v.as_str()) {
            ("withdraw", "true") => withdraw = true,
            ("withdraw", "false") => withdraw = false,
            ("withdraw", _) => return Err(ApiError::field("withdraw", "must be true or false")),
            (other, _) => return Err(ApiError::field(other, "is not a parameter of this route")),
        }
    }
    let (grant, erasure) = state.sharing.revoke_grant(&actor.tenant, &actor.key_id, id, withdraw).await?;
    Ok(Json(RevokeResponse { grant: grant.into(), withdrawal: erasure.map(ErasureResponse::from) }))
}

/// A team's members.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TeamRequest {
    /// The members; an empty list removes the team.
    #[schema(max_items = 100)]
    pub agent_ids: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TeamListResponse {
    /// Team name → members (the configuration's and the API's).
    pub teams: BTreeMap<String, Vec<String>>,
}

/// Set a team's members.
///
/// A grant to a team lets its sender share with whoever is a member at
/// the time of a share. Needs an `admin` key when the server has keys.
#[utoipa::path(
    put, path = "/v1/share/teams/{team}", tag = "sharing",
    params(("team" = String, Path, min_length = 1, max_length = 64, description = "The team")),
    request_body = TeamRequest,
    responses(
        (status = 200, description = "The teams", body = TeamListResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = SCOPE_403_ADMIN, body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "The body is not `application/json`", body = ErrorBody),
        (status = 422, description = "Invalid team name or agent ids", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn set_team(
    State(state): State<AppState>,
    actor: AdminActor,
    Path(team): Path<String>,
    body: ValidJson<serde_json::Value>,
) -> Result<Json<TeamListResponse>, ApiError> {
    validate::identifier("team", &team)?;
    let r = from_value::<TeamRequest>(body.value)?;
    if r.agent_ids.len() > MAX_AGENTS {
        return Err(ApiError::field("/agent_ids", format!("must name at most {MAX_AGENTS} agents")));
    }
    for (i, a) in r.agent_ids.iter().enumerate() {
        validate::identifier(&format!("/agent_ids/{i}"), a)?;
    }
    state.sharing.set_team(&actor.tenant, &team, &r.agent_ids).await?;
    list_teams(State(state), ReadTenant(actor.tenant)).await
}

/// The tenant's teams.
#[utoipa::path(
    get, path = "/v1/share/teams", tag = "sharing",
    responses(
        (status = 200, description = "The teams, with this one set", body = TeamListResponse),
        (status = 403, description = SCOPE_403_READ, body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn list_teams(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
) -> Result<Json<TeamListResponse>, ApiError> {
    let teams = state.sharing.teams(&tenant).await?;
    Ok(Json(TeamListResponse { teams: teams.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect() }))
}

/// A share.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareBody {
    /// The agent whose memories are shared.
    #[schema(min_length = 1, max_length = 64)]
    pub from_agent_id: String,
    /// The agents to share with; or `team`.
    #[schema(min_items = 1, max_items = 100)]
    pub to_agent_ids: Option<Vec<String>>,
    /// A team: its members other than the sender.
    #[schema(min_length = 1, max_length = 64)]
    pub team: Option<String>,
    /// The memories, by id; or `query`.
    #[schema(min_items = 1, max_items = 1000)]
    pub memory_ids: Option<Vec<Uuid>>,
    /// The sender's search: its `top_k` best persistent memories.
    #[schema(min_length = 1, max_length = 4000)]
    pub query: Option<String>,
    /// With `query`: how many (default 5, at most `sharing.max_memories`).
    #[schema(minimum = 1, maximum = 1000)]
    pub top_k: Option<usize>,
    /// With `query`: only this user's memories.
    #[schema(min_length = 1, max_length = 64)]
    pub user_id: Option<String>,
}

/// One memory copied to one agent.
#[derive(Debug, Serialize, ToSchema)]
pub struct SharedCopyResponse {
    pub source_memory_id: Uuid,
    pub target_agent_id: String,
    pub grant_id: Uuid,
    /// The target's memory: the copy (with its `provenance`), or, when
    /// `deduplicated`, the memory the target already held (unchanged). A
    /// copied fact that loses to the target's own fact is kept as a
    /// candidate (`contested_by` set): a share never silently replaces what
    /// the target knows.
    pub memory: WrittenMemoryResponse,
    /// What was redacted before the copy was made: kind → how many.
    pub redactions: BTreeMap<String, u64>,
}

/// A memory that was not shared.
#[derive(Debug, Serialize, ToSchema)]
pub struct RefusedResponse {
    pub memory_id: Uuid,
    /// `not_found` (no live memory of the sender has this id), `private`,
    /// `working_memory` or `not_current` (a superseded fact, or a candidate).
    #[schema(value_type = String)]
    pub reason: Refusal,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ShareResponse {
    pub shared: Vec<SharedCopyResponse>,
    pub refused: Vec<RefusedResponse>,
}

/// Share memories with other agents.
///
/// Every target must be granted to the sender (`/v1/share/grants`), else
/// 403 `share_not_granted` naming the agents and nothing is shared. Each
/// chosen memory is checked (private memories and working memory are never
/// shared; refused memories are listed with the reason), redacted (e-mail
/// addresses, phone numbers, card numbers, IBANs, national ids, IP
/// addresses, API keys, tokens, secrets and passwords become placeholders
/// such as `[email]`; `[sharing.redaction]`), and written into every target
/// through the ordinary write path, in one transaction: dedup and the
/// contradiction rule apply, with the trust of a shared memory, below the
/// target's own. A copy is a snapshot with its `provenance`, expiring no
/// later than its source; erasing the source memory's user or the memory
/// erases its copies too.
#[utoipa::path(
    post, path = "/v1/share", tag = "sharing",
    request_body = ShareBody,
    responses(
        (status = 200, description = "What was shared and what was refused", body = ShareResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "No grant for some target (share_not_granted), the key is bound to agents other than from_agent_id (agent_not_allowed), or the key's scope is too small (insufficient_scope; needs `read_write`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "The body is not `application/json`", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
        (status = 503, description = "A backend or the embedder is unavailable", body = ErrorBody),
    ),
    security(("bearer" = ["read_write"]))
)]
pub async fn share(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    actor: super::extract::KeyId,
    agents: Agents,
    body: ValidJson<serde_json::Value>,
) -> Result<Json<ShareResponse>, ApiError> {
    let b = from_value::<ShareBody>(body.value)?;
    validate::identifier("/from_agent_id", &b.from_agent_id)?;
    // A bound key shares only its own agents' memories; the targets are
    // the grant's business, not the key's.
    agents.check("/from_agent_id", &b.from_agent_id)?;
    let targets = target_of(b.to_agent_ids, b.team)?;
    if let Targets::Agents(agents) = &targets
        && agents.contains(&b.from_agent_id)
    {
        return Err(ApiError::field("/to_agent_ids", "must not name from_agent_id"));
    }
    let max = state.sharing.max_memories;
    let selection = match (b.memory_ids, b.query) {
        (Some(ids), None) => {
            if b.top_k.is_some() || b.user_id.is_some() {
                return Err(ApiError::field("/top_k", "applies to a share by query only"));
            }
            if ids.is_empty() || ids.len() > max {
                return Err(ApiError::field("/memory_ids", format!("must name 1 to {max} memories")));
            }
            Selection::Ids(ids)
        }
        (None, Some(query)) => {
            validate::short_text("/query", &query, 4000)?;
            let top_k = b.top_k.unwrap_or(DEFAULT_TOP_K);
            if top_k == 0 || top_k > max {
                return Err(ApiError::field("/top_k", format!("must be between 1 and {max}")));
            }
            if let Some(u) = &b.user_id {
                validate::identifier("/user_id", u)?;
            }
            Selection::Query { query, top_k, user_id: b.user_id }
        }
        _ => return Err(ApiError::field("/memory_ids", "give either memory_ids or query")),
    };
    let request = ShareRequest { from_agent_id: b.from_agent_id, targets, selection };
    let outcome = state.sharing.share(&tenant, &actor.0, request).await?;
    Ok(Json(ShareResponse {
        shared: outcome
            .shared
            .into_iter()
            .map(|c| SharedCopyResponse {
                source_memory_id: c.source_memory_id,
                target_agent_id: c.target_agent_id,
                grant_id: c.grant_id,
                memory: c.written.into(),
                redactions: c.redactions,
            })
            .collect(),
        refused: outcome.refused.into_iter().map(|(memory_id, reason)| RefusedResponse { memory_id, reason }).collect(),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SharedListResponse {
    /// Copies, newest first, each with its `provenance`.
    pub memories: Vec<MemoryResponse>,
}

/// Copies shared into an agent (`direction=in`, the default) or made from
/// its memories (`direction=out`), newest first.
#[utoipa::path(
    get, path = "/v1/share", tag = "sharing",
    params(
        ("agent_id" = String, Query, min_length = 1, max_length = 64),
        ("direction" = Option<String>, Query, description = "`in` (default) or `out`"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 1000, description = "Default 100"),
    ),
    responses(
        (status = 200, description = "The shared copies", body = SharedListResponse),
        (status = 403, description = SCOPE_403_READ_AGENT, body = ErrorBody),
        (status = 422, description = "Bad parameter", body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn list_shared(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
    agents: Agents,
    RawQuery(query): RawQuery,
) -> Result<Json<SharedListResponse>, ApiError> {
    let pairs = super::extract::query_pairs(query.as_deref())?;
    let (mut agent, mut outgoing, mut limit) = (None, false, 100usize);
    for (k, v) in pairs {
        match k.as_str() {
            "agent_id" => {
                validate::identifier("agent_id", &v)?;
                agent = Some(v);
            }
            "direction" => {
                outgoing = match v.as_str() {
                    "in" => false,
                    "out" => true,
                    _ => return Err(ApiError::field("direction", "must be in or out")),
                }
            }
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| ApiError::field("limit", "must be between 1 and 1000"))?;
            }
            other => return Err(ApiError::field(other, "is not a parameter of this route")),
        }
    }
    let agent = agent.ok_or_else(|| ApiError::field("agent_id", "is required"))?;
    agents.check("agent_id", &agent)?;
    let which = if outgoing { Copies::From(&agent) } else { Copies::Into(&agent) };
    let copies = state.sharing.copies(&tenant, which, limit).await?;
    Ok(Json(SharedListResponse { memories: copies.into_iter().map(MemoryResponse::from).collect() }))
}
