//! One typed configuration tree, layered: built-in defaults, then an optional
//! TOML file (`--config` / `ENGRAM_CONFIG`), then `ENGRAM_*` environment
//! variables (`__` separates levels: `ENGRAM_REDIS__KEY_PREFIX`), then the
//! conventional `DATABASE_URL`, `DATABASE_READ_URL`, `REDIS_URL`, `ENGRAM_LISTEN` and `ENGRAM_MODEL_DIR`.
//!
//! `config/default.toml` documents every key and equals the built-in defaults
//! (a test keeps them in step). Loading fails fast with a message naming the
//! key; secrets never reach logs or `engram config`.

use std::net::SocketAddr;
use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::Tier;
use crate::domain::retention::{DecayRule, Period, RetentionPolicy};

const REDACTED: &str = "<redacted>";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    /// The embedded backend, used when `database.url` is empty.
    pub embedded: EmbeddedConfig,
    pub database: DatabaseConfig,
    pub redis: RedisConfig,
    pub auth: AuthConfig,
    pub embedding: EmbeddingConfig,
    pub idempotency: IdempotencyConfig,
    pub limits: LimitsConfig,
    pub facts: FactsConfig,
    pub search: SearchConfig,
    /// How long memories are kept, and the sweep that deletes them.
    pub retention: RetentionConfig,
    /// The erasure worker.
    pub erasure: ErasureConfig,
    pub sharing: SharingConfig,
    /// Background consolidation of episodes into summaries and facts.
    pub consolidation: ConsolidationConfig,
    /// A chat model for consolidation; none by default.
    pub llm: LlmConfig,
    /// Per-agent settings: `[agents.<agent_id>]`.
    pub agents: std::collections::BTreeMap<String, AgentConfig>,
    pub log: LogConfig,
    /// What loading decided that the log should say (written once logging is up).
    #[serde(skip)]
    pub notices: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// Directory of the embedded database (`ENGRAM_DATA_DIR`, `--data-dir`);
    /// relative to the working directory.
    pub data_dir: String,
    /// Connections to the database file: reads run concurrently, writes queue.
    pub max_connections: u32,
    /// How long a statement waits for another connection's lock.
    pub busy_timeout_ms: u64,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self { data_dir: "data".into(), max_connections: 4, busy_timeout_ms: 5_000 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// HNSW candidate list size per index scan (pgvector `hnsw.ef_search`).
    pub ef_search: u32,
    /// Bound on tuples an iterative HNSW scan visits (pgvector `hnsw.max_scan_tuples`).
    pub max_scan_tuples: u32,
    /// On Postgres, an agent with fewer vectors than this in a tier has them
    /// all compared with the query there instead of an HNSW walk, unless it
    /// holds most of its partition (0: always the walk).
    pub exact_scan_below: u32,
    /// Two recalled memories at least this similar (cosine) are one; the better scored stays.
    pub dedup_cosine: f64,
    /// Share of relevance from the vector leg (cosine) when both legs ran; the rest from full text.
    pub vector_share: f64,
    /// Share of the better neighbouring episode's relevance above the median
    /// candidate's (the agent's episode written just before or after) added
    /// to an episode's relevance;
    /// 0 turns the neighbour lookup off.
    pub neighbour_share: f64,
    /// Relevance added to a memory whose speaker (`metadata.speaker`, or its
    /// transcript prefix "Name: ") the query names; 0 turns it off.
    pub speaker_share: f64,
    /// Relevance added to a memory that occurred within a date the query
    /// names (`domain::when`); 0 turns it off.
    pub date_share: f64,
    /// Spread the persistent tiers' relevance over the search's candidates:
    /// 1 for the best, 0 for the median and below (`recall::stretch`).
    pub relative_relevance: bool,
    /// Candidates the context builder considers before packing.
    pub context_candidates: usize,
    /// A memory's retrievals within this many seconds of its last counted one
    /// are not counted again (0 counts every retrieval).
    pub access_interval_secs: u64,
}

/// A year: longer would stop counting accesses altogether.
const MAX_ACCESS_INTERVAL_SECS: u64 = 365 * 24 * 3600;

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            ef_search: 40,
            max_scan_tuples: 20_000,
            exact_scan_below: 5_000,
            dedup_cosine: 0.95,
            vector_share: crate::domain::scoring::VECTOR_SHARE,
            neighbour_share: crate::domain::scoring::NEIGHBOUR_SHARE,
            speaker_share: crate::domain::scoring::SPEAKER_SHARE,
            date_share: crate::domain::scoring::DATE_SHARE,
            relative_relevance: true,
            context_candidates: 200,
            access_interval_secs: 3600,
        }
    }
}

/// `[retention]`: lifetimes per retention (counted from ingestion), the sweep
/// that deletes expired and decayed memories, and the decay rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    pub transient: Period,
    pub session: Period,
    pub short_term: Period,
    pub medium_term: Period,
    pub long_term: Period,
    /// Always `never`: a permanent memory neither expires nor decays.
    pub permanent: String,
    /// Seconds between sweeps; 0 turns the sweep off (reads still hide
    /// expired memories).
    pub sweep_interval_secs: u64,
    /// Rows deleted per transaction.
    pub sweep_batch: usize,
    pub decay: DecayConfig,
}

/// `[sharing]`: memories shared between agents (`POST /v1/share`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharingConfig {
    /// Most memories one share copies (ids given, or `top_k` of a query).
    pub max_memories: usize,
    /// What is redacted from every shared memory before it is copied.
    pub redaction: crate::domain::redact::RedactionRules,
    /// Per tenant: redaction rules that replace `redaction` for that tenant.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tenants: std::collections::BTreeMap<String, TenantSharingConfig>,
    /// Grants from the configuration, beside those made through the API.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<GrantConfig>,
    /// Teams from the configuration; a team named here and through the API
    /// has the members of both.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub teams: Vec<TeamConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSharingConfig {
    pub redaction: crate::domain::redact::RedactionRules,
}

/// `from_agent_id` of `tenant` may share with `to_agent_ids`, or with `team`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantConfig {
    pub tenant: String,
    pub from_agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_agent_ids: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamConfig {
    pub tenant: String,
    pub name: String,
    pub agent_ids: Vec<String>,
}

impl Default for SharingConfig {
    fn default() -> Self {
        Self {
            max_memories: 50,
            redaction: Default::default(),
            tenants: Default::default(),
            grants: Vec::new(),
            teams: Vec::new(),
        }
    }
}

/// `[consolidation]`: turning an agent's older episodes into summaries and
/// facts (`consolidation`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsolidationConfig {
    /// Seconds between scheduled passes over every agent with a backlog;
    /// 0 turns the schedule off (`POST /v1/consolidation` still runs).
    pub interval_secs: u64,
    /// Episodes are consolidated once they were ingested this long ago
    /// (never counted from `occurred_at`, which a client may set anywhere).
    pub min_age_secs: u64,
    /// Most episodes one summary covers (a group of one user's session).
    pub group_size: usize,
    /// Most sentences in a summary.
    pub summary_sentences: usize,
    /// Episodes read per batch; a run reads batches until every waiting
    /// episode up to its cutoff is taken.
    pub batch_size: usize,
    /// Episodes waiting past which the backlog is logged as a warning
    /// (`engram_consolidation_backlog_episodes` has the figure).
    pub backlog_alert_episodes: u64,
    /// What happens to the episodes a summary covers: `keep` (the default),
    /// `shorten` (each lives at most `sources_retention_secs` more) or
    /// `delete` (the summary and facts replace them).
    pub sources: String,
    /// Under `sources = "shorten"`: the most a covered episode lives after
    /// its consolidation.
    pub sources_retention_secs: u64,
    /// A new fact of a multi-valued predicate whose object is at least this
    /// alike (cosine, by the embedder) to a current fact's of the same
    /// subject and predicate is a near duplicate: the contradiction rule
    /// keeps one. Above 1 turns merging off.
    pub merge_cosine: f64,
}

impl ConsolidationConfig {
    /// `sources` as a policy (checked when the configuration loads).
    pub fn source_policy(&self) -> crate::domain::consolidate::SourcePolicy {
        crate::domain::consolidate::SourcePolicy::parse(&self.sources, self.sources_retention_secs)
            .unwrap_or(crate::domain::consolidate::SourcePolicy::Keep)
    }
}

impl Default for ConsolidationConfig {
    fn default() -> Self {
        Self {
            interval_secs: 0,
            min_age_secs: 3600,
            group_size: 20,
            summary_sentences: 5,
            batch_size: 500,
            backlog_alert_episodes: 10_000,
            sources: "keep".into(),
            sources_retention_secs: 7 * 86_400,
            merge_cosine: 0.85,
        }
    }
}

/// `[llm]`: an OpenAI-compatible chat model (`llm`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    /// `none` (the default: consolidation is rule-based) or `openai` (any
    /// OpenAI-compatible `/v1/chat/completions`).
    pub provider: String,
    /// Base URL up to and including `/v1`.
    pub base_url: String,
    pub model: String,
    /// Sent as a bearer token when not empty.
    pub api_key: String,
    pub timeout_ms: u64,
    /// Retries after a 429, a 5xx, a transport error or an unusable answer,
    /// with exponential backoff.
    pub max_retries: u32,
    /// Most requests in flight at once (this process).
    pub concurrency: usize,
    /// Most tokens of one answer.
    pub max_output_tokens: u32,
    /// Tokens a tenant may spend per UTC day (prompt and answer, as the
    /// server reports them), counted per process; 0 is no limit.
    pub daily_token_budget: u64,
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            provider: "none".into(),
            base_url: "http://127.0.0.1:8081/v1".into(),
            model: "default".into(),
            api_key: String::new(),
            timeout_ms: 60_000,
            max_retries: 3,
            concurrency: 2,
            max_output_tokens: 1024,
            daily_token_budget: 0,
        }
    }
}

impl std::fmt::Debug for LlmConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmConfig")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &REDACTED)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_retries", &self.max_retries)
            .field("concurrency", &self.concurrency)
            .field("daily_token_budget", &self.daily_token_budget)
            .finish_non_exhaustive()
    }
}

/// `[erasure]`: the worker that deletes what an erasure request claimed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErasureConfig {
    /// Seconds between the worker's looks for unfinished erasures (a new
    /// request wakes it at once; this bounds retries after a failure and the
    /// pick-up of requests accepted by another replica).
    pub poll_interval_secs: u64,
    /// Rows deleted per transaction.
    pub batch: usize,
}

impl Default for ErasureConfig {
    fn default() -> Self {
        Self { poll_interval_secs: 10, batch: 500 }
    }
}

/// `[retention.decay]`: forgetting memories whose retention score decayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecayConfig {
    /// Which tiers decay.
    pub episodic: bool,
    pub semantic: bool,
    pub procedural: bool,
    /// Recency halves every this many days.
    pub half_life_days: f64,
    /// A memory whose score is below this is deleted.
    pub threshold: f64,
    /// Nothing ingested less than this long ago decays.
    pub min_age: Period,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        let p = RetentionPolicy::default();
        Self {
            transient: p.transient,
            session: p.session,
            short_term: p.short_term,
            medium_term: p.medium_term,
            long_term: p.long_term,
            permanent: "never".into(),
            sweep_interval_secs: 3600,
            sweep_batch: 1000,
            decay: DecayConfig::default(),
        }
    }
}

impl Default for DecayConfig {
    fn default() -> Self {
        let rule = DecayRule::default();
        Self {
            episodic: rule.applies_to(Tier::Episodic),
            semantic: rule.applies_to(Tier::Semantic),
            procedural: rule.applies_to(Tier::Procedural),
            half_life_days: rule.half_life_days,
            threshold: rule.threshold,
            min_age: rule.min_age,
        }
    }
}

impl RetentionConfig {
    /// The lifetimes as the domain rule.
    pub fn policy(&self) -> RetentionPolicy {
        RetentionPolicy {
            transient: self.transient,
            session: self.session,
            short_term: self.short_term,
            medium_term: self.medium_term,
            long_term: self.long_term,
        }
    }

    /// The decay rule as the domain sees it.
    pub fn decay_rule(&self) -> DecayRule {
        let d = &self.decay;
        let tiers = [(Tier::Episodic, d.episodic), (Tier::Semantic, d.semantic), (Tier::Procedural, d.procedural)];
        DecayRule {
            tiers: tiers.into_iter().filter(|(_, on)| *on).map(|(t, _)| t).collect(),
            half_life_days: d.half_life_days,
            threshold: d.threshold,
            min_age: d.min_age,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Scoring weights for this agent's searches (a request's `weights` still wins).
    pub weights: Option<crate::domain::scoring::Weights>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: String,
    /// Largest request body accepted, in bytes.
    pub body_limit_bytes: usize,
    /// A request still running after this long is answered 503.
    pub request_timeout_ms: u64,
    /// The same for `POST /v1/memories`, whose embedding can take longer.
    pub write_timeout_ms: u64,
    /// How long shutdown waits for requests in flight.
    pub shutdown_grace_ms: u64,
    /// A connection must deliver a request's complete headers within this
    /// long of opening, or of its previous response.
    pub header_read_timeout_ms: u64,
    /// A kept-alive connection idle this long after a response is closed; 0
    /// turns keep-alive off.
    pub keep_alive_timeout_ms: u64,
    /// Most connections open at once; at the limit a new connection closes
    /// the one idle the longest.
    pub max_connections: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// Postgres URL (`DATABASE_URL`). Empty: the embedded backend in `embedded.data_dir`.
    pub url: String,
    /// A streaming read replica of `url` (`DATABASE_READ_URL`), optional:
    /// searches, context, gets and lists are served there while it holds
    /// every deletion the primary has made for the tenant
    /// (`store::postgres::replica`); everything else stays on the primary.
    pub read_url: String,
    /// After a replica read fails, how long reads stay on the primary
    /// before the replica is tried again.
    pub read_retry_secs: u64,
    /// A replica read taking longer than this is given up and done on the
    /// primary (a replica that hangs rather than refusing).
    pub read_timeout_ms: u64,
    pub max_connections: u32,
    pub acquire_timeout_ms: u64,
    /// No longer used: episodic memory is one table since migration 0007.
    /// Still accepted so that older configuration files load; a value set
    /// here only earns a notice at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions_ahead_months: Option<u32>,
    /// Run pending migrations when the server starts.
    pub migrate_on_start: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// Redis URL (`REDIS_URL`); `redis-cluster://host:port,...` for a cluster.
    pub url: String,
    /// Every key engram writes starts with this prefix and a colon.
    pub key_prefix: String,
    /// Connections in the client pool.
    pub pool_size: usize,
    /// Per-command timeout.
    pub timeout_ms: u64,
    /// Most working-memory entries kept per session; the oldest are dropped.
    pub working_max_entries: usize,
    /// How long a procedural skill stays in the cache.
    pub procedural_cache_ttl_secs: u64,
    /// `Retry-After` sent with 503 when Redis is unreachable.
    pub retry_after_secs: u64,
    /// Failed calls in a row that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker refuses calls before one probe goes through.
    pub breaker_cooldown_ms: u64,
    /// How often committed working-memory entries left in the outbox (by a
    /// crash or a Redis failure after the commit) are written, and skills
    /// changed or deleted since the last run evicted from the cache again;
    /// 0: never.
    pub outbox_interval_secs: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The tenant of every request when no API keys are configured.
    pub default_tenant: String,
    /// API keys: each maps the SHA-256 of a bearer token to a tenant, with a
    /// public id (for logs) and a scope.
    pub keys: Vec<ApiKeyConfig>,
    /// With keys, serve `/metrics` to requests without an admin key (for a
    /// scraper that sends none). Without keys it is open anyway.
    pub open_metrics: bool,
    /// Without keys: host names, besides `localhost`, `127.0.0.1` and
    /// `[::1]`, that requests may name in `Host` and `Origin`.
    pub allowed_hosts: Vec<String>,
    /// Serve without keys on an address other than loopback.
    pub allow_keyless_on_network: bool,
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The key's public name, written to the log with each request it
    /// authenticates (the key never is): 1-32 visible ASCII characters,
    /// unique among the keys.
    pub id: String,
    pub tenant: String,
    /// Hex SHA-256 of the key (`printf %s KEY | sha256sum`).
    pub key_sha256: String,
    /// What the key may do; `read_write` when not given.
    #[serde(default)]
    pub scope: Scope,
    /// The agents the key acts for; empty (the default) is every agent of
    /// its tenant. A bound key reads, writes, searches and shares only as
    /// these agents: a sharing grant between two agents then means that
    /// the holder of one agent's key cannot read the other's memories. An
    /// `admin` key acts for the whole tenant and cannot be bound.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
}

impl ApiKeyConfig {
    /// A key given in clear (`ENGRAM_API_KEYS`): stored as its SHA-256, with
    /// the first 8 hex digits of that digest as its id.
    pub fn from_plain(tenant: &str, key: &str, scope: Scope) -> ApiKeyConfig {
        let key_sha256 = hex::encode(Sha256::digest(key.as_bytes()));
        ApiKeyConfig {
            id: key_sha256[..8].to_string(),
            tenant: tenant.to_string(),
            key_sha256,
            scope,
            agents: Vec::new(),
        }
    }
}

impl std::fmt::Debug for ApiKeyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyConfig")
            .field("id", &self.id)
            .field("tenant", &self.tenant)
            .field("key_sha256", &REDACTED)
            .field("scope", &self.scope)
            .field("agents", &self.agents)
            .finish()
    }
}

/// What an API key may do. Each scope includes the ones before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Read, list, search, build context and follow history; nothing changes.
    Read,
    /// Also write, update and delete memories.
    #[default]
    ReadWrite,
    /// Also the operator's routes: the retention preview, `/metrics`, the
    /// details of `/readyz`.
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::ReadWrite => "read_write",
            Scope::Admin => "admin",
        }
    }

    /// The scope a name in `ENGRAM_API_KEYS` stands for.
    pub fn from_name(name: &str) -> Option<Scope> {
        [Scope::Read, Scope::ReadWrite, Scope::Admin].into_iter().find(|s| s.as_str() == name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmbeddingProvider {
    /// No vectors: memories are stored and found by their text only.
    None,
    /// A deterministic hashed bag-of-words stand-in: lexical, not semantic.
    LexicalHash,
    /// Any OpenAI-compatible `/v1/embeddings` endpoint.
    Openai,
    /// The bundled all-MiniLM-L6-v2 model, run in-process (`scripts/fetch-model.sh` fetches it).
    Local,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddingConfig {
    pub provider: EmbeddingProvider,
    /// Vector size of the lexical-hash provider.
    pub lexical_dimensions: usize,
    /// Memories re-embedded per batch after a model change.
    pub reembed_batch: usize,
    /// Pause between re-embedding batches (rate limit).
    pub reembed_pause_ms: u64,
    pub openai: OpenAiConfig,
    pub local: LocalConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// Directory with the model files (`ENGRAM_MODEL_DIR`); relative to the
    /// working directory. Empty: `models/all-MiniLM-L6-v2` in the data directory.
    pub model_dir: String,
    /// What runs the model: ONNX Runtime on int8 weights, or candle on the
    /// original f32 weights. Two runtimes are two vector spaces (model ids).
    pub runtime: LocalRuntime,
    /// Threads of each of the two model workers (queries, writes).
    pub threads: usize,
    /// `onnx-int8` only: the query worker does the weight products in int8
    /// (activations quantized at each call), 1.7-2.2 times as fast; stored
    /// memories are always embedded with the export's f32 products.
    pub int8_queries: bool,
    /// How long the first request of a batch waits for others to join it.
    pub batch_window_ms: u64,
    /// Most texts gathered into one batch, and most sequences in one forward pass.
    pub max_batch: usize,
    /// Most padded tokens of one tenant's write work embedded before the
    /// next tenant's turn.
    pub write_step_tokens: usize,
    /// Most bytes of write text waiting to be embedded; past it writes get
    /// 503 with Retry-After (a write is always admitted into an empty queue).
    pub max_queued_write_bytes: usize,
    /// Most queries waiting to be embedded; past it searches get 503.
    pub max_queued_queries: usize,
}

/// The runtime of the bundled model (`embedding.local.runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalRuntime {
    /// all-MiniLM-L6-v2 with int8 weights on ONNX Runtime (loaded from the
    /// model directory): model id `all-MiniLM-L6-v2-int8`, about twice as
    /// fast as candle for one query.
    OnnxInt8,
    /// all-MiniLM-L6-v2 with its f32 weights on candle, pure Rust: model id
    /// `all-MiniLM-L6-v2`. For platforms the fetched ONNX Runtime does not run on.
    Candle,
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OpenAiConfig {
    /// Base URL up to and including `/v1`.
    pub base_url: String,
    pub model: String,
    /// Sent as a bearer token when not empty.
    pub api_key: String,
    /// Vector size the model returns (checked on every response).
    pub dimensions: usize,
    /// Ask the server to shorten vectors to `dimensions` (models that support it).
    pub send_dimensions: bool,
    /// Most texts per request.
    pub batch_size: usize,
    pub timeout_ms: u64,
    /// Retries after a 429, a 5xx or a transport error, with exponential backoff.
    pub max_retries: u32,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &REDACTED)
            .field("dimensions", &self.dimensions)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// How long an `Idempotency-Key` is remembered.
    pub ttl_hours: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Requests per second each API key may send on average; 0: no rate limit.
    pub requests_per_second: u32,
    /// Requests a key may send at once above its rate (the bucket's size).
    pub burst: u32,
    /// Requests of one key in flight at once; 0: no limit.
    pub concurrent_requests: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self { requests_per_second: 1_000, burst: 2_000, concurrent_requests: 64 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FactsConfig {
    /// Predicates that hold several values at once: for these the object is
    /// part of a fact's slot, so "likes tea" and "likes jazz" never contradict.
    pub multi_valued_predicates: Vec<String>,
}

impl Default for FactsConfig {
    fn default() -> Self {
        Self {
            multi_valued_predicates: [
                "likes",
                "dislikes",
                "loves",
                "enjoys",
                "has",
                "owns",
                "has_pet",
                "has_child",
                "knows",
                "speaks",
                "uses",
                "plays",
                "visited",
                "member_of",
                "friend_of",
                "interested_in",
                "allergic_to",
                "works_with",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: String,
    /// A tracing filter; `RUST_LOG` wins when set.
    pub filter: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            body_limit_bytes: 2 * 1024 * 1024,
            request_timeout_ms: 30_000,
            write_timeout_ms: 180_000,
            shutdown_grace_ms: 10_000,
            header_read_timeout_ms: 30_000,
            keep_alive_timeout_ms: 15_000,
            max_connections: 512,
        }
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            read_url: String::new(),
            read_retry_secs: 5,
            read_timeout_ms: 2_000,
            max_connections: 20,
            acquire_timeout_ms: 5_000,
            partitions_ahead_months: None,
            migrate_on_start: true,
        }
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            key_prefix: "engram".into(),
            pool_size: 4,
            timeout_ms: 1_000,
            working_max_entries: 500,
            procedural_cache_ttl_secs: 300,
            retry_after_secs: 5,
            breaker_failures: 1,
            breaker_cooldown_ms: 2_000,
            outbox_interval_secs: 10,
        }
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            default_tenant: "default".into(),
            keys: Vec::new(),
            open_metrics: false,
            allowed_hosts: Vec::new(),
            allow_keyless_on_network: false,
        }
    }
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        Self {
            reembed_batch: 64,
            reembed_pause_ms: 100,
            provider: EmbeddingProvider::Local,
            lexical_dimensions: 384,
            openai: OpenAiConfig::default(),
            local: LocalConfig::default(),
        }
    }
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            model_dir: String::new(),
            runtime: LocalRuntime::OnnxInt8,
            threads: 1,
            int8_queries: true,
            batch_window_ms: 2,
            max_batch: 32,
            write_step_tokens: 256,
            max_queued_write_bytes: 8 << 20,
            max_queued_queries: 1024,
        }
    }
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".into(),
            model: "text-embedding-3-small".into(),
            api_key: String::new(),
            dimensions: 1536,
            send_dimensions: false,
            batch_size: 64,
            timeout_ms: 10_000,
            max_retries: 3,
        }
    }
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        Self { ttl_hours: 24 }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: "text".into(), filter: "info".into() }
    }
}

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(String);

const SECTIONS: &[&str] = &[
    "server",
    "embedded",
    "database",
    "redis",
    "auth",
    "embedding",
    "idempotency",
    "limits",
    "facts",
    "search",
    "retention",
    "erasure",
    "sharing",
    "consolidation",
    "llm",
    "agents",
    "log",
];

/// The bundled model's directory under the data directory, when
/// `embedding.local.model_dir` is not set.
pub const MODEL_SUBDIR: &str = "models/all-MiniLM-L6-v2";

impl Config {
    /// Loads defaults < `file` < `ENGRAM_*` < `DATABASE_URL`/`REDIS_URL`/`ENGRAM_LISTEN`/`ENGRAM_MODEL_DIR`,
    /// plus API keys from `ENGRAM_API_KEYS` (`tenant:key,tenant:key`).
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_with(file, None)
    }

    /// `load`, with `--data-dir` (which wins over everything else).
    pub fn load_with(file: Option<&Path>, data_dir: Option<&str>) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!("config file {} does not exist", path.display())));
            }
            figment = figment.merge(Toml::file(path));
        }
        // Only keys that name a section are configuration; other ENGRAM_*
        // variables (ENGRAM_CONFIG, ENGRAM_API_KEYS, test settings) are not.
        let sectioned = Env::prefixed("ENGRAM_")
            .filter(|k| {
                let k = k.as_str().to_ascii_lowercase();
                SECTIONS.iter().any(|s| k.starts_with(&format!("{s}__")))
            })
            .split("__");
        figment = figment
            .merge(sectioned)
            .merge(Env::raw().only(&["DATABASE_URL"]).map(|_| "database.url".into()))
            .merge(Env::raw().only(&["DATABASE_READ_URL"]).map(|_| "database.read_url".into()))
            .merge(Env::raw().only(&["REDIS_URL"]).map(|_| "redis.url".into()))
            .merge(Env::raw().only(&["ENGRAM_LISTEN"]).map(|_| "server.listen".into()))
            .merge(Env::raw().only(&["ENGRAM_MODEL_DIR"]).map(|_| "embedding.local.model_dir".into()))
            .merge(Env::raw().only(&["ENGRAM_DATA_DIR"]).map(|_| "embedded.data_dir".into()));
        let mut config: Config = figment.extract().map_err(|e| ConfigError(e.to_string()))?;
        if let Some(dir) = data_dir {
            if config.embedded.data_dir != dir && config.embedded.data_dir != EmbeddedConfig::default().data_dir {
                config.notices.push(format!(
                    "--data-dir {dir} overrides the configured data directory {}",
                    config.embedded.data_dir
                ));
            }
            config.embedded.data_dir = dir.to_string();
        }
        if config.database.partitions_ahead_months.is_some() {
            config.notices.push(
                "database.partitions_ahead_months is ignored: episodic memory is no longer partitioned by month".into(),
            );
        }
        if config.embedding.local.model_dir.is_empty() {
            config.embedding.local.model_dir =
                Path::new(&config.embedded.data_dir).join(MODEL_SUBDIR).to_string_lossy().into_owned();
        }
        if let Ok(keys) = std::env::var("ENGRAM_API_KEYS") {
            config.auth.keys.extend(parse_api_keys(&keys)?);
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks what types alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, why: &str| Err(ConfigError(format!("`{key}` {why}")));
        if !(1..=1000).contains(&self.sharing.max_memories) {
            return bad("sharing.max_memories", "must be between 1 and 1000");
        }
        if let Err(e) = crate::domain::redact::Redactor::new(&self.sharing.redaction) {
            return bad("sharing.redaction", &e);
        }
        for (tenant, t) in &self.sharing.tenants {
            if let Err(e) = crate::domain::redact::Redactor::new(&t.redaction) {
                return bad(&format!("sharing.tenants.{tenant}.redaction"), &e);
            }
        }
        for (i, g) in self.sharing.grants.iter().enumerate() {
            if g.to_agent_ids.is_some() == g.team.is_some() {
                return bad(&format!("sharing.grants[{i}]"), "must name either to_agent_ids or team");
            }
        }
        if self.server.listen.parse::<SocketAddr>().is_err() {
            return bad("server.listen", "must be an address like 127.0.0.1:8080");
        }
        if self.embedded.data_dir.is_empty() {
            return bad("embedded.data_dir", "must not be empty");
        }
        if self.embedded.max_connections == 0 {
            return bad("embedded.max_connections", "must be greater than 0");
        }
        if self.server.body_limit_bytes == 0 {
            return bad("server.body_limit_bytes", "must be greater than 0");
        }
        if self.server.request_timeout_ms == 0 {
            return bad("server.request_timeout_ms", "must be greater than 0");
        }
        if self.server.write_timeout_ms == 0 {
            return bad("server.write_timeout_ms", "must be greater than 0");
        }
        if self.limits.requests_per_second > 0 && self.limits.burst < self.limits.requests_per_second {
            return bad("limits.burst", "must be at least limits.requests_per_second");
        }
        if self.server.header_read_timeout_ms == 0 || self.server.header_read_timeout_ms > 300_000 {
            return bad("server.header_read_timeout_ms", "must be between 1 and 300000 (5 minutes)");
        }
        if self.server.keep_alive_timeout_ms > self.server.header_read_timeout_ms {
            return bad(
                "server.keep_alive_timeout_ms",
                "must be at most server.header_read_timeout_ms, which also bounds the wait between requests",
            );
        }
        if self.server.max_connections == 0 {
            return bad("server.max_connections", "must be greater than 0");
        }
        if self.database.max_connections == 0 {
            return bad("database.max_connections", "must be greater than 0");
        }
        if !self.database.read_url.is_empty() && self.database.url.is_empty() {
            return bad("database.read_url", "needs database.url: a read replica is of a Postgres primary");
        }
        if self.database.read_url == self.database.url && !self.database.url.is_empty() {
            return bad("database.read_url", "must name the replica, not the primary (leave it empty for none)");
        }
        if self.database.read_retry_secs == 0 || self.database.read_retry_secs > 3600 {
            return bad("database.read_retry_secs", "must be between 1 and 3600");
        }
        if !(10..=60_000).contains(&self.database.read_timeout_ms) {
            return bad("database.read_timeout_ms", "must be between 10 and 60000");
        }
        if self.redis.key_prefix.is_empty() || self.redis.key_prefix.contains(char::is_whitespace) {
            return bad("redis.key_prefix", "must be a non-empty word");
        }
        // A brace would make a Redis Cluster hash tag of the prefix, putting
        // every key on one slot.
        if self.redis.key_prefix.contains(['{', '}']) {
            return bad("redis.key_prefix", "must not contain braces");
        }
        if self.redis.pool_size == 0 {
            return bad("redis.pool_size", "must be greater than 0");
        }
        if !(1..=100).contains(&self.redis.breaker_failures) {
            return bad("redis.breaker_failures", "must be between 1 and 100");
        }
        if !(10..=600_000).contains(&self.redis.breaker_cooldown_ms) {
            return bad("redis.breaker_cooldown_ms", "must be between 10 and 600000");
        }
        if self.redis.outbox_interval_secs > 86_400 {
            return bad("redis.outbox_interval_secs", "must be at most 86400 (0 turns the outbox job off)");
        }
        if self.redis.working_max_entries == 0 {
            return bad("redis.working_max_entries", "must be greater than 0");
        }
        let c = &self.consolidation;
        if c.interval_secs > 31_536_000 {
            return bad("consolidation.interval_secs", "must be at most 31536000 (a year; 0 turns it off)");
        }
        if c.min_age_secs > 31_536_000 {
            return bad("consolidation.min_age_secs", "must be at most 31536000 (a year)");
        }
        if !(1..=200).contains(&c.group_size) {
            return bad("consolidation.group_size", "must be from 1 to 200");
        }
        if !(1..=50).contains(&c.summary_sentences) {
            return bad("consolidation.summary_sentences", "must be from 1 to 50");
        }
        if !(1..=100_000).contains(&c.batch_size) {
            return bad("consolidation.batch_size", "must be from 1 to 100000");
        }
        if !["none", "openai"].contains(&self.llm.provider.as_str()) {
            return bad("llm.provider", "must be none or openai");
        }
        if self.llm.provider == "openai" && !self.llm.base_url.starts_with("http") {
            return bad("llm.base_url", "must be an http(s) URL up to and including /v1");
        }
        if self.llm.concurrency == 0 || self.llm.concurrency > 64 {
            return bad("llm.concurrency", "must be from 1 to 64");
        }
        if self.llm.timeout_ms == 0 || self.llm.max_output_tokens == 0 {
            return bad("llm.timeout_ms", "timeout_ms and max_output_tokens must be greater than 0");
        }
        if crate::domain::consolidate::SourcePolicy::parse(&c.sources, c.sources_retention_secs).is_none() {
            return bad("consolidation.sources", "must be \"keep\", \"shorten\" or \"delete\"");
        }
        if c.sources == "shorten" && c.sources_retention_secs == 0 {
            return bad("consolidation.sources_retention_secs", "must be greater than 0 under sources = \"shorten\"");
        }
        if !c.merge_cosine.is_finite() || c.merge_cosine < 0.0 {
            return bad("consolidation.merge_cosine", "must be a number from 0 (above 1 turns merging off)");
        }
        if crate::domain::validate::identifier("", &self.auth.default_tenant).is_err() {
            return bad("auth.default_tenant", "must be a 1-64 character identifier");
        }
        for (i, key) in self.auth.keys.iter().enumerate() {
            if crate::domain::validate::identifier("", &key.tenant).is_err() {
                return bad(&format!("auth.keys[{i}].tenant"), "must be a 1-64 character identifier");
            }
            if key.key_sha256.len() != 64 || !key.key_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad(&format!("auth.keys[{i}].key_sha256"), "must be 64 hex digits");
            }
            if key.id.is_empty() || key.id.len() > 32 || !key.id.bytes().all(|b| b.is_ascii_graphic()) {
                return bad(&format!("auth.keys[{i}].id"), "must be 1-32 visible ASCII characters (no spaces)");
            }
            if let Some(j) = self.auth.keys[..i].iter().position(|k| k.key_sha256.eq_ignore_ascii_case(&key.key_sha256))
            {
                return bad(&format!("auth.keys[{i}].key_sha256"), &format!("is also the key of auth.keys[{j}]"));
            }
            // Keys from ENGRAM_API_KEYS follow the file's, their ids derived from their hashes.
            if let Some(j) = self.auth.keys[..i].iter().position(|k| k.id == key.id) {
                return bad(&format!("auth.keys[{i}].id"), &format!("`{}` is also the id of auth.keys[{j}]", key.id));
            }
            if !key.agents.is_empty() && key.scope == Scope::Admin {
                return bad(
                    &format!("auth.keys[{i}].agents"),
                    "cannot be set on an admin key: it acts for the whole tenant (grants, erasure, holds)",
                );
            }
            for (a, agent) in key.agents.iter().enumerate() {
                if crate::domain::validate::identifier("", agent).is_err() {
                    return bad(&format!("auth.keys[{i}].agents[{a}]"), "must be a 1-64 character identifier");
                }
            }
        }
        for (i, host) in self.auth.allowed_hosts.iter().enumerate() {
            if !is_host_name(host) {
                return bad(
                    &format!("auth.allowed_hosts[{i}]"),
                    "must be a host name or IP address without scheme or port (an IPv6 address in brackets)",
                );
            }
        }
        if self.embedding.reembed_batch > 10_000 {
            return bad("embedding.reembed_batch", "must be at most 10000");
        }
        if self.embedding.lexical_dimensions < 16 {
            return bad("embedding.lexical_dimensions", "must be at least 16");
        }
        let oa = &self.embedding.openai;
        if self.embedding.provider == EmbeddingProvider::Openai {
            if !(oa.base_url.starts_with("http://") || oa.base_url.starts_with("https://")) {
                return bad("embedding.openai.base_url", "must be an http(s) URL");
            }
            if oa.model.is_empty() {
                return bad("embedding.openai.model", "must not be empty");
            }
        }
        if oa.dimensions == 0 || oa.dimensions > 16_000 {
            return bad("embedding.openai.dimensions", "must be between 1 and 16000");
        }
        if oa.batch_size == 0 {
            return bad("embedding.openai.batch_size", "must be greater than 0");
        }
        let local = &self.embedding.local;
        if local.threads == 0 || local.threads > 256 {
            return bad("embedding.local.threads", "must be between 1 and 256");
        }
        if local.batch_window_ms > 1000 {
            return bad("embedding.local.batch_window_ms", "must be at most 1000");
        }
        if local.max_batch == 0 || local.max_batch > 1024 {
            return bad("embedding.local.max_batch", "must be between 1 and 1024");
        }
        if local.write_step_tokens < 16 || local.write_step_tokens > 8192 {
            return bad("embedding.local.write_step_tokens", "must be between 16 and 8192");
        }
        if local.max_queued_write_bytes < 1024 {
            return bad("embedding.local.max_queued_write_bytes", "must be at least 1024");
        }
        if local.max_queued_queries == 0 {
            return bad("embedding.local.max_queued_queries", "must be greater than 0");
        }
        if self.search.ef_search == 0 || self.search.ef_search > 1000 {
            return bad("search.ef_search", "must be between 1 and 1000");
        }
        if self.search.exact_scan_below > 1_000_000 {
            return bad("search.exact_scan_below", "must be at most 1000000");
        }
        if !(0.0..=1.0).contains(&self.search.dedup_cosine) {
            return bad("search.dedup_cosine", "must be between 0 and 1");
        }
        if !(0.0..=1.0).contains(&self.search.vector_share) {
            return bad("search.vector_share", "must be between 0 and 1");
        }
        if !(0.0..=1.0).contains(&self.search.neighbour_share) {
            return bad("search.neighbour_share", "must be between 0 and 1");
        }
        if !(0.0..=1.0).contains(&self.search.speaker_share) {
            return bad("search.speaker_share", "must be between 0 and 1");
        }
        if !(0.0..=1.0).contains(&self.search.date_share) {
            return bad("search.date_share", "must be between 0 and 1");
        }
        if self.search.context_candidates == 0 || self.search.context_candidates > 1000 {
            return bad("search.context_candidates", "must be between 1 and 1000");
        }
        if self.search.access_interval_secs > MAX_ACCESS_INTERVAL_SECS {
            return bad("search.access_interval_secs", "must be at most 31536000 (a year)");
        }
        for (agent, a) in &self.agents {
            if let Some(w) = &a.weights
                && w.check("").is_err()
            {
                return bad(&format!("agents.{agent}.weights"), "must each be between 0 and 10, not all 0");
            }
        }
        let r = &self.retention;
        if r.permanent != "never" {
            return bad("retention.permanent", "must be `never`: permanent memories cannot expire (use long_term)");
        }
        if r.sweep_batch == 0 || r.sweep_batch > 10_000 {
            return bad("retention.sweep_batch", "must be between 1 and 10000");
        }
        if self.erasure.batch == 0 || self.erasure.batch > 10_000 {
            return bad("erasure.batch", "must be between 1 and 10000");
        }
        if self.erasure.poll_interval_secs == 0 || self.erasure.poll_interval_secs > 86_400 {
            return bad("erasure.poll_interval_secs", "must be between 1 and 86400");
        }
        if !(r.decay.half_life_days > 0.0 && r.decay.half_life_days <= 36_500.0) {
            return bad("retention.decay.half_life_days", "must be more than 0 and at most 36500");
        }
        if !(0.0..=1.0).contains(&r.decay.threshold) {
            return bad("retention.decay.threshold", "must be between 0 and 1");
        }
        if self.idempotency.ttl_hours == 0 {
            return bad("idempotency.ttl_hours", "must be greater than 0");
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return bad("log.format", "must be `text` or `json`");
        }
        Ok(())
    }

    /// The configuration with passwords and keys masked, for display.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        c.database.url = redact_url(&c.database.url);
        c.database.read_url = redact_url(&c.database.read_url);
        c.redis.url = redact_url(&c.redis.url);
        if !c.embedding.openai.api_key.is_empty() {
            c.embedding.openai.api_key = REDACTED.into();
        }
        if !c.llm.api_key.is_empty() {
            c.llm.api_key = REDACTED.into();
        }
        for key in &mut c.auth.keys {
            key.key_sha256 = REDACTED.into();
        }
        c
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }
}

/// Parses `tenant:key,tenant:key:scope` into hashed keys. A key's scope is
/// `read_write` unless its entry ends in `:read`, `:read_write` or `:admin`;
/// its id is the first 8 hex digits of its SHA-256.
pub fn parse_api_keys(spec: &str) -> Result<Vec<ApiKeyConfig>, ConfigError> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let (tenant, rest) = entry.split_once(':').unwrap_or((entry, ""));
            let (key, scope) = rest
                .rsplit_once(':')
                .and_then(|(key, name)| Some((key, Scope::from_name(name)?)))
                .unwrap_or((rest, Scope::ReadWrite));
            if tenant.is_empty() || key.is_empty() {
                return Err(ConfigError(
                    "`ENGRAM_API_KEYS` must look like tenant:key,tenant:key (optionally tenant:key:scope, \
                     the scope read, read_write or admin)"
                        .into(),
                ));
            }
            Ok(ApiKeyConfig::from_plain(tenant, key, scope))
        })
        .collect()
}

/// A host name or an IP address as `Host` names it without its port: letters,
/// digits, dots and hyphens, or an IPv6 address in brackets.
fn is_host_name(host: &str) -> bool {
    let ipv6 = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    match ipv6 {
        Some(addr) => addr.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'),
    }
}

/// Masks the password of a URL such as `postgres://user:secret@host/db`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let Some((userinfo, host)) = rest.rsplit_once('@') else { return url.to_string() };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:{REDACTED}@{host}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_toml_equals_the_built_in_defaults() {
        let text = include_str!("../config/default.toml");
        let from_file: Config = Figment::from(Toml::string(text)).extract().expect("config/default.toml parses");
        assert_eq!(from_file, Config::default());
    }

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(redact_url("postgres://u:p@h:5432/db"), "postgres://u:<redacted>@h:5432/db");
        assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn api_keys_are_hashed_at_load() {
        let keys = parse_api_keys("acme:s3cret, beta:other").unwrap();
        assert_eq!(keys[0].tenant, "acme");
        // printf %s s3cret | sha256sum
        assert_eq!(keys[0].key_sha256, hex::encode(Sha256::digest(b"s3cret")));
        assert_eq!(keys[1].tenant, "beta");
        assert!(parse_api_keys("nocolon").is_err());
        assert!(parse_api_keys("acme:").is_err());
        assert!(parse_api_keys(":key").is_err());
    }

    #[test]
    fn environment_keys_get_an_id_from_their_hash_and_an_optional_scope() {
        let keys = parse_api_keys("acme:s3cret,acme:r:read,ops:k2:admin,acme:a:b:c,beta:x:read_write").unwrap();
        let digest = hex::encode(Sha256::digest(b"s3cret"));
        assert_eq!(keys[0].id, digest[..8]);
        assert_eq!(keys[0].scope, Scope::ReadWrite);
        assert_eq!(
            (keys[1].key_sha256.as_str(), keys[1].scope),
            (hex::encode(Sha256::digest(b"r")).as_str(), Scope::Read)
        );
        assert_eq!(keys[2].scope, Scope::Admin);
        // A last part that names no scope belongs to the key.
        assert_eq!(
            (keys[3].key_sha256.clone(), keys[3].scope),
            (hex::encode(Sha256::digest(b"a:b:c")), Scope::ReadWrite)
        );
        assert_eq!(keys[4].key_sha256, hex::encode(Sha256::digest(b"x")));
        assert!(parse_api_keys("acme::admin").is_err());
    }

    #[test]
    fn key_ids_are_short_visible_and_unique() {
        let key =
            |id: &str, k: &str| ApiKeyConfig { id: id.into(), ..ApiKeyConfig::from_plain("acme", k, Scope::Read) };
        let mut c = Config::default();
        c.auth.keys = vec![key("ci-reader", "k1"), key("ops", "k2")];
        assert!(c.validate().is_ok());
        for bad in ["", "has space", "é", &"x".repeat(33)] {
            c.auth.keys = vec![key("ok", "k1"), key(bad, "k2")];
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("auth.keys[1].id"), "{bad:?}: {err}");
        }
        c.auth.keys = vec![key("same", "k1"), key("same", "k2")];
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("auth.keys[1].id") && err.contains("auth.keys[0]"), "{err}");
        c.auth.keys = vec![key("a", "k1"), key("b", "k1")];
        assert!(c.validate().unwrap_err().to_string().contains("auth.keys[1].key_sha256"));
    }

    #[test]
    fn a_key_may_be_bound_to_agents_unless_it_is_an_admin_key() {
        let mut c = Config::default();
        let bound = |scope: Scope, agents: &[&str]| ApiKeyConfig {
            agents: agents.iter().map(|a| a.to_string()).collect(),
            ..ApiKeyConfig::from_plain("acme", "k1", scope)
        };
        c.auth.keys = vec![bound(Scope::ReadWrite, &["planner", "coder"])];
        assert!(c.validate().is_ok());
        c.auth.keys = vec![bound(Scope::Admin, &["planner"])];
        assert!(c.validate().unwrap_err().to_string().contains("auth.keys[0].agents"));
        c.auth.keys = vec![bound(Scope::Read, &["planner", ""])];
        assert!(c.validate().unwrap_err().to_string().contains("auth.keys[0].agents[1]"));
    }

    #[test]
    fn a_key_without_an_id_is_refused_and_its_scope_defaults_to_read_write() {
        let sha = "0".repeat(64);
        let parse = |toml: &str| {
            Figment::from(Serialized::defaults(Config::default()))
                .merge(Toml::string(toml))
                .extract::<Config>()
                .map_err(|e| e.to_string())
        };
        let err = parse(&format!("[[auth.keys]]\ntenant = \"acme\"\nkey_sha256 = \"{sha}\"")).unwrap_err();
        assert!(err.contains("id"), "{err}");
        let c = parse(&format!("[[auth.keys]]\nid = \"k\"\ntenant = \"acme\"\nkey_sha256 = \"{sha}\"")).unwrap();
        assert_eq!(c.auth.keys[0].scope, Scope::ReadWrite);
        let c =
            parse(&format!("[[auth.keys]]\nid = \"k\"\ntenant = \"acme\"\nkey_sha256 = \"{sha}\"\nscope = \"admin\""))
                .unwrap();
        assert_eq!(c.auth.keys[0].scope, Scope::Admin);
        assert!(
            parse(&format!("[[auth.keys]]\nid = \"k\"\ntenant = \"a\"\nkey_sha256 = \"{sha}\"\nscope = \"root\""))
                .is_err()
        );
        // The id stays visible when the configuration is shown; the hash does not.
        let shown = format!("{:?}", c.redacted().auth.keys[0]);
        assert!(shown.contains("\"k\"") && !shown.contains(&sha), "{shown}");
    }

    #[test]
    fn invalid_values_name_their_key() {
        let mut c = Config::default();
        c.server.listen = "nowhere".into();
        assert!(c.validate().unwrap_err().to_string().contains("server.listen"));
        let mut c = Config::default();
        c.log.format = "xml".into();
        assert!(c.validate().unwrap_err().to_string().contains("log.format"));
        let mut c = Config::default();
        c.redis.key_prefix = "app{1}".into();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("redis.key_prefix") && err.contains("braces"), "{err}");
    }

    #[test]
    fn allowed_hosts_are_bare_host_names() {
        let mut c = Config::default();
        c.auth.allowed_hosts = vec!["engram.internal".into(), "[fd00::1]".into(), "10.0.0.7".into()];
        assert!(c.validate().is_ok());
        for bad in ["http://engram.internal", "engram.internal:8080", "", "fd00::1", "a b"] {
            c.auth.allowed_hosts = vec!["ok.example".into(), bad.into()];
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("auth.allowed_hosts[1]"), "{bad}: {err}");
        }
    }

    #[test]
    fn connection_settings_are_validated_naming_the_key() {
        let mut c = Config::default();
        c.server.header_read_timeout_ms = 0;
        assert!(c.validate().unwrap_err().to_string().contains("server.header_read_timeout_ms"));
        let mut c = Config::default();
        c.server.keep_alive_timeout_ms = c.server.header_read_timeout_ms + 1;
        assert!(c.validate().unwrap_err().to_string().contains("server.keep_alive_timeout_ms"));
        let mut c = Config::default();
        c.server.max_connections = 0;
        assert!(c.validate().unwrap_err().to_string().contains("server.max_connections"));
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail decides the closure's error type
    fn environment_variables_override_the_defaults() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("ENGRAM_AUTH__DEFAULT_TENANT", "acme");
            jail.set_env("ENGRAM_REDIS__KEY_PREFIX", "app1");
            jail.set_env("ENGRAM_EMBEDDING__PROVIDER", "lexical-hash");
            jail.set_env("ENGRAM_TEST_SOMETHING_ELSE", "ignored");
            jail.set_env("DATABASE_URL", "postgres://u:p@h/db");
            jail.set_env("ENGRAM_LISTEN", "0.0.0.0:9000");
            jail.set_env("ENGRAM_API_KEYS", "acme:k1");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.auth.default_tenant, "acme");
            assert_eq!(c.redis.key_prefix, "app1");
            assert_eq!(c.embedding.provider, EmbeddingProvider::LexicalHash);
            assert_eq!(c.database.url, "postgres://u:p@h/db");
            assert_eq!(c.server.listen, "0.0.0.0:9000");
            assert_eq!(c.auth.keys.len(), 1);
            jail.set_env("ENGRAM_SERVER__BODY_LIMIT_BYTES", "lots");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("server.body_limit_bytes"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure returns figment::Error
    fn engram_model_dir_sets_the_local_model_directory() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("ENGRAM_EMBEDDING__PROVIDER", "local");
            jail.set_env("ENGRAM_EMBEDDING__LOCAL__THREADS", "2");
            jail.set_env("ENGRAM_EMBEDDING__LOCAL__MODEL_DIR", "/from/sectioned");
            jail.set_env("ENGRAM_MODEL_DIR", "/opt/models/minilm");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.embedding.provider, EmbeddingProvider::Local);
            assert_eq!(c.embedding.local.threads, 2);
            // Like ENGRAM_LISTEN, the short alias wins.
            assert_eq!(c.embedding.local.model_dir, "/opt/models/minilm");
            Ok(())
        });
    }

    #[test]
    fn local_embedding_settings_are_validated() {
        let mut c = Config::default();
        c.embedding.local.threads = 0;
        assert!(c.validate().unwrap_err().to_string().contains("embedding.local.threads"));
        let mut c = Config::default();
        c.embedding.local.max_batch = 0;
        assert!(c.validate().unwrap_err().to_string().contains("embedding.local.max_batch"));
        let mut c = Config::default();
        c.embedding.local.batch_window_ms = 5_000;
        assert!(c.validate().unwrap_err().to_string().contains("embedding.local.batch_window_ms"));
    }

    #[test]
    fn every_section_can_be_set_from_the_environment() {
        let defaults = serde_json::to_value(Config::default()).unwrap();
        let sections: Vec<&String> = defaults.as_object().unwrap().keys().collect();
        assert!(sections.len() > 10, "{sections:?}");
        for section in sections {
            assert!(SECTIONS.contains(&section.as_str()), "ENGRAM_{}__* is not read", section.to_uppercase());
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail decides the closure's error type
    fn a_file_from_before_episodic_was_one_table_still_loads_with_a_notice() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("old.toml", "[database]\npartitions_ahead_months = 3\n")?;
            let c = Config::load(Some(Path::new("old.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c.database.partitions_ahead_months, Some(3));
            assert_eq!(
                c.notices,
                ["database.partitions_ahead_months is ignored: episodic memory is no longer partitioned by month"]
            );
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail decides the closure's error type
    fn the_model_and_the_embedded_database_live_in_the_data_directory() {
        figment::Jail::expect_with(|jail| {
            // Not the environment the tests run in (scripts/test.sh sets ENGRAM_MODEL_DIR).
            jail.clear_env();
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!((c.embedded.data_dir.as_str(), c.database.url.as_str()), ("data", ""));
            assert_eq!(c.embedding.local.model_dir, "data/models/all-MiniLM-L6-v2");
            jail.set_env("ENGRAM_DATA_DIR", "/srv/engram");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.embedding.local.model_dir, "/srv/engram/models/all-MiniLM-L6-v2");
            assert!(c.notices.is_empty());
            // --data-dir wins, and says so.
            let c = Config::load_with(None, Some("/var/lib/engram")).map_err(|e| e.to_string())?;
            assert_eq!(c.embedded.data_dir, "/var/lib/engram");
            assert_eq!(c.embedding.local.model_dir, "/var/lib/engram/models/all-MiniLM-L6-v2");
            assert_eq!(c.notices, ["--data-dir /var/lib/engram overrides the configured data directory /srv/engram"]);
            // An explicit model directory stays.
            jail.set_env("ENGRAM_MODEL_DIR", "/opt/minilm");
            let c = Config::load_with(None, Some("/var/lib/engram")).map_err(|e| e.to_string())?;
            assert_eq!(c.embedding.local.model_dir, "/opt/minilm");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail decides the closure's error type
    fn retention_durations_are_validated_naming_the_key() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("ENGRAM_RETENTION__SHORT_TERM", "36h");
            jail.set_env("ENGRAM_RETENTION__DECAY__SEMANTIC", "true");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.retention.policy().short_term, Period::hours(36));
            assert_eq!(c.retention.decay_rule().tiers, [Tier::Episodic, Tier::Semantic]);
            jail.set_env("ENGRAM_RETENTION__SHORT_TERM", "a week");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("retention.short_term"), "{err}");
            jail.set_env("ENGRAM_RETENTION__SHORT_TERM", "7d");
            jail.set_env("ENGRAM_RETENTION__PERMANENT", "3650d");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("retention.permanent"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let err = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string("[server]\nlisten_addr = \"x\""))
            .extract::<Config>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("listen_addr"), "{err}");
    }
}
