//! An OpenAI-compatible `/v1/embeddings` client: batching, a timeout per
//! request, and retries with exponential backoff on 429, 5xx and transport
//! errors. Any server speaking the same shape works (OpenAI, vLLM, Ollama,
//! text-embeddings-inference, local test servers).

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{EmbedError, Embedder, normalize};
use crate::config::OpenAiConfig;

pub struct OpenAiEmbedder {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<String>,
    dimensions: usize,
    send_dimensions: bool,
    batch_size: usize,
    max_retries: u32,
}

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    input: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<usize>,
    encoding_format: &'static str,
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Datum>,
}

#[derive(Deserialize)]
struct Datum {
    index: usize,
    embedding: Vec<f32>,
}

impl OpenAiEmbedder {
    pub fn new(config: &OpenAiConfig) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().timeout(Duration::from_millis(config.timeout_ms)).build()?;
        Ok(Self {
            client,
            url: format!("{}/embeddings", config.base_url.trim_end_matches('/')),
            model: config.model.clone(),
            api_key: Some(config.api_key.clone()).filter(|k| !k.is_empty()),
            dimensions: config.dimensions,
            send_dimensions: config.send_dimensions,
            batch_size: config.batch_size,
            max_retries: config.max_retries,
        })
    }

    async fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let body = Request {
            model: &self.model,
            input: texts,
            dimensions: self.send_dimensions.then_some(self.dimensions),
            encoding_format: "float",
        };
        let mut attempt = 0;
        loop {
            let mut request = self.client.post(&self.url).json(&body);
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let retryable = match request.send().await {
                Ok(resp) if resp.status().is_success() => {
                    let parsed: Response =
                        resp.json().await.map_err(|e| EmbedError::BadResponse(format!("unreadable body: {e}")))?;
                    return self.collect(parsed, texts.len());
                }
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    let detail = format!("HTTP {status}: {}", text.chars().take(200).collect::<String>());
                    if status.as_u16() == 429 || status.is_server_error() {
                        detail
                    } else {
                        return Err(EmbedError::BadResponse(detail));
                    }
                }
                Err(e) => format!("transport: {e}"),
            };
            if attempt >= self.max_retries {
                return Err(EmbedError::Unavailable(retryable));
            }
            // 100 ms, 200 ms, 400 ms, ... with up to 50 % jitter.
            let base = 100u64 << attempt.min(6);
            let jitter = rand::random_range(0..=base / 2);
            tokio::time::sleep(Duration::from_millis(base + jitter)).await;
            attempt += 1;
        }
    }

    fn collect(&self, parsed: Response, expected: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        if parsed.data.len() != expected {
            return Err(EmbedError::BadResponse(format!("{} vectors for {expected} texts", parsed.data.len())));
        }
        let mut out = vec![Vec::new(); expected];
        for d in parsed.data {
            if d.index >= expected || d.embedding.len() != self.dimensions {
                return Err(EmbedError::BadResponse(format!(
                    "vector {} has {} dimensions, expected {}",
                    d.index,
                    d.embedding.len(),
                    self.dimensions
                )));
            }
            let mut v = d.embedding;
            normalize(&mut v);
            out[d.index] = v;
        }
        Ok(out)
    }
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    fn model_id(&self) -> &str {
        &self.model
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(self.batch_size) {
            out.extend(self.embed_batch(chunk).await?);
        }
        Ok(out)
    }
}
