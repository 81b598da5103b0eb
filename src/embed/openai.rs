//! An OpenAI-compatible `/v1/embeddings` client: batching, a timeout per
//! request, and retries with exponential backoff on 429, 5xx and transport
//! errors. Any server speaking the same shape works (OpenAI, vLLM, Ollama,
//! text-embeddings-inference, local test servers).
//!
//! It hands back exactly one unit vector of the configured size per text, in
//! input order, or an error: a response that breaks that shape is a
//! `BadResponse` and is never patched up. Any other 4xx is the request's fault
//! and is not retried.

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
        // Config validation says the same; this guards direct callers, as `chunks(0)` panics.
        anyhow::ensure!(config.batch_size > 0, "embedding.openai.batch_size must be greater than 0");
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
                // The body is read whole before it is parsed, so that a connection cut or
                // a timeout in the middle of it is retried like any transport error, while
                // a body that arrived but is not the expected JSON is not.
                Ok(resp) if resp.status().is_success() => match resp.bytes().await {
                    Ok(body) => {
                        let parsed: Response = serde_json::from_slice(&body)
                            .map_err(|e| EmbedError::BadResponse(format!("unreadable body: {e}")))?;
                        return self.collect(parsed, texts.len());
                    }
                    Err(e) => format!("reading the body: {}", error_chain(&e)),
                },
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
                Err(e) => format!("transport: {}", error_chain(&e)),
            };
            if attempt >= self.max_retries {
                return Err(EmbedError::Unavailable(format!("{retryable} (gave up after {} attempts)", attempt + 1)));
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
        let mut out: Vec<Option<Vec<f32>>> = vec![None; expected];
        for d in parsed.data {
            let Some(slot) = out.get_mut(d.index) else {
                return Err(EmbedError::BadResponse(format!(
                    "vector index {} is out of range for {expected} texts",
                    d.index
                )));
            };
            if slot.is_some() {
                return Err(EmbedError::BadResponse(format!("vector index {} appears twice", d.index)));
            }
            if d.embedding.len() != self.dimensions {
                return Err(EmbedError::BadResponse(format!(
                    "vector {} has {} dimensions, expected {} (embedding.openai.dimensions)",
                    d.index,
                    d.embedding.len(),
                    self.dimensions
                )));
            }
            // A zero (or overflowing) vector cannot be made unit length and would
            // compare as NaN with everything.
            let norm = d.embedding.iter().map(|x| x * x).sum::<f32>();
            if !(norm.is_finite() && norm > 0.0) {
                return Err(EmbedError::BadResponse(format!("vector {} is zero or not finite", d.index)));
            }
            let mut v = d.embedding;
            normalize(&mut v);
            *slot = Some(v);
        }
        // As many vectors as texts, each index in range and none twice: every slot is filled.
        Ok(out.into_iter().flatten().collect())
    }
}

/// reqwest's `Display` stops at "error sending request for url (...)"; what
/// actually happened ("Connection refused", "operation timed out") is further
/// down the source chain, and the log needs it.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
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

#[cfg(test)]
mod tests {
    //! Protocol handling against a scripted loopback server: what a real model
    //! server cannot be made to do on demand (429, 503, malformed bodies) and
    //! how many requests were sent. tests/embed_openai.rs runs the same client
    //! against a real model.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Serves `replies[n]` (status, JSON body) to the n-th request, the last one
    /// to every later request, one request per connection. Returns the base URL
    /// and the request count.
    async fn scripted_server(replies: Vec<(u16, String)>) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let (status, body) = replies[n.min(replies.len() - 1)].clone();
                tokio::spawn(async move {
                    read_request(&mut socket).await;
                    let head = format!(
                        "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(body.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        (base_url, count)
    }

    /// Reads one request: the head, then `content-length` bytes of body.
    async fn read_request(socket: &mut TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let body_len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + body_len {
                    return;
                }
            }
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn embedder(base_url: &str, max_retries: u32) -> OpenAiEmbedder {
        OpenAiEmbedder::new(&OpenAiConfig {
            base_url: base_url.into(),
            model: "test-model".into(),
            dimensions: 2,
            timeout_ms: 5_000,
            max_retries,
            ..OpenAiConfig::default()
        })
        .unwrap()
    }

    fn texts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("text {i}")).collect()
    }

    fn ok_body(data: &[(usize, [f32; 2])]) -> String {
        let data: Vec<_> = data
            .iter()
            .map(|(index, v)| serde_json::json!({"object": "embedding", "index": index, "embedding": v}))
            .collect();
        serde_json::json!({"object": "list", "data": data, "model": "test-model"}).to_string()
    }

    fn error_body() -> String {
        r#"{"error": {"message": "scripted", "type": "invalid_request_error"}}"#.to_string()
    }

    #[tokio::test]
    async fn a_400_is_not_retried() {
        let (url, count) = scripted_server(vec![(400, error_body())]).await;
        let err = embedder(&url, 3).embed(&texts(1)).await.unwrap_err();
        assert!(matches!(&err, EmbedError::BadResponse(m) if m.contains("400")), "{err}");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_503_is_retried_max_retries_times_then_unavailable() {
        let (url, count) = scripted_server(vec![(503, error_body())]).await;
        let err = embedder(&url, 2).embed(&texts(1)).await.unwrap_err();
        assert!(matches!(&err, EmbedError::Unavailable(m) if m.contains("503") && m.contains("3 attempts")), "{err}");
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_429_then_a_success_returns_the_vectors() {
        let (url, count) = scripted_server(vec![(429, error_body()), (200, ok_body(&[(0, [3.0, 4.0])]))]).await;
        let vectors = embedder(&url, 2).embed(&texts(1)).await.unwrap();
        assert_eq!(vectors, vec![vec![0.6, 0.8]]);
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn vectors_are_put_in_index_order_and_normalised() {
        let (url, _) = scripted_server(vec![(200, ok_body(&[(1, [0.0, 2.0]), (0, [3.0, 4.0])]))]).await;
        let vectors = embedder(&url, 0).embed(&texts(2)).await.unwrap();
        assert_eq!(vectors, vec![vec![0.6, 0.8], vec![0.0, 1.0]]);
    }

    #[tokio::test]
    async fn a_repeated_index_is_a_bad_response_not_a_missing_vector() {
        let (url, count) = scripted_server(vec![(200, ok_body(&[(0, [3.0, 4.0]), (0, [3.0, 4.0])]))]).await;
        let err = embedder(&url, 2).embed(&texts(2)).await.unwrap_err();
        assert!(matches!(&err, EmbedError::BadResponse(m) if m.contains("twice")), "{err}");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_out_of_range_index_is_a_bad_response() {
        let (url, _) = scripted_server(vec![(200, ok_body(&[(5, [3.0, 4.0])]))]).await;
        let err = embedder(&url, 0).embed(&texts(1)).await.unwrap_err();
        assert!(matches!(&err, EmbedError::BadResponse(m) if m.contains("out of range")), "{err}");
    }

    #[tokio::test]
    async fn a_zero_vector_is_a_bad_response() {
        let (url, _) = scripted_server(vec![(200, ok_body(&[(0, [0.0, 0.0])]))]).await;
        let err = embedder(&url, 0).embed(&texts(1)).await.unwrap_err();
        assert!(matches!(&err, EmbedError::BadResponse(m) if m.contains("zero")), "{err}");
    }

    #[tokio::test]
    async fn a_body_that_is_not_the_expected_json_is_a_bad_response_and_not_retried() {
        let (url, count) = scripted_server(vec![(200, r#"{"data": "nope"}"#.to_string())]).await;
        let err = embedder(&url, 2).embed(&texts(1)).await.unwrap_err();
        assert!(matches!(&err, EmbedError::BadResponse(m) if m.contains("unreadable body")), "{err}");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_batch_size_of_zero_is_refused() {
        let config = OpenAiConfig { batch_size: 0, ..OpenAiConfig::default() };
        let err = OpenAiEmbedder::new(&config).err().expect("batch_size 0 must be refused");
        assert!(err.to_string().contains("batch_size"), "{err}");
    }
}
