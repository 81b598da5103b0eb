//! Moving stored memories into the configured model's vector space, a batch
//! at a time. Rows are claimed with `FOR UPDATE SKIP LOCKED`, so replicas
//! share the work without doing it twice, and the work resumes wherever it
//! stopped: a row is done exactly when its `embedding_model` is the
//! configured one.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::{PgStore, rows, store_error};
use crate::domain::Tier;
use crate::embed::Embedder;
use crate::store::StoreResult;

/// Rows whose vector is missing or of another model than `$1`: three ranges
/// of the `embedding_model` index (migration 0020), where `IS DISTINCT FROM`
/// would read every row.
const OTHER_MODEL: &str = "(embedding_model IS NULL OR embedding_model < $1 OR embedding_model > $1)";

impl PgStore {
    /// Rows of every tier whose vector is missing or from another model.
    pub async fn reembed_pending(&self, model: &str) -> StoreResult<i64> {
        let mut total = 0;
        for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
            let sql = format!("SELECT count(*) FROM {} WHERE {OTHER_MODEL}", rows::table(tier));
            let n: i64 =
                sqlx::query_scalar(AssertSqlSafe(sql)).bind(model).fetch_one(&self.pool).await.map_err(store_error)?;
            total += n;
        }
        Ok(total)
    }

    /// Re-embeds up to `batch` rows of one tier; returns how many.
    pub async fn reembed_batch(
        &self,
        tier: Tier,
        embedder: &dyn Embedder,
        batch: usize,
        now: DateTime<Utc>,
    ) -> anyhow::Result<usize> {
        let table = rows::table(tier);
        let mut tx = self.pool.begin().await?;
        let sql =
            format!("SELECT tenant_id, id, content FROM {table} WHERE {OTHER_MODEL} LIMIT $2 FOR UPDATE SKIP LOCKED");
        let claimed =
            sqlx::query(AssertSqlSafe(sql)).bind(embedder.model_id()).bind(batch as i64).fetch_all(&mut *tx).await?;
        if claimed.is_empty() {
            return Ok(0);
        }
        let mut keys: Vec<(String, Uuid)> = Vec::with_capacity(claimed.len());
        let mut texts = Vec::with_capacity(claimed.len());
        for row in &claimed {
            keys.push((row.try_get("tenant_id")?, row.try_get("id")?));
            texts.push(row.try_get::<String, _>("content")?);
        }
        let vectors = embedder.embed_in(&texts, crate::embed::Lane::Background).await?;
        let sql = format!(
            "UPDATE {table} SET embedding = $3, embedding_model = $4, updated_at = $5 WHERE tenant_id = $1 AND id = $2"
        );
        for ((tenant, id), vector) in keys.iter().zip(vectors) {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(tenant)
                .bind(id)
                .bind(pgvector::Vector::from(vector))
                .bind(embedder.model_id())
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(keys.len())
    }
}
