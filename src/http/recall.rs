//! `/v1/memories/search` and `/v1/context`.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::extract::{Agents, ReadTenant, ValidJson, from_value};
use super::response::ScoredMemoryResponse;
use crate::app::AppState;
use crate::domain::Tier;
use crate::domain::context::{Allocation, PackedItem};
use crate::domain::scoring::Weights;
use crate::domain::tokens::Encoding;
use crate::domain::validate::{self, FieldError};
use crate::error::{ApiError, ErrorBody};
use crate::recall::{ContextParams, ContextUsage, SearchParams, Timings};

pub const DEFAULT_TOP_K: usize = 20;
pub const MAX_TOP_K: usize = 200;
pub const DEFAULT_OUTPUT_RESERVE: i64 = 4096;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchFilter {
    /// `metadata.KEY` must equal this JSON value (no NUL in keys or strings).
    #[schema(value_type = Option<std::collections::HashMap<String, serde_json::Value>>)]
    pub metadata: Option<Map<String, Value>>,
    /// Only memories that occurred at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only memories that occurred before this time.
    pub until: Option<DateTime<Utc>>,
    /// What the agent knew at this time: memories engram had ingested by
    /// then, and of facts the one current then along its supersede chain
    /// (candidates left out). What was deleted, erased or has expired since
    /// is gone from the past too.
    pub as_of: Option<DateTime<Utc>>,
    /// Facts as they held in the world at this time: a fact holds from its
    /// `valid_from` (its `occurred_at`) until the `valid_from` of the fact
    /// that superseded it (or, when that one is gone, until it was
    /// superseded); candidates never. With `as_of`, only what engram knew
    /// then. The other tiers are not narrowed (`since`/`until` do that).
    pub valid_at: Option<DateTime<Utc>>,
}

/// Search one agent's memories.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// The agent scope: only this agent's memories (another agent's reach it
    /// only as copies shared into it, `/v1/share`).
    #[schema(min_length = 1, max_length = 64)]
    pub agent_id: String,
    /// The user scope: this user's memories and those of no user (the
    /// agent's own facts and episodes, its skills), never another user's.
    /// Without it, every memory of the agent. (Listing with `user_id`
    /// filters exactly: only that user's.)
    #[schema(min_length = 1, max_length = 64)]
    pub user_id: Option<String>,
    /// The session whose working memory is searched too.
    #[schema(min_length = 1, max_length = 64)]
    pub session_id: Option<String>,
    /// Not blank, at most 32768 bytes of UTF-8, no NUL.
    #[schema(min_length = 1, max_length = 32768)]
    pub query: String,
    /// 1 to 200, default 20.
    #[schema(minimum = 1, maximum = 200)]
    pub top_k: Option<i64>,
    /// The tiers searched; default all four. Working memory is searched
    /// only with `session_id` (that session's entries).
    pub tiers: Option<Vec<Tier>>,
    /// Overrides the agent's (or the default) scoring weights.
    pub weights: Option<Weights>,
    pub filter: Option<SearchFilter>,
    /// Drop candidates whose own match to the query (the fused similarity of
    /// the memory alone, before neighbouring episodes and normalisation) is
    /// below this (0 to 1).
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_relevance: Option<f64>,
    /// Also recall candidates: facts kept behind a current fact they
    /// contradict (`contested_by` set), such as a shared fact that lost to
    /// the agent's own. Default false.
    pub include_candidates: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SearchResponse {
    /// Best first.
    pub results: Vec<ScoredMemoryResponse>,
    pub timings: Timings,
    /// What the response left out: `working_memory_unavailable` when the
    /// session's working memory could not be read (Redis down) and the
    /// results come from the persistent tiers only. Empty otherwise.
    pub warnings: Vec<String>,
}

/// Assemble a token-budgeted context for a prompt.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub agent_id: String,
    /// The user scope, as in search: this user's memories and those of no
    /// user, never another user's.
    #[schema(min_length = 1, max_length = 64)]
    pub user_id: Option<String>,
    #[schema(min_length = 1, max_length = 64)]
    pub session_id: Option<String>,
    #[schema(min_length = 1, max_length = 32768)]
    pub query: String,
    /// The model's context window.
    #[schema(minimum = 1)]
    pub max_context_tokens: i64,
    /// Counted with the tokenizer; or give `system_prompt_tokens`.
    pub system_prompt: Option<String>,
    #[schema(minimum = 0)]
    pub system_prompt_tokens: Option<i64>,
    /// Kept free for the answer; default 4096.
    #[schema(minimum = 0)]
    pub output_reserve_tokens: Option<i64>,
    /// Budget shares per tier; default working 0.40, semantic 0.25, episodic 0.20, procedural 0.15.
    pub allocation: Option<Allocation>,
    /// `cl100k_base` (default) or `o200k_base`.
    pub tokenizer: Option<Encoding>,
    pub weights: Option<Weights>,
    pub tiers: Option<Vec<Tier>>,
    pub filter: Option<SearchFilter>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_relevance: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ContextResponse {
    /// The rendered block: one line per memory, `[tier] text`; working memory first (oldest first), then by score.
    pub context: String,
    /// What went in, per tier.
    pub sections: BTreeMap<Tier, Vec<PackedItem>>,
    pub usage: ContextUsage,
    pub timings: Timings,
    /// What the response left out: `working_memory_unavailable` when the
    /// session's working memory could not be read (Redis down) and the
    /// results come from the persistent tiers only. Empty otherwise.
    pub warnings: Vec<String>,
}

#[allow(clippy::too_many_arguments)]
fn search_params(
    agent_id: String,
    user_id: Option<String>,
    session_id: Option<String>,
    query: String,
    top_k: usize,
    tiers: Option<Vec<Tier>>,
    weights: Option<Weights>,
    filter: Option<SearchFilter>,
    min_relevance: Option<f64>,
) -> Result<SearchParams, FieldError> {
    validate::identifier("/agent_id", &agent_id)?;
    if let Some(u) = &user_id {
        validate::identifier("/user_id", u)?;
    }
    if let Some(s) = &session_id {
        validate::identifier("/session_id", s)?;
    }
    validate::content("/query", &query)?;
    if let Some(w) = &weights {
        w.check("/weights")?;
    }
    let min_relevance = min_relevance.map(|m| validate::unit_interval("/min_relevance", m)).transpose()?;
    let filter = filter.unwrap_or_default();
    if let Some(m) = &filter.metadata {
        validate::storable_json("/filter/metadata", &Value::Object(m.clone()))?;
    }
    if let Some(t) = filter.since {
        validate::timestamp("/filter/since", t)?;
    }
    if let Some(t) = filter.until {
        validate::timestamp("/filter/until", t)?;
    }
    if let Some(t) = filter.as_of {
        validate::timestamp("/filter/as_of", t)?;
    }
    if let Some(t) = filter.valid_at {
        validate::timestamp("/filter/valid_at", t)?;
    }
    Ok(SearchParams {
        agent_id,
        user_id,
        session_id,
        query,
        top_k,
        tiers: tiers.unwrap_or_default(),
        weights,
        metadata: filter.metadata.unwrap_or_default().into_iter().collect(),
        since: filter.since,
        until: filter.until,
        as_of: filter.as_of,
        valid_at: filter.valid_at,
        min_relevance,
        include_candidates: false,
    })
}

/// Search memories across tiers, scored and explained.
///
/// Candidates come from the vector and full-text legs over episodic, semantic
/// and procedural memory, and from the session's working memory. Each result
/// carries its score and the five raw components, each in [0, 1]:
/// relevance = 0.5·cosine + 0.5·(the share of the query's words the text
/// holds, each word weighed by how rare it is among the candidates) when
/// both legs ran, every candidate scored on both (one leg alone otherwise),
/// plus 0.3 of what the better neighbouring episode's has above the median
/// candidate's, plus 0.2 when the query names the memory's speaker
/// (metadata.speaker, or a "Name: " prefix of its content), plus 0.2 when
/// the memory's occurred_at falls on a date the query names ("on 7 July,
/// 2023", "in August 2023", "in 2022": a day is taken with a day either
/// side, a month or a year whole), then spread from
/// 0 at the median candidate to 1 at the best (working memory: the share of query
/// words it contains); recency = 0.5^(age_days / 7) from occurred_at;
/// importance as stored; frequency = min(1, ln(1 + access_count) / ln 50),
/// where a memory's retrievals count at most once per
/// search.access_interval_secs (an hour);
/// tier_bonus = 0.3 working, 0.2 procedural, 0 otherwise.
/// score = Σ weight·component, default weights relevance 0.35, recency 0.20,
/// importance 0.20, frequency 0.10, tier_bonus 0.15. Superseded facts and
/// expired memories are never returned; duplicates across tiers (same text,
/// or cosine ≥ 0.95) collapse to the best scored.
#[utoipa::path(
    post, path = "/v1/memories/search", tag = "recall",
    request_body = SearchRequest,
    responses(
        (status = 200, description = "The results, best first", body = SearchResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "The key is bound to other agents than agent_id (agent_not_allowed), or its scope is too small (insufficient_scope; needs `read`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 415, description = "The body is not sent as `Content-Type: application/json`", body = ErrorBody),
        (status = 422, description = "A field is missing, mistyped, repeated or out of range", body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn search_memories(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
    agents: Agents,
    body: ValidJson<Value>,
) -> Result<Json<SearchResponse>, ApiError> {
    let r: SearchRequest = from_value(body.value)?;
    // Read as any whole number so that -1 hears the range, not "0 or more".
    let top_k = r.top_k.map_or(Ok(DEFAULT_TOP_K), usize::try_from).ok().filter(|k| (1..=MAX_TOP_K).contains(k));
    let Some(top_k) = top_k else {
        return Err(ApiError::field("/top_k", format!("must be a whole number from 1 to {MAX_TOP_K}")));
    };
    let params = search_params(
        r.agent_id,
        r.user_id,
        r.session_id,
        r.query,
        top_k,
        r.tiers,
        r.weights,
        r.filter,
        r.min_relevance,
    )?;
    agents.check("/agent_id", &params.agent_id)?;
    // Candidates are never part of the past: `as_of` and `valid_at` leave them out.
    let include_candidates =
        r.include_candidates.unwrap_or(false) && params.as_of.is_none() && params.valid_at.is_none();
    let params = SearchParams { include_candidates, ..params };
    let outcome = state.service.search(&tenant, &params).await?;
    let results = outcome.results.into_iter().map(ScoredMemoryResponse::from).collect();
    Ok(Json(SearchResponse { results, timings: outcome.timings, warnings: outcome.warnings }))
}

/// Build a context block that fits a token budget.
///
/// budget = max_context_tokens − system prompt tokens − query tokens −
/// output_reserve_tokens, counted with a real BPE tokenizer. Each tier gets
/// its share; memories are packed best score first; one that does not fit
/// what is left of its share is shortened to its sentences that best match
/// the query (or cut) when at least 16 tokens remain; shares left unused are
/// pooled and offered to the memories still waiting, by score. A negative
/// budget is 422; a budget too small for anything is an empty context.
#[utoipa::path(
    post, path = "/v1/context", tag = "recall",
    request_body = ContextRequest,
    responses(
        (status = 200, description = "The context block", body = ContextResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "The key is bound to other agents than agent_id (agent_not_allowed), or its scope is too small (insufficient_scope; needs `read`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 415, description = "The body is not sent as `Content-Type: application/json`", body = ErrorBody),
        (status = 422, description = "A field is missing, mistyped, repeated or out of range, or the budget is negative", body = ErrorBody),
    ),
    security(("bearer" = ["read"]))
)]
pub async fn build_context(
    State(state): State<AppState>,
    ReadTenant(tenant): ReadTenant,
    agents: Agents,
    body: ValidJson<Value>,
) -> Result<Json<ContextResponse>, ApiError> {
    let r: ContextRequest = from_value(body.value)?;
    if r.max_context_tokens <= 0 {
        return Err(ApiError::field("/max_context_tokens", "must be a positive number of tokens"));
    }
    if r.system_prompt.is_some() && r.system_prompt_tokens.is_some() {
        return Err(ApiError::field("/system_prompt_tokens", "give system_prompt or system_prompt_tokens, not both"));
    }
    if r.system_prompt_tokens.is_some_and(|n| n < 0) {
        return Err(ApiError::field("/system_prompt_tokens", "must not be negative"));
    }
    let output_reserve_tokens = r.output_reserve_tokens.unwrap_or(DEFAULT_OUTPUT_RESERVE);
    if output_reserve_tokens < 0 {
        return Err(ApiError::field("/output_reserve_tokens", "must not be negative"));
    }
    let allocation = r.allocation.unwrap_or_default();
    allocation.check("/allocation")?;
    let search = search_params(
        r.agent_id,
        r.user_id,
        r.session_id,
        r.query,
        MAX_TOP_K,
        r.tiers,
        r.weights,
        r.filter,
        r.min_relevance,
    )?;
    agents.check("/agent_id", &search.agent_id)?;
    let params = ContextParams {
        search,
        max_context_tokens: r.max_context_tokens,
        system_prompt: r.system_prompt,
        system_prompt_tokens: r.system_prompt_tokens,
        output_reserve_tokens,
        allocation,
        encoding: r.tokenizer.unwrap_or_default(),
    };
    let outcome = state.service.context(&tenant, &params).await?;
    Ok(Json(ContextResponse {
        context: outcome.context,
        sections: outcome.sections,
        usage: outcome.usage,
        timings: outcome.timings,
        warnings: outcome.warnings,
    }))
}
