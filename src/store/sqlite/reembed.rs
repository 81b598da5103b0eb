//! Moving stored memories into the configured model's vector space, a batch
//! at a time (the SQLite side of `jobs/reembed.rs`; the Postgres backend
//! has the same two methods). A row is done exactly when its
//! `embedding_model` is the configured one, so the work resumes wherever it
//! stopped.
//!
//! The texts are embedded outside any transaction and outside the write
//! gate (embedding is the slow part, and writers must not wait on it); the
//! update then applies only where the content is still the one embedded, so
//! a patch that landed in between (with its own vector) is never undone.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::rows::{self, MemoryRow, encode_vector};
use super::write::IndexOp;
use super::{SqliteStore, micros, store_error};
use crate::domain::{Memory, Tier};
use crate::embed::Embedder;
use crate::store::{Embedding, StoreResult};

impl SqliteStore {
    /// Rows of every tier whose vector is missing or from another model.
    pub async fn reembed_pending(&self, model: &str) -> StoreResult<i64> {
        // `is not`: SQLite's null-safe "is distinct from".
        sqlx::query_scalar("select count(*) from memories where embedding_model is not ?")
            .bind(model)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)
    }

    /// Re-embeds up to `batch` rows of one tier; returns how many were updated.
    pub async fn reembed_batch(
        &self,
        tier: Tier,
        embedder: &dyn Embedder,
        batch: usize,
        now: DateTime<Utc>,
    ) -> anyhow::Result<usize> {
        let model = embedder.model_id().to_string();
        let claimed: Vec<(String, Uuid, String)> = sqlx::query_as(
            "select tenant_id, id, content from memories where tier = ? and embedding_model is not ? limit ?",
        )
        .bind(tier.as_str())
        .bind(&model)
        .bind(batch as i64)
        .fetch_all(&self.inner.pool)
        .await?;
        if claimed.is_empty() {
            return Ok(0);
        }
        let texts: Vec<String> = claimed.iter().map(|(_, _, content)| content.clone()).collect();
        let vectors = embedder.embed_in(&texts, crate::embed::Lane::Background).await?;
        anyhow::ensure!(
            vectors.len() == claimed.len(),
            "the embedder returned {} vectors for {} texts",
            vectors.len(),
            claimed.len()
        );

        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await?;
        let mut updated: Vec<(String, Memory, Embedding)> = Vec::with_capacity(claimed.len());
        for ((tenant, id, content), vector) in claimed.into_iter().zip(vectors) {
            let row: Option<MemoryRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "update memories set embedding = ?, embedding_model = ?, updated_at = ? \
                 where tenant_id = ? and id = ? and content = ? returning {}",
                rows::returning()
            )))
            .bind(encode_vector(&vector))
            .bind(&model)
            .bind(micros(now))
            .bind(&tenant)
            .bind(id)
            .bind(&content)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = row {
                updated.push((tenant, row.try_into()?, Embedding { model: model.clone(), vector }));
            }
        }
        tx.commit().await?;
        let n = updated.len();
        for (tenant, memory, embedding) in updated {
            self.apply(&tenant, vec![IndexOp::Put(memory, Some(embedding))]);
        }
        Ok(n)
    }
}
