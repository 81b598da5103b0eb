//! A deterministic, dependency-free stand-in embedder: words and word pairs
//! hashed into a fixed number of signed buckets ("feature hashing").
//!
//! It is lexical, not semantic: "car" and "automobile" share nothing. It
//! exists so engram can run and be tested with vectors and no model; it is
//! never the default, and its model id says what it is.

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::{EmbedError, Embedder, normalize};

pub struct LexicalHashEmbedder {
    dimensions: usize,
    model_id: String,
}

impl LexicalHashEmbedder {
    pub fn new(dimensions: usize) -> Self {
        Self { dimensions, model_id: format!("lexical-hash-v1-{dimensions}") }
    }

    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let words: Vec<String> =
            text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
        let mut v = vec![0.0f32; self.dimensions];
        let mut add = |feature: &str, weight: f32| {
            let h = Sha256::digest(feature.as_bytes());
            let bucket = u64::from_le_bytes(h[..8].try_into().expect("8 bytes")) as usize % self.dimensions;
            let sign = if h[8] & 1 == 0 { 1.0 } else { -1.0 };
            v[bucket] += sign * weight;
        };
        for w in &words {
            add(w, 1.0);
        }
        for pair in words.windows(2) {
            add(&format!("{} {}", pair[0], pair[1]), 0.5);
        }
        normalize(&mut v);
        v
    }
}

#[async_trait]
impl Embedder for LexicalHashEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| self.embed_one(t)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn same_text_same_vector_unit_length() {
        let e = LexicalHashEmbedder::new(384);
        let a = e.embed_one("The user prefers dark mode");
        assert_eq!(a, e.embed_one("the USER prefers dark mode!"));
        assert!((cosine(&a, &a) - 1.0).abs() < 1e-6);
        assert_eq!(e.model_id(), "lexical-hash-v1-384");
    }

    #[test]
    fn shared_words_score_higher_than_none() {
        let e = LexicalHashEmbedder::new(384);
        let q = e.embed_one("dark mode");
        let near = e.embed_one("user prefers dark mode");
        let far = e.embed_one("flight to lisbon booked");
        assert!(cosine(&q, &near) > 0.4);
        assert!(cosine(&q, &far) < cosine(&q, &near));
    }
}
