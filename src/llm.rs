//! A chat model for background work (consolidation), behind a trait: an
//! OpenAI-compatible `/v1/chat/completions` client with JSON-schema
//! structured output, a timeout per request, retries with exponential
//! backoff (`backon`) on 429, 5xx, transport errors and answers that are not
//! the JSON asked for, a limit on requests in flight, token usage counted per
//! tenant, and a daily token budget per tenant.
//!
//! `llm.provider = "none"` (the default) builds no client: what would use
//! one falls back to its rule-based path.
//!
//! The budget is counted in this process from the usage each response
//! reports: with several replicas each has its own count, so a tenant may
//! spend up to the budget on each (stated in the README). A call is refused
//! once the day's count reached the budget; the call that crosses it is
//! allowed to finish.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use chrono::{NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::config::LlmConfig;

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The server could not be reached or kept failing (after the retries).
    #[error("the model is unavailable: {0}")]
    Unavailable(String),
    /// The answer was not what was asked for (after the retries).
    #[error("the model's answer was unusable: {0}")]
    BadAnswer(String),
    /// The tenant's tokens for today are spent.
    #[error("the tenant's daily token budget is spent")]
    BudgetSpent,
    /// The request itself was refused (a 4xx other than 429): not retried.
    #[error("the model refused the request: {0}")]
    Refused(String),
}

impl LlmError {
    fn retryable(&self) -> bool {
        matches!(self, LlmError::Unavailable(_) | LlmError::BadAnswer(_))
    }
}

/// Checks a parsed answer: `Err` says what is wrong with it.
pub type Check<'a> = &'a (dyn for<'v> Fn(&'v Value) -> Result<(), String> + Sync + 'a);

/// One structured request: instructions, the input, and the JSON schema
/// the answer must follow.
#[derive(Debug, Clone)]
pub struct Task<'a> {
    /// A short name for the schema and the logs (`summary`, `facts`).
    pub name: &'a str,
    pub instructions: &'a str,
    pub input: String,
    pub schema: Value,
}

#[async_trait]
pub trait Llm: Send + Sync {
    /// The model's name, recorded with what it made.
    fn model(&self) -> &str;

    /// The answer to `task` for `tenant`, parsed as JSON and checked by
    /// `check` (a parse into the caller's type with its own rules); a
    /// failed check is retried like an unusable answer.
    async fn structured(&self, tenant: &str, task: &Task<'_>, check: Check<'_>) -> Result<Value, LlmError>;
}

/// The configured model, if any.
pub fn from_config(config: &LlmConfig) -> anyhow::Result<Option<std::sync::Arc<dyn Llm>>> {
    match config.provider.as_str() {
        "none" => Ok(None),
        "openai" => Ok(Some(std::sync::Arc::new(OpenAiChat::new(config)?))),
        other => anyhow::bail!("llm.provider `{other}` is not known; expected none or openai"),
    }
}

/// The sampling temperature of retries.
const RETRY_TEMPERATURE: f32 = 0.7;

pub struct OpenAiChat {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<String>,
    max_retries: usize,
    max_output_tokens: u32,
    in_flight: Semaphore,
    daily_budget: u64,
    /// Tokens spent per tenant and UTC day.
    spent: Mutex<HashMap<(String, NaiveDate), u64>>,
}

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    messages: [Message<'a>; 2],
    temperature: f32,
    max_tokens: u32,
    response_format: Value,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Deserialize)]
struct Response {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct AnswerMessage {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize, Default)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

impl OpenAiChat {
    pub fn new(config: &LlmConfig) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().timeout(Duration::from_millis(config.timeout_ms)).build()?;
        Ok(Self {
            client,
            url: format!("{}/chat/completions", config.base_url.trim_end_matches('/')),
            model: config.model.clone(),
            api_key: Some(config.api_key.clone()).filter(|k| !k.is_empty()),
            max_retries: config.max_retries as usize,
            max_output_tokens: config.max_output_tokens,
            in_flight: Semaphore::new(config.concurrency.max(1)),
            daily_budget: config.daily_token_budget,
            spent: Mutex::new(HashMap::new()),
        })
    }

    fn today(&self, tenant: &str) -> (String, NaiveDate) {
        (tenant.to_string(), Utc::now().date_naive())
    }

    fn over_budget(&self, tenant: &str) -> bool {
        if self.daily_budget == 0 {
            return false;
        }
        let spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        spent.get(&self.today(tenant)).copied().unwrap_or(0) >= self.daily_budget
    }

    fn record(&self, tenant: &str, usage: &Usage) {
        let tenant_label = tenant.to_string();
        metrics::counter!("engram_llm_tokens_total", "tenant" => tenant_label.clone(), "kind" => "prompt")
            .increment(usage.prompt_tokens);
        metrics::counter!("engram_llm_tokens_total", "tenant" => tenant_label, "kind" => "completion")
            .increment(usage.completion_tokens);
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        let day = self.today(tenant);
        // Yesterday's counts are of no further use.
        spent.retain(|(_, d), _| *d == day.1);
        *spent.entry(day).or_default() += usage.prompt_tokens + usage.completion_tokens;
    }

    /// One request, no retry.
    async fn once(&self, tenant: &str, task: &Task<'_>, check: Check<'_>, temperature: f32) -> Result<Value, LlmError> {
        if self.over_budget(tenant) {
            return Err(LlmError::BudgetSpent);
        }
        let _permit = self.in_flight.acquire().await.map_err(|_| LlmError::Unavailable("shutting down".into()))?;
        let body = Request {
            model: &self.model,
            messages: [
                Message { role: "system", content: task.instructions },
                Message { role: "user", content: &task.input },
            ],
            temperature,
            max_tokens: self.max_output_tokens,
            response_format: json!({
                "type": "json_schema",
                "json_schema": {"name": task.name, "strict": true, "schema": task.schema},
            }),
        };
        let mut request = self.client.post(&self.url).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let started = std::time::Instant::now();
        let resp = request.send().await.map_err(|e| LlmError::Unavailable(format!("transport: {e}")))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| LlmError::Unavailable(format!("reading the body: {e}")))?;
        metrics::histogram!("engram_llm_request_seconds", "task" => task.name.to_string())
            .record(started.elapsed().as_secs_f64());
        if !status.is_success() {
            let detail =
                format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes).chars().take(200).collect::<String>());
            return Err(if status.as_u16() == 429 || status.is_server_error() {
                LlmError::Unavailable(detail)
            } else {
                LlmError::Refused(detail)
            });
        }
        let parsed: Response =
            serde_json::from_slice(&bytes).map_err(|e| LlmError::BadAnswer(format!("not a chat completion: {e}")))?;
        // Tokens are spent whether or not the answer is usable.
        self.record(tenant, parsed.usage.as_ref().unwrap_or(&Usage::default()));
        let choice = parsed
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| LlmError::BadAnswer("no answer in the completion".into()))?;
        if choice.finish_reason.as_deref() == Some("length") {
            return Err(LlmError::BadAnswer(format!(
                "the answer was cut at llm.max_output_tokens ({})",
                self.max_output_tokens
            )));
        }
        let content =
            choice.message.content.ok_or_else(|| LlmError::BadAnswer("no answer in the completion".into()))?;
        let value: Value = serde_json::from_str(content.trim())
            .map_err(|e| LlmError::BadAnswer(format!("the answer is not JSON: {e}")))?;
        check(&value).map_err(LlmError::BadAnswer)?;
        Ok(value)
    }
}

#[async_trait]
impl Llm for OpenAiChat {
    fn model(&self) -> &str {
        &self.model
    }

    async fn structured(&self, tenant: &str, task: &Task<'_>, check: Check<'_>) -> Result<Value, LlmError> {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(10))
            .with_max_times(self.max_retries)
            .with_jitter();
        // The first attempt is greedy (temperature 0: the model's most
        // likely answer); a retry samples instead, since a deterministic
        // model asked again would repeat an answer that ran on or broke off.
        let attempt = std::sync::atomic::AtomicU32::new(0);
        let outcome = (|| {
            let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.once(tenant, task, check, if n == 0 { 0.0 } else { RETRY_TEMPERATURE })
        })
            .retry(backoff)
            .when(LlmError::retryable)
            .notify(|e, after| tracing::warn!(error = %e, retry_in_ms = after.as_millis() as u64, task = task.name, "model call failed"))
            .await;
        let label = match &outcome {
            Ok(_) => "ok",
            Err(LlmError::BudgetSpent) => "budget_spent",
            Err(LlmError::Refused(_)) => "refused",
            Err(LlmError::BadAnswer(_)) => "bad_answer",
            Err(LlmError::Unavailable(_)) => "unavailable",
        };
        metrics::counter!("engram_llm_calls_total", "task" => task.name.to_string(), "outcome" => label).increment(1);
        outcome
    }
}
