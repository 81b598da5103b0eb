//! Export and import of a tenant's rows (`engram export`, `engram import`),
//! the SQLite side of `store/postgres/transfer.rs`: rows are read with every
//! stored column and written back exactly as they were, without the write
//! rules of `write.rs` (an import restores rows, it does not replay writes).

use anyhow::Context;
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite};

use super::rows::{COLUMNS, MemoryRow, decode_vector, encode_vector, to_json_text};
use super::write::IndexOp;
use super::{SqliteStore, from_micros, micros, store_error};
use crate::domain::{Memory, Tier};
use crate::store::{Cursor, Embedding, StoreResult, StoredMemory, TransferRow};

#[derive(sqlx::FromRow)]
struct ExportRow {
    #[sqlx(flatten)]
    row: MemoryRow,
    content_hash: String,
    reward_count: Option<i32>,
    consolidated_at: Option<i64>,
    embedding: Option<Vec<u8>>,
}

impl SqliteStore {
    /// How many rows `export_page` gives for `tier` (the same live rows).
    pub async fn export_count(&self, tenant: &str, tier: Tier, now: DateTime<Utc>) -> StoreResult<u64> {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from memories where tenant_id = ?1 and tier = ?2 and (expires_at is null or expires_at > ?3)",
        )
        .bind(tenant)
        .bind(tier.as_str())
        .bind(micros(now))
        .fetch_one(&self.inner.pool)
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
        let mut qb = QueryBuilder::<Sqlite>::new(format!(
            "select {COLUMNS}, m.content_hash, m.reward_count, m.consolidated_at, case when "
        ));
        qb.push_bind(vectors).push(" then m.embedding end as embedding from memories m where m.tenant_id = ");
        qb.push_bind(tenant).push(" and m.tier = ").push_bind(tier.as_str());
        qb.push(" and (m.expires_at is null or m.expires_at > ").push_bind(micros(now)).push(")");
        if let Some(c) = after {
            qb.push(" and (m.created_at, m.id) > (").push_bind(micros(c.created_at)).push(", ").push_bind(c.id);
            qb.push(")");
        }
        qb.push(" order by m.created_at, m.id limit ").push_bind(limit as i64);
        let found: Vec<ExportRow> = qb.build_query_as().fetch_all(&self.inner.pool).await.map_err(store_error)?;
        found
            .into_iter()
            .map(|r| {
                let memory: Memory = r.row.try_into()?;
                let embedding = match (r.embedding, &memory.embedding_model) {
                    (Some(bytes), Some(model)) => {
                        Some(Embedding { model: model.clone(), vector: decode_vector(&bytes)? })
                    }
                    _ => None,
                };
                let consolidated_at = r.consolidated_at.map(from_micros).transpose()?;
                let stored =
                    StoredMemory { memory, content_hash: r.content_hash, reward_count: r.reward_count, embedding };
                Ok(TransferRow { stored, consolidated_at })
            })
            .collect()
    }

    /// Inserts the rows as given in one transaction, skipping ids the tenant
    /// already has; the in-process indexes learn the new rows after the commit.
    pub async fn import_batch(&self, tenant: &str, batch: &[TransferRow]) -> anyhow::Result<Vec<bool>> {
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await?;
        let mut inserted = Vec::with_capacity(batch.len());
        let mut ops = Vec::new();
        for TransferRow { stored: r, consolidated_at } in batch {
            let m = &r.memory;
            let exists: Option<i64> = sqlx::query_scalar("select 1 from memories where tenant_id = ? and id = ?")
                .bind(tenant)
                .bind(m.id)
                .fetch_optional(&mut *tx)
                .await?;
            if exists.is_some() {
                inserted.push(false);
                continue;
            }
            let mut qb = insert(tenant, r)?;
            qb.build().execute(&mut *tx).await.map_err(|e| {
                let what = format!("memory {} ({})", m.id, m.tier.as_str());
                match &e {
                    sqlx::Error::Database(db) if db.is_unique_violation() => anyhow::Error::new(e).context(format!(
                        "{what} conflicts with a stored one: the same valid fact or skill name under another id"
                    )),
                    _ => anyhow::Error::new(e).context(format!("inserting {what}")),
                }
            })?;
            if let (Tier::Episodic, Some(at)) = (m.tier, consolidated_at) {
                sqlx::query("update memories set consolidated_at = ? where tenant_id = ? and id = ?")
                    .bind(micros(*at))
                    .bind(tenant)
                    .bind(m.id)
                    .execute(&mut *tx)
                    .await?;
            }
            ops.push(IndexOp::Put(m.clone(), r.embedding.clone()));
            inserted.push(true);
        }
        tx.commit().await.context("committing the import batch")?;
        self.apply(tenant, ops);
        Ok(inserted)
    }
}

/// The INSERT of one row, every stored column given (generated ones aside).
pub(super) fn insert(tenant: &str, r: &StoredMemory) -> anyhow::Result<QueryBuilder<Sqlite>> {
    let m = &r.memory;
    anyhow::ensure!(m.tier != Tier::Working, "memory {}: working memory is not a row of `memories`", m.id);
    let mut qb = QueryBuilder::new(
        "insert into memories (id, tenant_id, tier, agent_id, user_id, session_id, content, content_hash, importance, \
             retention, private, metadata, occurred_at, created_at, updated_at, expires_at, access_count, \
             last_accessed_at, embedding, embedding_model, event_type, outcome, namespace, subject, predicate, object, \
             confidence, source_episode_id, supersedes, valid_from, valid_until, skill_name, trigger_pattern, policy, \
             tool_sequence, success_count, failure_count, reward_count, avg_reward, version, source, contested_by, \
             provenance) values (",
    );
    let semantic = m.tier == Tier::Semantic;
    let procedural = m.tier == Tier::Procedural;
    let mut v = qb.separated(", ");
    v.push_bind(m.id);
    v.push_bind(tenant);
    v.push_bind(m.tier.as_str());
    v.push_bind(&m.agent_id);
    v.push_bind(&m.user_id);
    v.push_bind(&m.session_id);
    v.push_bind(&m.content);
    v.push_bind(&r.content_hash);
    v.push_bind(m.importance);
    v.push_bind(m.retention.as_str());
    v.push_bind(m.private);
    v.push_bind(to_json_text(&m.metadata)?);
    v.push_bind(micros(m.occurred_at));
    v.push_bind(micros(m.created_at));
    v.push_bind(micros(m.updated_at));
    v.push_bind(m.expires_at.map(micros));
    v.push_bind(m.access_count);
    v.push_bind(m.last_accessed_at.map(micros));
    v.push_bind(r.embedding.as_ref().map(|e| encode_vector(&e.vector)));
    v.push_bind(r.embedding.as_ref().map(|e| e.model.as_str()));
    // Episodic.
    v.push_bind((m.tier == Tier::Episodic).then(|| m.event_type.map_or("conversation", |e| e.as_str())));
    v.push_bind(m.outcome.filter(|_| m.tier == Tier::Episodic).map(|o| o.as_str()));
    // Semantic.
    v.push_bind(semantic.then(|| {
        m.namespace.clone().unwrap_or_else(|| crate::domain::memory::namespace(&m.agent_id, m.user_id.as_deref()))
    }));
    v.push_bind(m.subject.as_ref().filter(|_| semantic));
    v.push_bind(m.predicate.as_ref().filter(|_| semantic));
    v.push_bind(m.object.as_ref().filter(|_| semantic));
    v.push_bind(semantic.then(|| m.confidence.unwrap_or(0.7)));
    v.push_bind(m.source_episode_id.filter(|_| semantic));
    v.push_bind(m.supersedes.filter(|_| semantic));
    v.push_bind(semantic.then(|| micros(m.valid_from.unwrap_or(m.occurred_at))));
    v.push_bind(m.valid_until.filter(|_| semantic).map(micros));
    // Procedural.
    v.push_bind(m.skill_name.as_ref().filter(|_| procedural));
    v.push_bind(m.trigger_pattern.as_ref().filter(|_| procedural));
    v.push_bind(m.policy.as_ref().filter(|_| procedural).map(to_json_text).transpose()?);
    v.push_bind(m.tool_sequence.as_ref().filter(|_| procedural).map(to_json_text).transpose()?);
    v.push_bind(procedural.then(|| m.success_count.unwrap_or(0)));
    v.push_bind(procedural.then(|| m.failure_count.unwrap_or(0)));
    v.push_bind(procedural.then(|| r.reward_count.unwrap_or(0)));
    v.push_bind(procedural.then(|| m.avg_reward.unwrap_or(0.0)));
    v.push_bind(procedural.then(|| m.version.unwrap_or(1)));
    v.push_bind(semantic.then(|| m.source.unwrap_or(crate::domain::facts::Source::Agent).as_str()));
    v.push_bind(m.contested_by.filter(|_| semantic));
    v.push_bind(m.provenance.as_ref().map(to_json_text).transpose()?);
    v.push_unseparated(")");
    Ok(qb)
}
