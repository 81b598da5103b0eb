//! The API's error type and its wire form.
//!
//! Every failure a client can see is an [`ApiError`]: a stable snake_case code,
//! a message meant for the client, optionally the JSON pointer of the field at
//! fault, and the request id. 4xx messages say exactly what was wrong with the
//! input; 5xx messages say nothing internal (the cause is logged instead).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::config::Scope;
use crate::domain::validate::FieldError;
use crate::store::StoreError;

tokio::task_local! {
    /// The id of the request being served, set by the request-id middleware.
    pub static REQUEST_ID: String;
}

/// The error body: `{"error": {...}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_field`.
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
    /// JSON pointer of the offending field (body) or the parameter name (path, query).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The request's id, also sent as the `x-request-id` header.
    pub request_id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("{}: {}", .0.field, .0.message)]
    InvalidField(FieldError),
    #[error("the cursor is not one this server issued")]
    InvalidCursor,
    #[error("no memory with this id")]
    MemoryNotFound,
    #[error("no erasure with this id")]
    ErasureNotFound,
    #[error("no legal hold with this id")]
    HoldNotFound,
    #[error("no grant with this id")]
    GrantNotFound,
    #[error("no consolidation job with this id")]
    JobNotFound,
    #[error("{0}")]
    ShareNotGranted(String),
    /// The request names an agent its API key is not bound to.
    #[error("this API key does not act for agent `{agent}`")]
    AgentNotAllowed { field: String, agent: String },
    #[error("{0}")]
    LegalHold(String),
    #[error("{0}")]
    ErasureInProgress(String),
    #[error("no such route")]
    RouteNotFound,
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("missing or invalid API key")]
    Unauthorized,
    #[error("this API key's scope is `{}`; this operation needs `{}`", .has.as_str(), .needs.as_str())]
    InsufficientScope { has: Scope, needs: Scope },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    HostNotAllowed(String),
    #[error("{0}")]
    OriginNotAllowed(String),
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyKeyReused,
    #[error("a request with this Idempotency-Key is still in progress")]
    IdempotencyInProgress,
    #[error("{0}")]
    Conflict(String),
    #[error("{what} is unavailable, retry later")]
    Unavailable { what: &'static str, retry_after_secs: u64 },
    #[error("too many requests with this API key; retry after the time in Retry-After")]
    RateLimited { retry_after_secs: u64 },
    #[error("the request took too long")]
    Timeout,
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidField(FieldError::new(field, message))
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::InvalidJson(_) => (StatusCode::BAD_REQUEST, "invalid_json"),
            ApiError::InvalidField(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_field"),
            ApiError::InvalidCursor => (StatusCode::BAD_REQUEST, "invalid_cursor"),
            ApiError::MemoryNotFound => (StatusCode::NOT_FOUND, "memory_not_found"),
            ApiError::ErasureNotFound => (StatusCode::NOT_FOUND, "erasure_not_found"),
            ApiError::HoldNotFound => (StatusCode::NOT_FOUND, "hold_not_found"),
            ApiError::GrantNotFound => (StatusCode::NOT_FOUND, "grant_not_found"),
            ApiError::JobNotFound => (StatusCode::NOT_FOUND, "job_not_found"),
            ApiError::ShareNotGranted(_) => (StatusCode::FORBIDDEN, "share_not_granted"),
            ApiError::AgentNotAllowed { .. } => (StatusCode::FORBIDDEN, "agent_not_allowed"),
            ApiError::LegalHold(_) => (StatusCode::CONFLICT, "legal_hold"),
            ApiError::ErasureInProgress(_) => (StatusCode::CONFLICT, "erasure_in_progress"),
            ApiError::RouteNotFound => (StatusCode::NOT_FOUND, "route_not_found"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::InsufficientScope { .. } => (StatusCode::FORBIDDEN, "insufficient_scope"),
            ApiError::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            ApiError::HostNotAllowed(_) => (StatusCode::FORBIDDEN, "host_not_allowed"),
            ApiError::OriginNotAllowed(_) => (StatusCode::FORBIDDEN, "origin_not_allowed"),
            ApiError::IdempotencyKeyReused => (StatusCode::CONFLICT, "idempotency_key_reused"),
            ApiError::IdempotencyInProgress => (StatusCode::CONFLICT, "idempotency_in_progress"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable"),
            ApiError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::Timeout => (StatusCode::SERVICE_UNAVAILABLE, "timeout"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::InvalidField(e)
    }
}

/// Storage errors know nothing of HTTP; this is the one place they meet it.
/// The match is exhaustive on purpose: a new store error must choose a status.
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::MemoryNotFound,
            StoreError::Conflict(msg) => ApiError::Conflict(msg),
            StoreError::Invalid(fe) => ApiError::InvalidField(fe),
            StoreError::Held(holds) => ApiError::LegalHold(crate::domain::holds::refusal(&holds)),
            StoreError::Erasing(ids) => {
                let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
                ApiError::ErasureInProgress(format!(
                    "the user has an erasure in progress ({}); a hold cannot keep what an accepted erasure is \
                     deleting: place it once the erasure has finished (GET /v1/erasure/{{id}})",
                    ids.join(", ")
                ))
            }
            StoreError::Unavailable { what, retry_after_secs, source } => {
                tracing::warn!(error = %source, what, "backend unavailable");
                ApiError::Unavailable { what, retry_after_secs }
            }
            StoreError::Internal(err) => ApiError::Internal(err),
        }
    }
}

impl From<crate::service::ServiceError> for ApiError {
    fn from(e: crate::service::ServiceError) -> Self {
        use crate::embed::EmbedError;
        use crate::service::ServiceError;
        match e {
            ServiceError::Invalid(fe) => ApiError::InvalidField(fe),
            ServiceError::Store(se) => se.into(),
            ServiceError::Embedding(err) => match &err {
                EmbedError::Unavailable(_) => {
                    tracing::warn!(error = %err, "embedding provider unavailable");
                    ApiError::Unavailable { what: "the embedding provider", retry_after_secs: 5 }
                }
                EmbedError::BadResponse(_) => {
                    tracing::error!(error = %err, "embedding provider misbehaved");
                    ApiError::Unavailable { what: "the embedding provider", retry_after_secs: 5 }
                }
                EmbedError::Busy { retry_after_secs } => {
                    tracing::warn!("embedding queue full: request shed");
                    ApiError::Unavailable {
                        what: "the embedding queue (too much work waiting)",
                        retry_after_secs: *retry_after_secs,
                    }
                }
            },
            ServiceError::IdempotencyKeyReused => ApiError::IdempotencyKeyReused,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = match &self {
            ApiError::Internal(err) => {
                tracing::error!(error = ?err, "internal error");
                "internal error; the request id identifies it in the server's log".to_string()
            }
            ApiError::InvalidField(fe) => fe.message.clone(),
            other => other.to_string(),
        };
        let field = match &self {
            ApiError::InvalidField(fe) => Some(fe.field.clone()),
            ApiError::AgentNotAllowed { field, .. } => Some(field.clone()),
            _ => None,
        };
        let request_id = REQUEST_ID.try_with(Clone::clone).unwrap_or_default();
        let body = ErrorBody { error: ErrorDetail { code, message, field, request_id } };
        let mut response = (status, axum::Json(body)).into_response();
        let retry_after = match &self {
            ApiError::Unavailable { retry_after_secs, .. } => Some(*retry_after_secs),
            ApiError::RateLimited { retry_after_secs } => Some(*retry_after_secs),
            ApiError::Timeout => Some(1),
            _ => None,
        };
        if matches!(self, ApiError::Unauthorized) {
            // RFC 9110 §11.6.1: a 401 names the scheme that would succeed.
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let ApiError::InsufficientScope { needs, .. } = &self {
            // RFC 6750 §3.1: the scope that would succeed.
            let value = format!("Bearer error=\"insufficient_scope\", scope=\"{}\"", needs.as_str());
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
            }
        }
        if let Some(secs) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
