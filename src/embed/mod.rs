//! Text embedders behind one trait. Every vector engram stores is tagged with
//! the [`Embedder::model_id`] that made it, and only vectors of one model are
//! ever compared.

mod int8_products;
pub mod lexical;
pub mod local;
pub mod openai;
mod queue;

pub use queue::Lane;

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{EmbeddingConfig, EmbeddingProvider};

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The provider could not be reached or kept failing; worth retrying later.
    #[error("embedding provider unavailable: {0}")]
    Unavailable(String),
    /// The provider answered something engram cannot use.
    #[error("embedding provider answered badly: {0}")]
    BadResponse(String),
    /// Too much work is queued; the caller should come back later.
    #[error("the embedding queue is full")]
    Busy { retry_after_secs: u64 },
}

#[async_trait]
pub trait Embedder: Send + Sync {
    /// Stored next to every vector; two ids are two vector spaces.
    fn model_id(&self) -> &str;
    fn dimensions(&self) -> usize;
    /// One vector per text, in order, each L2-normalised.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// `embed` for a caller in `lane`: an embedder that queues work serves
    /// queries first and shares the rest fairly between tenants (the local
    /// model does; the others serve callers as they come).
    async fn embed_in(&self, texts: &[String], lane: Lane<'_>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let _ = lane;
        self.embed(texts).await
    }
}

/// The configured embedder, or none.
pub fn from_config(config: &EmbeddingConfig) -> anyhow::Result<Option<Arc<dyn Embedder>>> {
    Ok(match config.provider {
        EmbeddingProvider::None => None,
        EmbeddingProvider::LexicalHash => Some(Arc::new(lexical::LexicalHashEmbedder::new(config.lexical_dimensions))),
        EmbeddingProvider::Openai => Some(Arc::new(openai::OpenAiEmbedder::new(&config.openai)?)),
        EmbeddingProvider::Local => Some(Arc::new(local::LocalEmbedder::new(&config.local)?)),
    })
}

/// Scales a vector to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// The dot product of two vectors of one length: their cosine when both are
/// unit length. Sixteen independent sums, so the compiler can keep them in
/// vector registers (a single running sum is a dependency chain it may not
/// reorder).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for ((a, x), y) in acc.iter_mut().zip(x).zip(y) {
            *a += x * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}
