//! The HTTP surface: routes, the OpenAPI document, and the middleware every
//! request passes through (request id, tracing, metrics, keyless mode's host
//! check, timeout, body limit, panics turned into 500s, and the error envelope).
//!
//! No SQL and no Redis here: handlers call the service.

pub mod consolidation;
pub mod dto;
pub mod erasure;
pub mod extract;
pub mod holds;
pub mod limits;
pub mod memories;
pub mod origin;
pub mod recall;
pub mod response;
pub mod retention;
pub mod share;
pub mod system;

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::error::{ApiError, REQUEST_ID};

const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

#[derive(OpenApi)]
#[openapi(
    info(
        title = "engram",
        description = "A memory server for AI agents: working, episodic, semantic and procedural memory.\n\n\
            Authentication: `Authorization: Bearer <key>` (the scheme in any case) when the server has API keys \
            configured; a 401 carries `WWW-Authenticate: Bearer`. Each key belongs to one tenant, and a tenant sees \
            only its own memories (another tenant's ids answer 404).\n\n\
            Input: no text or JSON value may contain NUL (U+0000); identifiers, skill names and metadata keys may \
            not contain control, bidirectional or invisible characters; an object that repeats a key is 422 naming \
            it.\n\n\
            Scopes: each key has one, listed as the role of an operation's `bearer` requirement: `read` (get, \
            list, history, search, context, sharing grants and teams), `read_write` (also write, update, delete, \
            share) or `admin` (also the retention preview, erasure, legal holds, sharing grants and teams, the audit log, `/metrics` and the checks of `/readyz`). A key with too small a scope gets 403 \
            `insufficient_scope`, its `WWW-Authenticate` naming the scope needed.\n\n\
            Errors: `{\"error\": {\"code\", \"message\", \"field\"?, \"request_id\"}}` with stable codes: \
            invalid_json (400), invalid_cursor (400), unauthorized (401), insufficient_scope (403, the API key's \
            scope does not allow the operation), share_not_granted (403, no grant lets the sender share with the \
            agents named), agent_not_allowed (403, the API key is bound to other agents than the one named), host_not_allowed and origin_not_allowed \
            (403, only without API keys: the Host and Origin headers must name localhost, 127.0.0.1, [::1] or a \
            configured host), memory_not_found (404), erasure_not_found (404), hold_not_found (404), grant_not_found (404), job_not_found (404), \
            route_not_found (404), method_not_allowed (405), idempotency_key_reused (409), conflict (409), \
            legal_hold (409, an erasure would touch memories under a legal hold; the message names the holds), \
            erasure_in_progress (409, a hold on a user whose erasure is unfinished), \
            payload_too_large (413), unsupported_media_type (415, a body without `Content-Type: application/json`), \
            invalid_field (422, `field` is a JSON pointer for body fields and the \
            parameter name for path and query parameters), service_unavailable and timeout (503, with Retry-After), \
            internal (500).",
        license(name = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "memories", description = "Write, read, list, update and delete memories"),
        (name = "recall", description = "Search with priority scoring, and token-budgeted context"),
        (name = "retention", description = "What the retention sweep will delete"),
        (name = "erasure", description = "Erasing a data subject's memories from every store, legal holds, and the audit log"),
        (name = "sharing", description = "Memories shared between agents under grants, redacted, with provenance"),
        (name = "consolidation", description = "Episodes turned into summaries and facts in the background"),
        (name = "operations", description = "Health, readiness and metrics"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every documented route.
fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(memories::create_memories, memories::list_memories))
        .routes(routes!(memories::get_memory, memories::update_memory, memories::delete_memory))
        .routes(routes!(memories::memory_history))
        .routes(routes!(recall::search_memories))
        .routes(routes!(recall::build_context))
        .routes(routes!(retention::preview_retention))
        .routes(routes!(erasure::request_erasure))
        .routes(routes!(erasure::get_erasure))
        .routes(routes!(erasure::list_audit))
        .routes(routes!(erasure::verify_audit))
        .routes(routes!(erasure::export_subject))
        .routes(routes!(holds::place_hold, holds::list_holds))
        .routes(routes!(holds::get_hold, holds::release_hold))
        .routes(routes!(share::share, share::list_shared))
        .routes(routes!(share::create_grant, share::list_grants))
        .routes(routes!(share::revoke_grant))
        .routes(routes!(share::set_team))
        .routes(routes!(share::list_teams))
        .routes(routes!(consolidation::request_consolidation))
        .routes(routes!(consolidation::get_consolidation))
        .routes(routes!(system::healthz))
        .routes(routes!(system::readyz))
        .routes(routes!(system::metrics))
}

/// The OpenAPI document, as served at `/openapi.json` and committed in `openapi/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_router().split_for_parts().1;
    document_common_responses(&mut doc);
    doc
}

/// The answers every `/v1` operation can give whatever it does, stated once
/// here rather than on each handler: 401 (a missing or unknown key, with its
/// challenge), 429 (`limits.rs`) and 503 (a backend down, or the request's
/// time ran out), each with the error body.
fn document_common_responses(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, HeaderBuilder, ObjectBuilder, Ref, Response, ResponseBuilder, Type};
    let error = |description: &str, header: &str, kind: Type, about: &str| -> Response {
        ResponseBuilder::new()
            .description(description)
            .header(
                header,
                HeaderBuilder::new()
                    .schema(Some(match kind {
                        // Seconds: a whole number, never negative.
                        Type::Integer => ObjectBuilder::new().schema_type(kind).minimum(Some(0)),
                        _ => ObjectBuilder::new().schema_type(kind),
                    }))
                    .description(Some(about))
                    .build(),
            )
            .content("application/json", ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build())
            .build()
    };
    let common = [
        (
            "401",
            error(
                "Missing or unknown API key (when the server has keys)",
                "WWW-Authenticate",
                Type::String,
                "`Bearer`",
            ),
        ),
        (
            "429",
            error(
                "Too many requests with this API key (its rate, or its requests in flight); see Retry-After",
                "Retry-After",
                Type::Integer,
                "Seconds to wait before retrying",
            ),
        ),
        (
            "503",
            error(
                "A backend is unavailable or the request timed out",
                "Retry-After",
                Type::Integer,
                "Seconds to wait before retrying",
            ),
        ),
    ];
    for (path, item) in doc.paths.paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        for op in
            [&mut item.get, &mut item.post, &mut item.patch, &mut item.put, &mut item.delete].into_iter().flatten()
        {
            for (status, response) in &common {
                op.responses.responses.insert(status.to_string(), response.clone().into());
            }
        }
    }
}

pub fn openapi_json() -> String {
    let mut text = openapi().to_pretty_json().unwrap_or_default();
    text.push('\n');
    text
}

/// The whole service: the REST API, its documents, and the MCP endpoint
/// (`/mcp`), whose tools call the REST API in-process (`crate::mcp`).
pub fn router(state: AppState) -> Router {
    let rest = with_layers(routes(), state.clone());
    let mcp = crate::mcp::http_service(rest, state.body_limit);
    let mcp = ServiceBuilder::new().layer(middleware::from_fn_with_state(state.clone(), mcp_guard)).service(mcp);
    with_layers(routes().route_service("/mcp", mcp), state)
}

/// The REST routes and the documents, without state or middleware.
fn routes() -> Router<AppState> {
    let (api, _) = api_router().split_for_parts();
    api.route("/openapi.json", get(system::openapi_json))
        .route("/docs", get(system::docs_page))
        .route("/docs/swagger-ui.css", get(system::docs_css))
        .route("/docs/swagger-ui-bundle.js", get(system::docs_js))
        .fallback(|| async { ApiError::RouteNotFound })
}

/// An MCP client needs a known key (any scope; each tool then needs the
/// scope of its REST operation), answered like the REST API's 401.
async fn mcp_guard(axum::extract::State(state): axum::extract::State<AppState>, req: Request, next: Next) -> Response {
    match state.auth.authorize(req.headers(), crate::config::Scope::Read) {
        Ok(_) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// The middleware every request passes through, and the state.
fn with_layers(routes: Router<AppState>, state: AppState) -> Router {
    let timeouts = Timeouts {
        request: Duration::from_millis(state.request_timeout_ms),
        write: Duration::from_millis(state.write_timeout_ms),
    };
    let body_limit = state.body_limit;
    let limits = state.limits.clone();
    routes
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(REQUEST_ID_HEADER, MakeRequestUuid))
                .layer(PropagateRequestIdLayer::new(REQUEST_ID_HEADER))
                .layer(middleware::from_fn(request_context))
                .layer(TraceLayer::new_for_http().make_span_with(request_span))
                .layer(middleware::from_fn_with_state(state.clone(), origin::guard_keyless))
                .layer(middleware::from_fn(move |req: Request, next: Next| {
                    let limits = limits.clone();
                    async move {
                        // Probes, metrics and the docs are never limited.
                        if req.uri().path().starts_with("/v1/") {
                            limits::limit(limits, req, next).await
                        } else {
                            next.run(req).await
                        }
                    }
                }))
                .layer(CatchPanicLayer::custom(|_| {
                    ApiError::Internal(anyhow::anyhow!("handler panicked")).into_response()
                }))
                .layer(middleware::from_fn(move |req: Request, next: Next| time_limit(timeouts, req, next)))
                .layer(DefaultBodyLimit::max(body_limit)),
        )
        .with_state(state)
}

/// The span every request's log lines carry. `key_id` is filled in by
/// authentication (`extract::Auth::authorize`) with the public id of the
/// request's API key: the key itself never reaches the log.
fn request_span(req: &Request) -> tracing::Span {
    let id = req.headers().get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    tracing::info_span!(
        "request",
        method = %req.method(),
        uri = %req.uri().path(),
        request_id = %id,
        key_id = tracing::field::Empty,
    )
}

/// How long a request may run: writes of memories get longer, since a large
/// batch's embedding takes its time (its work is dropped if it runs out).
#[derive(Clone, Copy)]
struct Timeouts {
    request: Duration,
    write: Duration,
}

/// Answers 503 `timeout` when the request runs past its time; dropping the
/// handler's future drops its remaining work.
async fn time_limit(timeouts: Timeouts, req: Request, next: Next) -> Response {
    // An MCP call may be a write (`remember`) and gets a write's time.
    let limit = if req.method() == axum::http::Method::POST && matches!(req.uri().path(), "/v1/memories" | "/mcp") {
        timeouts.write
    } else {
        timeouts.request
    };
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout.into_response(),
    }
}

/// Runs the request with its id in scope (so error bodies carry it), records
/// its latency per route, and gives bodiless error responses (such as
/// axum's 405) the standard error body.
async fn request_context(req: Request, next: Next) -> Response {
    let id = req
        .extensions()
        .get::<RequestId>()
        .and_then(|r| r.header_value().to_str().ok())
        .unwrap_or_default()
        .to_string();
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().to_string();
    let started = Instant::now();
    let response = REQUEST_ID
        .scope(id.clone(), async move {
            let response = next.run(req).await;
            if response.status() == StatusCode::METHOD_NOT_ALLOWED && is_empty(&response) {
                return ApiError::MethodNotAllowed.into_response();
            }
            response
        })
        .await;
    metrics::histogram!(
        "engram_http_request_duration_seconds",
        "method" => method,
        "route" => route,
        "status" => response.status().as_u16().to_string()
    )
    .record(started.elapsed().as_secs_f64());
    response
}

fn is_empty(response: &Response<Body>) -> bool {
    use http_body::Body as _;
    response.body().size_hint().exact() == Some(0)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::config::{ApiKeyConfig, AuthConfig, Scope};
    use crate::http::extract::Auth;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// OpenAPI 3.1 requires a description on every response; generators
    /// (openapi-python-client) refuse a document without one.
    #[test]
    fn every_documented_response_has_a_description() {
        use utoipa::openapi::RefOr;
        let doc = openapi();
        for (path, item) in &doc.paths.paths {
            for op in [&item.get, &item.post, &item.patch, &item.put, &item.delete].into_iter().flatten() {
                for (status, response) in &op.responses.responses {
                    if let RefOr::T(response) = response {
                        assert!(!response.description.trim().is_empty(), "{path} {status}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_request_span_names_the_key_by_its_id_not_the_key() {
        let key =
            ApiKeyConfig { id: "ci-reader".into(), ..ApiKeyConfig::from_plain("acme", "s3cret-key", Scope::Read) };
        let auth = Auth::new(&AuthConfig { keys: vec![key], ..AuthConfig::default() });
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        tracing::subscriber::with_default(subscriber, || {
            let req = Request::builder()
                .uri("/v1/memories")
                .header(axum::http::header::AUTHORIZATION, "Bearer s3cret-key")
                .body(Body::empty())
                .unwrap();
            let _span = request_span(&req).entered();
            // Refused for its scope, and still named.
            assert!(auth.authorize(req.headers(), Scope::ReadWrite).is_err());
            tracing::info!("answered");
        });
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(log.contains("key_id=ci-reader"), "{log}");
        assert!(!log.contains("s3cret"), "{log}");
    }
}
