//! The Model Context Protocol surface: tools `remember`, `recall`, `context`
//! and `forget`, and a resource template for an agent's recent memories,
//! served over Streamable HTTP at `/mcp` and over standard input and output
//! (`engram mcp`).
//!
//! Each tool call is one call of the REST API, made in-process through the
//! same router (or, for `engram mcp --url`, to a running server) with the
//! caller's API key. Validation, scopes, tenants, agent binding, rate limits
//! and error codes are therefore the REST API's, written once; a tool's
//! arguments are the REST body's fields, and its input schema is read from
//! the OpenAPI document.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, header};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject,
    ListResourceTemplatesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
    Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tower::ServiceExt;

/// The URI template of an agent's recent memories.
const RECENT_TEMPLATE: &str = "engram://agents/{agent_id}/memories";
const RECENT_PREFIX: &str = "engram://agents/";
const RECENT_SUFFIX: &str = "/memories";
/// How many memories the resource holds.
const RECENT_LIMIT: usize = 50;
/// Fields of `/v1/context` that the `context` tool replaces with `max_tokens`.
const CONTEXT_BUDGET_FIELDS: [&str; 4] =
    ["max_context_tokens", "system_prompt", "system_prompt_tokens", "output_reserve_tokens"];

/// Where a tool's REST call goes.
pub enum Upstream {
    /// This process's own router (the `/mcp` route, and `engram mcp` on its
    /// own store).
    Local(Router),
    /// A running engram server (`engram mcp --url`).
    Remote { client: reqwest::Client, base: String },
}

/// A REST answer: its status and JSON body (`null` when empty).
struct Reply {
    status: u16,
    body: Value,
}

impl Upstream {
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        authorization: Option<&HeaderValue>,
    ) -> Result<Reply, ErrorData> {
        let unreachable = |e: &dyn std::fmt::Display| ErrorData::internal_error(format!("engram: {e}"), None);
        match self {
            Upstream::Local(router) => {
                // The keyless Host check of the REST API sees a loopback
                // host: the MCP request itself passed that check already.
                let mut req = Request::builder().method(method).uri(path).header(header::HOST, "localhost");
                if let Some(auth) = authorization {
                    req = req.header(header::AUTHORIZATION, auth);
                }
                let req = match body {
                    Some(b) => req.header(header::CONTENT_TYPE, "application/json").body(Body::from(b.to_string())),
                    None => req.body(Body::empty()),
                }
                .map_err(|e| unreachable(&e))?;
                let response = router.clone().oneshot(req).await.map_err(|e| unreachable(&e))?;
                let status = response.status().as_u16();
                let bytes =
                    axum::body::to_bytes(response.into_body(), usize::MAX).await.map_err(|e| unreachable(&e))?;
                Ok(Reply { status, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) })
            }
            Upstream::Remote { client, base } => {
                let mut req = client.request(method, format!("{base}{path}"));
                if let Some(auth) = authorization {
                    req = req.header(header::AUTHORIZATION, auth);
                }
                if let Some(b) = body {
                    req = req.json(b);
                }
                let response = req.send().await.map_err(|e| unreachable(&e))?;
                let status = response.status().as_u16();
                let bytes = response.bytes().await.map_err(|e| unreachable(&e))?;
                Ok(Reply { status, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) })
            }
        }
    }
}

/// The MCP server: one per connection (HTTP requests are stateless, each
/// gets a fresh one; stdio keeps one).
#[derive(Clone)]
pub struct EngramMcp {
    upstream: Arc<Upstream>,
    /// The key of `engram mcp`'s own caller (`ENGRAM_API_KEY`); over HTTP
    /// the request's `Authorization` header is used instead.
    key: Option<HeaderValue>,
    tools: Arc<Vec<Tool>>,
}

impl EngramMcp {
    pub fn new(upstream: Arc<Upstream>, key: Option<&str>) -> anyhow::Result<EngramMcp> {
        let key = key
            .map(|k| HeaderValue::from_str(&format!("Bearer {k}")))
            .transpose()
            .map_err(|_| anyhow::anyhow!("the API key holds characters that cannot go in a header"))?;
        Ok(EngramMcp::with_key(upstream, key))
    }

    fn with_key(upstream: Arc<Upstream>, key: Option<HeaderValue>) -> EngramMcp {
        EngramMcp { upstream, key, tools: Arc::new(tools()) }
    }

    fn authorization(&self, ctx: &RequestContext<RoleServer>) -> Option<HeaderValue> {
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get(header::AUTHORIZATION).cloned())
            .or_else(|| self.key.clone())
    }

    async fn remember(&self, args: JsonObject, auth: Option<&HeaderValue>) -> Result<CallToolResult, ErrorData> {
        let reply = self.upstream.send(Method::POST, "/v1/memories", Some(&Value::Object(args)), auth).await?;
        if !is_success(reply.status) {
            return Ok(failure(reply.body, &[]));
        }
        // The write's answer for its one memory.
        let written = reply.body.pointer("/memories/0").cloned().unwrap_or(reply.body);
        Ok(CallToolResult::structured(written))
    }

    async fn recall(&self, args: JsonObject, auth: Option<&HeaderValue>) -> Result<CallToolResult, ErrorData> {
        let reply = self.upstream.send(Method::POST, "/v1/memories/search", Some(&Value::Object(args)), auth).await?;
        if !is_success(reply.status) {
            return Ok(failure(reply.body, &[]));
        }
        Ok(CallToolResult::structured(reply.body))
    }

    async fn context(&self, mut args: JsonObject, auth: Option<&HeaderValue>) -> Result<CallToolResult, ErrorData> {
        if let Some(field) = CONTEXT_BUDGET_FIELDS.iter().find(|f| args.contains_key(**f)) {
            return Ok(invalid(&format!("/{field}"), "unknown field: the context tool's budget is `max_tokens`"));
        }
        // The block may take `max_tokens`; nothing else shares the window.
        let Some(budget) = args.remove("max_tokens") else {
            return Ok(invalid("/max_tokens", "missing field `max_tokens`"));
        };
        args.insert("max_context_tokens".into(), budget);
        args.insert("output_reserve_tokens".into(), 0.into());
        let reply = self.upstream.send(Method::POST, "/v1/context", Some(&Value::Object(args)), auth).await?;
        if !is_success(reply.status) {
            return Ok(failure(reply.body, &[("/max_context_tokens", "/max_tokens")]));
        }
        let block = reply.body.get("context").and_then(Value::as_str).unwrap_or_default().to_string();
        let text = if block.is_empty() { "(no memory matched the query)".to_string() } else { block };
        let mut result = CallToolResult::structured(reply.body);
        result.content = vec![ContentBlock::text(text)];
        Ok(result)
    }

    async fn forget(&self, mut args: JsonObject, auth: Option<&HeaderValue>) -> Result<CallToolResult, ErrorData> {
        if let Some(unknown) = args.keys().find(|k| !matches!(k.as_str(), "memory_id" | "user_id" | "agent_id")) {
            return Ok(invalid(
                &format!("/{unknown}"),
                "unknown field: expected `memory_id`, or `user_id` with an optional `agent_id`",
            ));
        }
        match (args.remove("memory_id"), args.contains_key("user_id")) {
            (Some(id), false) => {
                if args.contains_key("agent_id") {
                    return Ok(invalid("/agent_id", "narrows a `user_id` erasure only"));
                }
                let Some(id) = id.as_str().and_then(|s| uuid::Uuid::parse_str(s).ok()) else {
                    return Ok(invalid("/memory_id", "expected a memory id (a UUID)"));
                };
                let reply = self.upstream.send(Method::DELETE, &format!("/v1/memories/{id}"), None, auth).await?;
                if !is_success(reply.status) {
                    return Ok(failure(reply.body, &[]));
                }
                Ok(CallToolResult::structured(json!({ "deleted": id })))
            }
            (None, true) => {
                // A data subject's erasure (needs an admin key): every tier
                // and store, verified and audited, answered with its receipt.
                let reply = self.upstream.send(Method::POST, "/v1/erasure", Some(&Value::Object(args)), auth).await?;
                if !is_success(reply.status) {
                    return Ok(failure(reply.body, &[]));
                }
                Ok(CallToolResult::structured(reply.body))
            }
            (Some(_), true) => Ok(invalid("/memory_id", "give `memory_id` or `user_id`, not both")),
            (None, false) => Ok(invalid("/memory_id", "give `memory_id` (one memory) or `user_id` (erase a user)")),
        }
    }
}

fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

/// A REST error as a tool error the model can read and act on: the error
/// object (`code`, `message`, `field`, `request_id`) as structured content,
/// and one line of text. `renamed` maps REST field names to the tool's.
fn failure(body: Value, renamed: &[(&str, &str)]) -> CallToolResult {
    let mut error = body.get("error").cloned().unwrap_or_else(|| json!({"code": "internal", "message": "no answer"}));
    if let Some(field) = error.get("field").and_then(Value::as_str)
        && let Some((_, to)) = renamed.iter().find(|(from, _)| *from == field)
    {
        error["field"] = Value::from(*to);
    }
    let code = error.get("code").and_then(Value::as_str).unwrap_or("error");
    let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
    let text = match error.get("field").and_then(Value::as_str) {
        Some(field) => format!("{code}: {message} (field {field})"),
        None => format!("{code}: {message}"),
    };
    let mut result = CallToolResult::structured_error(json!({ "error": error }));
    result.content = vec![ContentBlock::text(text)];
    result
}

/// A bad argument found before any REST call, in the REST API's words.
fn invalid(field: &str, message: &str) -> CallToolResult {
    failure(json!({"error": {"code": "invalid_field", "message": message, "field": field}}), &[])
}

impl ServerHandler for EngramMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
            .with_server_info(Implementation::new("engram", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "engram is this agent's long-term memory. Call `recall` (or `context` for a ready-made block) \
                 before answering anything that may depend on what was said or learned earlier; call \
                 `remember` for facts about the user, decisions, outcomes and preferences worth keeping; \
                 call `forget` when the user asks for something to be forgotten. Every call names the \
                 `agent_id` whose memory it uses.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let auth = self.authorization(&context);
        let args = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "remember" => self.remember(args, auth.as_ref()).await?,
            "recall" => self.recall(args, auth.as_ref()).await?,
            "context" => self.context(args, auth.as_ref()).await?,
            "forget" => self.forget(args, auth.as_ref()).await?,
            other => return Err(ErrorData::invalid_params(format!("no tool named `{other}`"), None)),
        };
        Ok(result.into())
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let template = ResourceTemplate::new(RECENT_TEMPLATE, "recent-memories")
            .with_title("An agent's recent memories")
            .with_description(format!(
                "The agent's {RECENT_LIMIT} most recently written memories (every tier but working memory), \
                 as the JSON of GET /v1/memories."
            ))
            .with_mime_type("application/json");
        Ok(ListResourceTemplatesResult::with_all_items(vec![template]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let Some(agent) = uri.strip_prefix(RECENT_PREFIX).and_then(|rest| rest.strip_suffix(RECENT_SUFFIX)) else {
            return Err(ErrorData::resource_not_found(format!("no resource {uri}; expected {RECENT_TEMPLATE}"), None));
        };
        let query = serde_urlencoded::to_string([("agent_id", agent), ("limit", &RECENT_LIMIT.to_string())])
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let auth = self.authorization(&context);
        let reply = self.upstream.send(Method::GET, &format!("/v1/memories?{query}"), None, auth.as_ref()).await?;
        if !is_success(reply.status) {
            let error = reply.body.get("error").cloned().unwrap_or(Value::Null);
            let message = error.get("message").and_then(Value::as_str).unwrap_or("refused").to_string();
            return Err(ErrorData::invalid_params(message, Some(error)));
        }
        let contents = ResourceContents::text(reply.body.to_string(), uri).with_mime_type("application/json");
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

/// The tools, their input schemas taken from the OpenAPI document's request
/// bodies (references inlined, so a client needs nothing else).
fn tools() -> Vec<Tool> {
    let doc = serde_json::to_value(crate::http::openapi()).unwrap_or_default();
    let schemas = doc.pointer("/components/schemas").cloned().unwrap_or_default();
    let schema = |name: &str| -> JsonObject {
        match inline_refs(schemas.get(name).cloned().unwrap_or_default(), &schemas, 0) {
            Value::Object(mut o) => {
                o.remove("description");
                o
            }
            _ => JsonObject::new(),
        }
    };
    let mut context = schema("ContextRequest");
    if let Some(Value::Object(properties)) = context.get_mut("properties") {
        for field in CONTEXT_BUDGET_FIELDS {
            properties.remove(field);
        }
        properties.insert(
            "max_tokens".into(),
            json!({"type": "integer", "minimum": 1,
                   "description": "The most tokens the block may take (counted with `tokenizer`)."}),
        );
    }
    context.insert("required".into(), json!(["agent_id", "query", "max_tokens"]));
    let forget = json!({
        "type": "object",
        "properties": {
            "memory_id": {"type": "string", "format": "uuid",
                          "description": "Delete this one memory (its `id`, as remember or recall gave it)."},
            "user_id": {"type": "string", "minLength": 1, "maxLength": 200,
                        "description": "Erase every memory of this user, in every tier and store, verified and \
                                        audited (needs an admin key); answered with the erasure's receipt."},
            "agent_id": {"type": "string", "minLength": 1, "maxLength": 200,
                         "description": "With `user_id`: only the user's memories with this agent."}
        },
        "additionalProperties": false
    });
    let forget = match forget {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    };
    let annotate = |read_only: bool, destructive: bool, idempotent: bool| {
        let mut a = ToolAnnotations::new();
        a.read_only_hint = Some(read_only);
        a.destructive_hint = Some(destructive);
        a.idempotent_hint = Some(idempotent);
        a.open_world_hint = Some(false);
        a
    };
    vec![
        Tool::new(
            "remember",
            "Store one memory for an agent. Give `agent_id` and `content`; the tier is inferred when `tier` is \
             absent: `working` (this session's scratch, needs `session_id`, expires), `episodic` (something that \
             happened), `semantic` (a durable fact; with `subject`/`predicate`/`object` a newer fact supersedes \
             the older one), `procedural` (a skill, with `skill_name`). Set `user_id` when the memory is about a \
             user. An identical fact is not stored twice (`deduplicated: true`). Returns the stored memory's id, \
             tier and importance.",
            schema("CreateMemoryRequest"),
        )
        .with_annotations(annotate(false, false, false)),
        Tool::new(
            "recall",
            "Search an agent's memories with a natural-language `query`. Returns the best `top_k` (default 20) \
             memories, best first, each with its `score` and the score's parts (relevance, recency, importance, \
             frequency, tier bonus). Give `user_id` to see that user's memories plus the agent's general ones, \
             `session_id` to include the session's working memory, `tiers` or `filter` (time range, metadata, \
             `as_of` for what was known at a past moment) to narrow.",
            schema("SearchRequest"),
        )
        .with_annotations(annotate(true, false, true)),
        Tool::new(
            "context",
            "Build a block of an agent's memories relevant to `query` that fits in `max_tokens` tokens, ready \
             to put in a prompt: one line per memory, `[tier] text`, the session's working memory first. The \
             text content is the block; the structured result also says what went in per tier and the tokens \
             used.",
            context,
        )
        .with_annotations(annotate(true, false, true)),
        Tool::new(
            "forget",
            "Forget: with `memory_id`, delete that memory; with `user_id` (and optionally `agent_id`), erase \
             everything stored about that user from every tier, store and derived record (needs an admin key; \
             returns the erasure's receipt).",
            forget,
        )
        .with_annotations(annotate(false, true, true)),
    ]
}

/// Replaces `$ref`s to the document's schemas with the schemas themselves.
fn inline_refs(value: Value, schemas: &Value, depth: usize) -> Value {
    const MAX_DEPTH: usize = 16;
    match value {
        Value::Object(mut o) => {
            if depth < MAX_DEPTH
                && let Some(name) =
                    o.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/components/schemas/"))
                && let Some(target) = schemas.get(name)
            {
                let mut inlined = match inline_refs(target.clone(), schemas, depth + 1) {
                    Value::Object(t) => t,
                    other => return other,
                };
                o.remove("$ref");
                // The referring site's own keywords (a description) win.
                for (k, v) in o {
                    inlined.insert(k, inline_refs(v, schemas, depth + 1));
                }
                return Value::Object(inlined);
            }
            Value::Object(o.into_iter().map(|(k, v)| (k, inline_refs(v, schemas, depth + 1))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(|v| inline_refs(v, schemas, depth + 1)).collect()),
        other => other,
    }
}

/// The `/mcp` endpoint: Streamable HTTP without sessions, so any replica
/// answers any request (clients that open a GET stream are told 405, as
/// the transport allows). `rest` is the REST router the tools call.
pub fn http_service(rest: Router, body_limit: usize) -> StreamableHttpService<EngramMcp, NeverSessionManager> {
    let server = EngramMcp::with_key(Arc::new(Upstream::Local(rest)), None);
    // The Host and Origin checks are the REST API's (keyless mode only):
    // with API keys, a key is what lets a request in, whatever its host.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts()
        .with_max_request_body_bytes(body_limit);
    StreamableHttpService::new(move || Ok(server.clone()), Arc::new(NeverSessionManager::default()), config)
}

/// Serves `server` over standard input and output until the client closes
/// them or `shutdown` is cancelled.
pub async fn serve_stdio(server: EngramMcp, shutdown: tokio_util::sync::CancellationToken) -> anyhow::Result<()> {
    use rmcp::ServiceExt as _;
    let running =
        server.serve(rmcp::transport::stdio()).await.map_err(|e| anyhow::anyhow!("starting MCP on stdio: {e}"))?;
    let stop = running.cancellation_token();
    tokio::select! {
        ended = running.waiting() => {
            ended.map_err(|e| anyhow::anyhow!("MCP on stdio: {e}"))?;
        }
        _ = shutdown.cancelled() => stop.cancel(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_schemas_are_self_contained_objects() {
        for tool in tools() {
            let text = serde_json::to_string(&*tool.input_schema).unwrap();
            assert!(!text.contains("$ref"), "{}: {text}", tool.name);
            assert_eq!(tool.input_schema.get("type"), Some(&json!("object")), "{}", tool.name);
        }
    }

    #[test]
    fn the_context_tool_takes_max_tokens_instead_of_the_window() {
        let context = tools().into_iter().find(|t| t.name == "context").unwrap();
        let properties = context.input_schema["properties"].as_object().unwrap();
        assert!(properties.contains_key("max_tokens"));
        for field in CONTEXT_BUDGET_FIELDS {
            assert!(!properties.contains_key(field), "{field}");
        }
        assert_eq!(context.input_schema["required"], json!(["agent_id", "query", "max_tokens"]));
    }

    #[test]
    fn a_rest_error_becomes_a_tool_error_naming_the_tools_field() {
        let body = json!({"error": {"code": "invalid_field", "message": "must be at least 1",
                                    "field": "/max_context_tokens", "request_id": "r1"}});
        let result = failure(body, &[("/max_context_tokens", "/max_tokens")]);
        assert_eq!(result.is_error, Some(true));
        assert_eq!(result.structured_content.unwrap()["error"]["field"], "/max_tokens");
        let text = serde_json::to_value(&result.content[0]).unwrap();
        assert_eq!(text["text"], "invalid_field: must be at least 1 (field /max_tokens)");
    }
}
