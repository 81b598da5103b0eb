//! The retention dry run: what the next sweep would delete of the caller's
//! memories, per tier and reason, without deleting anything.

use axum::Json;
use axum::extract::{RawQuery, State};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::app::AppState;
use crate::domain::Tier;
use crate::error::{ApiError, ErrorBody};
use crate::http::extract::AdminTenant;
use crate::jobs::retention::{Listing, TierPreview};

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

#[derive(Debug, Serialize, ToSchema)]
pub struct RetentionPreviewResponse {
    /// The time the preview was computed for (the server's clock).
    pub as_of: DateTime<Utc>,
    /// Every tier, working memory first.
    pub tiers: Vec<TierPreviewResponse>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TierPreviewResponse {
    pub tier: Tier,
    /// Past `expires_at`, hidden from reads already, deleted by the next sweep.
    pub expired: ListingResponse,
    /// Live, but with a retention score below the decay threshold (only tiers
    /// decay applies to; never permanent memories or young ones).
    pub decayed: ListingResponse,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ListingResponse {
    /// How many memories.
    pub count: u64,
    /// The first `limit` of them (soonest expired first; decayed in id order).
    pub ids: Vec<Uuid>,
    /// Whether `ids` lists fewer than `count`.
    pub truncated: bool,
}

impl From<Listing> for ListingResponse {
    fn from(l: Listing) -> Self {
        ListingResponse { truncated: (l.ids.len() as u64) < l.count, count: l.count, ids: l.ids }
    }
}

impl From<TierPreview> for TierPreviewResponse {
    fn from(t: TierPreview) -> Self {
        TierPreviewResponse { tier: t.tier, expired: t.expired.into(), decayed: t.decayed.into() }
    }
}

/// What the next retention sweep would delete, without deleting.
///
/// Per tier, the caller's memories past their expiry and those whose
/// retention score decayed below the threshold, as the sweep would decide at
/// this instant. `limit` 1-1000 (default 100) caps the ids listed per tier
/// and reason; counts are always whole. Needs an `admin` key when the server
/// has keys.
#[utoipa::path(
    get, path = "/v1/retention/preview", tag = "retention",
    params(("limit" = Option<usize>, Query)),
    responses(
        (status = 200, description = "What the next sweep would delete, per tier", body = RetentionPreviewResponse),
        (status = 403, description = "The key's scope is too small (insufficient_scope; needs `admin`), or, without API keys, Host or Origin names a host not allowed", body = ErrorBody),
        (status = 422, description = "Bad parameter", body = ErrorBody),
    ),
    security(("bearer" = ["admin"]))
)]
pub async fn preview_retention(
    State(state): State<AppState>,
    AdminTenant(tenant): AdminTenant,
    RawQuery(query): RawQuery,
) -> Result<Json<RetentionPreviewResponse>, ApiError> {
    let mut limit = DEFAULT_LIMIT;
    let pairs = super::extract::query_pairs(query.as_deref())?;
    for (k, v) in pairs {
        match k.as_str() {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|l| (1..=MAX_LIMIT).contains(l))
                    .ok_or_else(|| ApiError::field("limit", format!("must be an integer from 1 to {MAX_LIMIT}")))?
            }
            other => return Err(ApiError::field(other, "is not a parameter of this route")),
        }
    }
    let (as_of, tiers) = state.retention.preview(&tenant, limit).await?;
    Ok(Json(RetentionPreviewResponse { as_of, tiers: tiers.into_iter().map(Into::into).collect() }))
}
