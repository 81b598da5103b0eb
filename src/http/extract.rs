//! Extractors that turn every kind of bad input into the API's error body:
//! malformed JSON (400), a wrong or missing field (422 with its JSON pointer),
//! an oversized body (413), a body that is not `application/json` (415), a
//! missing or unknown API key (401).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::app::AppState;
use crate::error::ApiError;

/// A JSON body, deserialised with the path of any error, plus the SHA-256 of
/// the raw bytes (what idempotency keys are compared on).
pub struct ValidJson<T> {
    pub value: T,
    pub body_sha256: String,
}

impl<T: DeserializeOwned> FromRequest<AppState> for ValidJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        require_json_content_type(req.headers())?;
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(state.body_limit)
            } else {
                ApiError::InvalidJson(rejection.body_text())
            }
        })?;
        let body_sha256 = hex::encode(Sha256::digest(&bytes));
        let raw: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
        let value = from_value(raw)?;
        Ok(ValidJson { value, body_sha256 })
    }
}

/// Bodies must say they are JSON. Besides telling clients early that they
/// sent something else, this keeps web pages out: a cross-site form or a
/// `fetch` without a CORS preflight can only send `text/plain`, form or
/// multipart bodies, never `application/json`.
fn require_json_content_type(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(axum::http::header::CONTENT_TYPE) else {
        return Err(ApiError::UnsupportedMediaType(
            "the request has no Content-Type; send the body as JSON with `Content-Type: application/json`".into(),
        ));
    };
    let text = value.to_str().unwrap_or("");
    let essence = text.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    Err(ApiError::UnsupportedMediaType(format!(
        "Content-Type `{}` is not accepted; send the body as JSON with `Content-Type: application/json`",
        text.chars().take(100).collect::<String>()
    )))
}

/// Deserialises a JSON value, naming the failing field as a JSON pointer.
pub fn from_value<T: DeserializeOwned>(raw: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(raw).map_err(|e| {
        let mut pointer = pointer_of(e.path());
        let message = e.inner().to_string();
        // serde reports a missing field at its parent; point at the field itself.
        if let Some(rest) = message.strip_prefix("missing field `")
            && let Some(name) = rest.split('`').next()
        {
            pointer = format!("{pointer}/{}", escape(name));
        }
        ApiError::field(pointer, message)
    })
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

fn pointer_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("/{index}")),
            Segment::Map { key } => out.push_str(&format!("/{}", escape(key))),
            Segment::Enum { variant } => out.push_str(&format!("/{}", escape(variant))),
            Segment::Unknown => {}
        }
    }
    out
}

/// The tenant a request acts for, from its bearer key.
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

/// API keys, by SHA-256, and the tenant of an open server.
pub struct Auth {
    keys: Vec<([u8; 32], String)>,
    open_tenant: String,
    /// Configured host names a keyless server answers to (lower case).
    allowed_hosts: Vec<String>,
}

impl Auth {
    pub fn new(config: &crate::config::AuthConfig) -> Auth {
        let keys = config
            .keys
            .iter()
            .filter_map(|k| {
                let bytes: [u8; 32] = hex::decode(&k.key_sha256).ok()?.try_into().ok()?;
                Some((bytes, k.tenant.clone()))
            })
            .collect();
        let allowed_hosts = config.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
        Auth { keys, open_tenant: config.default_tenant.clone(), allowed_hosts }
    }

    /// Whether a keyless server answers requests naming `host` (without its port).
    pub fn host_allowed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        ["localhost", "127.0.0.1", "[::1]"].contains(&host) || self.allowed_hosts.iter().any(|h| h == host)
    }

    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tenant of a bearer token. Every configured key is compared, in
    /// constant time, so timing says nothing about which keys exist.
    pub fn tenant_of(&self, token: &str) -> Option<String> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (hash, tenant) in &self.keys {
            if bool::from(hash.ct_eq(&digest)) {
                found = Some(tenant.clone());
            }
        }
        found
    }
}

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if state.auth.is_open() {
            return Ok(Tenant(state.auth.open_tenant.clone()));
        }
        let token = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .ok_or(ApiError::Unauthorized)?;
        state.auth.tenant_of(token).map(Tenant).ok_or(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiKeyConfig, AuthConfig};

    #[test]
    fn keys_map_to_their_tenant_only() {
        let auth = Auth::new(&AuthConfig {
            default_tenant: "default".into(),
            keys: vec![
                ApiKeyConfig { tenant: "a".into(), key_sha256: hex::encode(Sha256::digest(b"key-a")) },
                ApiKeyConfig { tenant: "b".into(), key_sha256: hex::encode(Sha256::digest(b"key-b")) },
            ],
            ..AuthConfig::default()
        });
        assert_eq!(auth.tenant_of("key-a").as_deref(), Some("a"));
        assert_eq!(auth.tenant_of("key-b").as_deref(), Some("b"));
        assert_eq!(auth.tenant_of("key-c"), None);
        assert!(!auth.is_open());
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        importance: f32,
        name: String,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Batch {
        memories: Vec<Item>,
    }

    fn field_of(err: ApiError) -> String {
        match err {
            ApiError::InvalidField(fe) => fe.field,
            other => panic!("expected invalid_field, got {other:?}"),
        }
    }

    #[test]
    fn errors_point_at_the_field() {
        let bad_type =
            serde_json::json!({"memories": [{"importance": 1, "name": "a"}, {"importance": "x", "name": "b"}]});
        assert_eq!(field_of(from_value::<Batch>(bad_type).unwrap_err()), "/memories/1/importance");
        let missing = serde_json::json!({"memories": [{"importance": 1}]});
        assert_eq!(field_of(from_value::<Batch>(missing).unwrap_err()), "/memories/0/name");
        let unknown = serde_json::json!({"memories": [{"importance": 1, "name": "a", "colour": 2}]});
        assert_eq!(field_of(from_value::<Batch>(unknown).unwrap_err()), "/memories/0/colour");
    }
}
