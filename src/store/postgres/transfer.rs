//! Export and import of a tenant's rows (`engram export`, `engram import`):
//! reading them page by page with every stored column, and writing them back
//! exactly as they were. The write rules of `memories.rs` (dedup, supersede,
//! upsert, counters) are deliberately not applied: an import restores rows,
//! it does not replay writes.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Postgres, QueryBuilder};

use super::rows::{self, MemoryRow};
use super::{PgStore, store_error};
use crate::domain::Tier;
use crate::store::{Cursor, Embedding, StoreResult, StoredMemory, TransferRow};

#[derive(sqlx::FromRow)]
struct ExportRow {
    #[sqlx(flatten)]
    row: MemoryRow,
    content_hash: String,
    reward_count: Option<i32>,
    embedding: Option<pgvector::Vector>,
    consolidated_at: Option<DateTime<Utc>>,
}

/// The columns every tier's insert starts with, in the order `push_common` binds them.
const COMMON: &str = "id, tenant_id, agent_id, user_id, session_id, content, content_hash, importance, embedding, \
    embedding_model, access_count, last_accessed_at, retention, private, metadata, occurred_at, created_at, \
    updated_at, expires_at, provenance";

impl PgStore {
    /// How many rows `export_page` gives for `tier` (the same live rows).
    pub async fn export_count(&self, tenant: &str, tier: Tier, now: DateTime<Utc>) -> StoreResult<u64> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE tenant_id = $1 AND (expires_at IS NULL OR expires_at > $2)",
            rows::table(tier)
        );
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(tenant)
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(n.max(0) as u64)
    }

    /// Up to `limit` live rows of one tier after `after`, oldest first.
    pub async fn export_page(
        &self,
        tenant: &str,
        tier: Tier,
        after: Option<Cursor>,
        limit: usize,
        vectors: bool,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<TransferRow>> {
        let reward = if tier == Tier::Procedural { "reward_count" } else { "NULL::integer AS reward_count" };
        let consolidated =
            if tier == Tier::Episodic { "consolidated_at" } else { "NULL::timestamptz AS consolidated_at" };
        let sql = format!(
            "SELECT {cols}, content_hash, {reward}, {consolidated}, CASE WHEN $5 THEN embedding END AS embedding \
             FROM {table} \
             WHERE tenant_id = $1 AND (expires_at IS NULL OR expires_at > $2) \
             AND ($3::timestamptz IS NULL OR (created_at, id) > ($3, $4)) \
             ORDER BY created_at, id LIMIT $6",
            cols = rows::columns(tier),
            table = rows::table(tier),
        );
        let found: Vec<ExportRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant)
            .bind(now)
            .bind(after.map(|c| c.created_at))
            .bind(after.map(|c| c.id))
            .bind(vectors)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        found
            .into_iter()
            .map(|r| {
                let memory: crate::domain::Memory = r.row.try_into()?;
                let embedding = match (r.embedding, &memory.embedding_model) {
                    (Some(v), Some(model)) => Some(Embedding { model: model.clone(), vector: v.to_vec() }),
                    _ => None,
                };
                let stored =
                    StoredMemory { memory, content_hash: r.content_hash, reward_count: r.reward_count, embedding };
                Ok(TransferRow { stored, consolidated_at: r.consolidated_at })
            })
            .collect()
    }

    /// Inserts the rows as given in one transaction, skipping ids the tenant
    /// already has. Beforehand (each in its own short transaction, as the
    /// server does at start): registers the vectors' models with their
    /// indexes.
    pub async fn import_batch(&self, tenant: &str, batch: &[TransferRow]) -> anyhow::Result<Vec<bool>> {
        let mut models = BTreeMap::new();
        for e in batch.iter().filter_map(|r| r.stored.embedding.as_ref()) {
            models.entry(e.model.as_str()).or_insert(e.vector.len());
        }
        for (model, dimensions) in models {
            self.ensure_model(model, dimensions).await?;
        }

        let mut tx = self.pool.begin().await?;
        let mut inserted = Vec::with_capacity(batch.len());
        for TransferRow { stored: r, consolidated_at } in batch {
            let m = &r.memory;
            let table = rows::table(m.tier);
            let exists: bool = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT EXISTS (SELECT 1 FROM {table} WHERE tenant_id = $1 AND id = $2)"
            )))
            .bind(tenant)
            .bind(m.id)
            .fetch_one(&mut *tx)
            .await?;
            if exists {
                inserted.push(false);
                continue;
            }
            let mut qb = insert(tenant, r)?;
            qb.build().execute(&mut *tx).await.map_err(|e| conflict_context(e, r))?;
            if let (Tier::Episodic, Some(at)) = (m.tier, consolidated_at) {
                sqlx::query("UPDATE episodic_memory SET consolidated_at = $3 WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant)
                    .bind(m.id)
                    .bind(at)
                    .execute(&mut *tx)
                    .await?;
            }
            inserted.push(true);
        }
        tx.commit().await?;
        Ok(inserted)
    }
}

/// Names the memory whose insert failed, and says why a unique key can
/// refuse it: the tenant already holds the same valid fact or skill under
/// another id, or (semantic and procedural ids are unique across tenants)
/// another tenant of this database holds the id.
fn conflict_context(e: sqlx::Error, r: &StoredMemory) -> anyhow::Error {
    let unique = matches!(&e, sqlx::Error::Database(db) if db.is_unique_violation());
    let m = &r.memory;
    if unique {
        anyhow::Error::new(e).context(format!(
            "memory {} ({}) conflicts with a stored one: the same valid fact or skill name under another id, \
             or the id in another tenant",
            m.id,
            m.tier.as_str()
        ))
    } else {
        anyhow::Error::new(e).context(format!("inserting memory {} ({})", m.id, m.tier.as_str()))
    }
}

/// The INSERT of one row, every stored column given (generated ones aside).
pub(super) fn insert(tenant: &str, r: &StoredMemory) -> anyhow::Result<QueryBuilder<Postgres>> {
    let m = &r.memory;
    let extra = match m.tier {
        Tier::Episodic => "event_type, outcome",
        Tier::Semantic => {
            "namespace, subject, predicate, object, confidence, source_episode_id, supersedes, valid_from, valid_until, \
             source, contested_by"
        }
        Tier::Procedural => {
            "skill_name, trigger_pattern, policy, tool_sequence, success_count, failure_count, reward_count, \
             avg_reward, version"
        }
        Tier::Working => anyhow::bail!("memory {}: working memory is not stored in Postgres", m.id),
    };
    let mut qb = QueryBuilder::new(format!("INSERT INTO {} ({COMMON}, {extra}) VALUES (", rows::table(m.tier)));
    let mut v = qb.separated(", ");
    v.push_bind(m.id);
    v.push_bind(tenant);
    v.push_bind(&m.agent_id);
    v.push_bind(&m.user_id);
    v.push_bind(&m.session_id);
    v.push_bind(&m.content);
    v.push_bind(&r.content_hash);
    v.push_bind(m.importance);
    v.push_bind(r.embedding.as_ref().map(|e| pgvector::Vector::from(e.vector.clone())));
    v.push_bind(r.embedding.as_ref().map(|e| e.model.as_str()));
    v.push_bind(i32::try_from(m.access_count).unwrap_or(i32::MAX));
    v.push_bind(m.last_accessed_at);
    v.push_bind(m.retention.as_str());
    v.push_bind(m.private);
    v.push_bind(sqlx::types::Json(&m.metadata));
    v.push_bind(m.occurred_at);
    v.push_bind(m.created_at);
    v.push_bind(m.updated_at);
    v.push_bind(m.expires_at);
    v.push_bind(m.provenance.as_ref().map(sqlx::types::Json));
    match m.tier {
        Tier::Episodic => {
            v.push_bind(m.event_type.map_or("conversation", |e| e.as_str()));
            v.push_bind(m.outcome.map(|o| o.as_str()));
        }
        Tier::Semantic => {
            let namespace = m
                .namespace
                .clone()
                .unwrap_or_else(|| crate::domain::memory::namespace(&m.agent_id, m.user_id.as_deref()));
            v.push_bind(namespace);
            v.push_bind(&m.subject);
            v.push_bind(&m.predicate);
            v.push_bind(&m.object);
            v.push_bind(m.confidence.unwrap_or(0.7));
            v.push_bind(m.source_episode_id);
            v.push_bind(m.supersedes);
            v.push_bind(m.valid_from.unwrap_or(m.occurred_at));
            v.push_bind(m.valid_until);
            v.push_bind(m.source.unwrap_or(crate::domain::facts::Source::Agent).as_str());
            v.push_bind(m.contested_by);
        }
        Tier::Procedural => {
            v.push_bind(&m.skill_name);
            v.push_bind(&m.trigger_pattern);
            v.push_bind(&m.policy);
            v.push_bind(&m.tool_sequence);
            v.push_bind(m.success_count.unwrap_or(0));
            v.push_bind(m.failure_count.unwrap_or(0));
            v.push_bind(r.reward_count.unwrap_or(0));
            v.push_bind(m.avg_reward.unwrap_or(0.0));
            v.push_bind(m.version.unwrap_or(1));
        }
        Tier::Working => unreachable!("refused above"),
    }
    v.push_unseparated(")");
    Ok(qb)
}
