//! Extractors that turn every kind of bad input into the API's error body:
//! malformed JSON (400), a wrong, missing or repeated field (422 with its JSON
//! pointer, in the API's words rather than serde's), an oversized body (413),
//! a body that is not `application/json` (415), a missing or unknown API key
//! (401), a key whose scope does not allow the operation (403).

use std::cell::RefCell;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::app::AppState;
use crate::config::Scope;
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
        let value = from_value(parse_json(&bytes)?)?;
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

/// Parses a JSON body, refusing an object that holds a key twice (422 naming
/// the second one): serde_json would keep the last silently, and a client
/// that sent both meant something we cannot know.
pub fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    let duplicate = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = Strict { at: String::new(), duplicate: &duplicate }.deserialize(&mut de).and_then(|v| {
        de.end()?;
        Ok(v)
    });
    match (parsed, duplicate.into_inner()) {
        (_, Some(pointer)) => Err(ApiError::field(pointer, "appears twice in its object; give each key once")),
        (Err(e), None) => Err(ApiError::InvalidJson(e.to_string())),
        (Ok(v), None) => Ok(v),
    }
}

/// A JSON value built as serde_json builds one, noting the pointer of the
/// first repeated key.
struct Strict<'a> {
    at: String,
    duplicate: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) =
            seq.next_element_seed(Strict { at: format!("{}/{}", self.at, items.len()), duplicate: self.duplicate })?
        {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let at = format!("{}/{}", self.at, escape(&key));
            if out.contains_key(&key) {
                *self.duplicate.borrow_mut() = Some(at);
                return Err(de::Error::custom("duplicate key"));
            }
            let v = map.next_value_seed(Strict { at, duplicate: self.duplicate })?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Deserialises a JSON value, naming the failing field as a JSON pointer.
pub fn from_value<T: DeserializeOwned>(raw: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(raw).map_err(|e| {
        let mut pointer = pointer_of(e.path());
        let message = e.inner().to_string();
        // serde reports a missing field at its parent; point at the field itself.
        if let Some(rest) = message.strip_prefix("missing field `")
            && let Some(name) = rest.split('`').next()
        {
            pointer = format!("{pointer}/{}", escape(name));
        }
        ApiError::field(pointer, in_api_words(&message))
    })
}

/// serde's messages speak Rust ("invalid type: string \"x\", expected f64",
/// "unknown variant"); clients read JSON. This rewrites each of serde's
/// message shapes; anything else (chrono's, uuid's) is already plain.
fn in_api_words(message: &str) -> String {
    if message.starts_with("missing field `") {
        return "is required".into();
    }
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((name, expected)) = rest.split_once("`, ")
    {
        return match expected.strip_prefix("expected ") {
            Some(list) => format!("`{name}` is not a field here; expected {list}"),
            None => format!("`{name}` is not a field here; this object takes no fields"),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((got, expected)) = rest.split_once("`, ")
    {
        let expected = expected.strip_prefix("expected ").unwrap_or("a known value");
        return format!("must be {expected}, not `{got}`");
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((got, expected)) = rest.rsplit_once(", expected ")
        {
            return format!("must be {}, not {}", expected_in_words(expected), got_in_words(got));
        }
    }
    if message.starts_with("invalid length ") {
        return "has the wrong number of items".into();
    }
    // The parsers of timestamps (chrono) and ids (uuid) say what is wrong but
    // not what was wanted.
    if let Some(rest) = message.strip_prefix("UUID parsing failed: ") {
        return format!("must be a UUID ({rest})");
    }
    const CHRONO: [&str; 7] = [
        "input contains invalid characters",
        "premature end of input",
        "trailing input",
        "input is out of range",
        "input is not enough for unique date and time",
        "no possible date and time matching input",
        "bad or unsupported format string",
    ];
    if CHRONO.contains(&message) {
        return format!("must be an RFC 3339 timestamp ({message})");
    }
    message.to_string()
}

fn expected_in_words(expected: &str) -> &str {
    match expected {
        "f64" | "f32" => "a number",
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number, 0 or more",
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number",
        "a map" => "an object",
        "string or map" => "a string",
        "a sequence" => "an array",
        e if e.starts_with("struct ") => "an object",
        e if e.starts_with("enum ") => "a string",
        other => other,
    }
}

fn got_in_words(got: &str) -> String {
    let number = |s: &str| s.trim_matches('`').to_string();
    if let Some(n) = got.strip_prefix("integer ").or_else(|| got.strip_prefix("floating point ")) {
        return number(n);
    }
    if let Some(b) = got.strip_prefix("boolean ") {
        return number(b);
    }
    match got {
        "map" => "an object".into(),
        "sequence" => "an array".into(),
        "unit value" => "null".into(),
        s if s.starts_with("string ") => format!("the {s}"),
        other => other.to_string(),
    }
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

/// The tenant a request acts for, from a bearer key whose scope allows
/// `read_write`: what every route that changes memories takes.
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

/// The tenant of a request that only reads (any key's scope allows it).
#[derive(Debug, Clone)]
pub struct ReadTenant(pub String);

/// The tenant of a request for an operator's route (an `admin` key).
#[derive(Debug, Clone)]
pub struct AdminTenant(pub String);

/// An `admin` key's tenant and the key's id (`keyless` without keys), for
/// operations the audit log records.
#[derive(Debug, Clone)]
pub struct AdminActor {
    pub tenant: String,
    pub key_id: String,
}

/// The actor the audit log names for requests of a server without keys.
pub const KEYLESS_ACTOR: &str = "keyless";

/// The agents a request's API key acts for: every agent of the tenant for
/// a key that is not bound to agents, and without keys.
#[derive(Debug, Clone, Default)]
pub struct Agents(Option<Arc<[String]>>);

impl Agents {
    /// Every agent (an unbound key).
    pub fn all() -> Agents {
        Agents(None)
    }

    pub fn allows(&self, agent: &str) -> bool {
        self.0.as_ref().is_none_or(|agents| agents.iter().any(|a| a == agent))
    }

    /// 403 `agent_not_allowed`, naming `field`, when the key does not act
    /// for `agent`.
    pub fn check(&self, field: &str, agent: &str) -> Result<(), ApiError> {
        if self.allows(agent) {
            Ok(())
        } else {
            Err(ApiError::AgentNotAllowed { field: field.to_string(), agent: agent.to_string() })
        }
    }

    /// The agents of a bound key; `None` for every agent.
    pub fn bound(&self) -> Option<&[String]> {
        self.0.as_deref()
    }
}

/// One configured key: its hash, and what it stands for.
struct Key {
    sha256: [u8; 32],
    id: String,
    tenant: String,
    scope: Scope,
    agents: Agents,
}

/// API keys, by SHA-256, and the tenant of an open server.
pub struct Auth {
    keys: Vec<Key>,
    open_tenant: String,
    /// Configured host names a keyless server answers to (lower case).
    allowed_hosts: Vec<String>,
    /// Whether `/metrics` answers without an admin key when there are keys.
    pub open_metrics: bool,
}

impl Auth {
    pub fn new(config: &crate::config::AuthConfig) -> Auth {
        let keys = config
            .keys
            .iter()
            .filter_map(|k| {
                let sha256: [u8; 32] = hex::decode(&k.key_sha256).ok()?.try_into().ok()?;
                let agents = Agents((!k.agents.is_empty()).then(|| k.agents.clone().into()));
                Some(Key { sha256, id: k.id.clone(), tenant: k.tenant.clone(), scope: k.scope, agents })
            })
            .collect();
        let allowed_hosts = config.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
        Auth { keys, open_tenant: config.default_tenant.clone(), allowed_hosts, open_metrics: config.open_metrics }
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

    /// The key a bearer token is. Every configured key is compared, in
    /// constant time, so timing says nothing about which keys exist.
    fn key_of(&self, token: &str) -> Option<&Key> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.sha256.ct_eq(&digest)) {
                found = Some(key);
            }
        }
        found
    }

    /// The tenant a request acts for, when its key's scope includes `needs`.
    /// Without keys every request is the open tenant's, with every scope.
    /// The key's id (never the key) is recorded in the request's span as
    /// `key_id`, also when its scope is too small.
    pub fn authorize(&self, headers: &axum::http::HeaderMap, needs: Scope) -> Result<String, ApiError> {
        self.identify(headers)?.allow(needs).map(|(tenant, ..)| tenant)
    }

    /// Who a request's key is (401 when it has none or an unknown one),
    /// before any scope is asked for.
    fn identify(&self, headers: &axum::http::HeaderMap) -> Result<Caller, ApiError> {
        if self.is_open() {
            return Ok(Caller {
                tenant: self.open_tenant.clone(),
                key_id: KEYLESS_ACTOR.to_string(),
                scope: Scope::Admin,
                agents: Agents::all(),
            });
        }
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .ok_or(ApiError::Unauthorized)?;
        let key = self.key_of(token).ok_or(ApiError::Unauthorized)?;
        tracing::Span::current().record("key_id", tracing::field::display(&key.id));
        Ok(Caller { tenant: key.tenant.clone(), key_id: key.id.clone(), scope: key.scope, agents: key.agents.clone() })
    }
}

/// The key a request carries, identified once per request: a handler takes
/// several extractors (its tenant, its agents, the key's id), and each would
/// otherwise hash the token against every configured key again.
#[derive(Debug, Clone)]
struct Caller {
    tenant: String,
    key_id: String,
    scope: Scope,
    agents: Agents,
}

impl Caller {
    fn allow(self, needs: Scope) -> Result<(String, String, Agents), ApiError> {
        if self.scope < needs {
            return Err(ApiError::InsufficientScope { has: self.scope, needs });
        }
        Ok((self.tenant, self.key_id, self.agents))
    }
}

/// The request's caller, from its extensions when an earlier extractor
/// identified it, then checked against `needs`.
fn authorized(parts: &mut Parts, state: &AppState, needs: Scope) -> Result<(String, String, Agents), ApiError> {
    let caller = match parts.extensions.get::<Caller>() {
        Some(c) => c.clone(),
        None => {
            let c = state.auth.identify(&parts.headers)?;
            parts.extensions.insert(c.clone());
            c
        }
    };
    caller.allow(needs)
}

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authorized(parts, state, Scope::ReadWrite).map(|(tenant, ..)| Tenant(tenant))
    }
}

impl FromRequestParts<AppState> for ReadTenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authorized(parts, state, Scope::Read).map(|(tenant, ..)| ReadTenant(tenant))
    }
}

impl FromRequestParts<AppState> for AdminActor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let (tenant, key_id, _) = authorized(parts, state, Scope::Admin)?;
        Ok(AdminActor { tenant, key_id })
    }
}

/// The id of the request's API key (`keyless` without keys), for records
/// of who did what; authorization is the job of the other extractors.
#[derive(Debug, Clone)]
pub struct KeyId(pub String);

impl FromRequestParts<AppState> for KeyId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authorized(parts, state, Scope::Read).map(|(_, id, _)| KeyId(id))
    }
}

impl FromRequestParts<AppState> for Agents {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authorized(parts, state, Scope::Read).map(|(_, _, agents)| agents)
    }
}

impl FromRequestParts<AppState> for AdminTenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authorized(parts, state, Scope::Admin).map(|(tenant, ..)| AdminTenant(tenant))
    }
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is
/// case-insensitive (RFC 9110 §11.1): `bearer` and `BEARER` work alike.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The pairs of a raw query string (none when there is no query), or 422
/// naming `query` when it is not `application/x-www-form-urlencoded`.
pub fn query_pairs(raw: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    serde_urlencoded::from_str(raw.unwrap_or("")).map_err(|_| ApiError::field("query", "is not a valid query string"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiKeyConfig, AuthConfig};

    fn bearer(key: &str) -> axum::http::HeaderMap {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(axum::http::header::AUTHORIZATION, format!("Bearer {key}").parse().unwrap());
        headers
    }

    fn keyed_auth() -> Auth {
        Auth::new(&AuthConfig {
            default_tenant: "default".into(),
            keys: vec![
                ApiKeyConfig { id: "ka".into(), ..ApiKeyConfig::from_plain("a", "key-a", Scope::Read) },
                ApiKeyConfig::from_plain("b", "key-b", Scope::ReadWrite),
                ApiKeyConfig::from_plain("b", "key-ops", Scope::Admin),
            ],
            ..AuthConfig::default()
        })
    }

    #[test]
    fn keys_map_to_their_tenant_only() {
        let auth = keyed_auth();
        assert_eq!(auth.authorize(&bearer("key-a"), Scope::Read).unwrap(), "a");
        assert_eq!(auth.authorize(&bearer("key-b"), Scope::Read).unwrap(), "b");
        assert!(matches!(auth.authorize(&bearer("key-c"), Scope::Read), Err(ApiError::Unauthorized)));
        assert!(matches!(auth.authorize(&axum::http::HeaderMap::new(), Scope::Read), Err(ApiError::Unauthorized)));
        assert!(!auth.is_open());
    }

    #[test]
    fn a_scope_includes_the_smaller_ones_only() {
        let auth = keyed_auth();
        let verdict = |key: &str, needs: Scope| match auth.authorize(&bearer(key), needs) {
            Ok(_) => "ok".to_string(),
            Err(ApiError::InsufficientScope { has, needs }) => format!("{} < {}", has.as_str(), needs.as_str()),
            Err(e) => panic!("{e:?}"),
        };
        assert_eq!(verdict("key-a", Scope::ReadWrite), "read < read_write");
        assert_eq!(verdict("key-a", Scope::Admin), "read < admin");
        assert_eq!(verdict("key-b", Scope::ReadWrite), "ok");
        assert_eq!(verdict("key-b", Scope::Admin), "read_write < admin");
        assert_eq!(verdict("key-ops", Scope::Admin), "ok");
        // Without keys every request may do everything.
        let open = Auth::new(&AuthConfig::default());
        assert_eq!(open.authorize(&axum::http::HeaderMap::new(), Scope::Admin).unwrap(), "default");
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
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer k"), Some("k"));
        assert_eq!(bearer_token("BEARER k"), Some("k"));
        assert_eq!(bearer_token("bEaReR  k "), Some("k"));
        assert_eq!(bearer_token("Basic k"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerk"), None);
    }

    #[test]
    fn a_repeated_key_is_named_at_any_depth() {
        let field = |body: &str| match parse_json(body.as_bytes()) {
            Err(ApiError::InvalidField(fe)) => fe.field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(r#"{"a": 1, "a": 2}"#), "/a");
        assert_eq!(field(r#"{"m": [{"x": 1}, {"k/y": 1, "k/y": 2}]}"#), "/m/1/k~1y");
        assert!(matches!(parse_json(br#"{"a": 1} x"#), Err(ApiError::InvalidJson(_))));
        assert_eq!(parse_json(br#"{"a": {"a": 1}, "b": [1.5, null]}"#).unwrap()["b"][0], 1.5);
    }

    #[test]
    fn serde_messages_are_put_in_the_apis_words() {
        let message = |v: Value| match from_value::<Batch>(v) {
            Err(ApiError::InvalidField(fe)) => fe.message,
            other => panic!("{other:?}"),
        };
        let m = message(serde_json::json!({"memories": [{"importance": "x", "name": "b"}]}));
        assert_eq!(m, r#"must be a number, not the string "x""#);
        assert_eq!(message(serde_json::json!({"memories": {}})), "must be an array, not an object");
        assert_eq!(message(serde_json::json!({"memories": [{"importance": 1}]})), "is required");
        assert_eq!(message(serde_json::json!({"memories": [3]})), "must be an object, not 3");
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
