//! `MemoryStore` on Postgres: the write path (dedup, supersede, upsert,
//! idempotency, one transaction per request), reads, listing, patches,
//! deletes and fact history.

use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Postgres, QueryBuilder, Transaction};
use uuid::Uuid;

use super::rows::{self, MemoryRow};
use super::{PgStore, observe, store_error};
use crate::domain::memory::merge_metadata;
use crate::domain::{Memory, MemoryPatch, Outcome, Tier, WrittenMemory};
use crate::store::{
    Adjacent, Embedding, IdempotencyKey, ListFilter, MemoryStore, PendingVector, PreparedMemory, RenderResponse,
    SearchHits, SearchQuery, StoreError, StoreResult, StoredResponse, WriteOutcome,
};

type Tx<'a> = Transaction<'a, Postgres>;

fn vector_of(e: Option<&Embedding>) -> (Option<pgvector::Vector>, Option<String>) {
    match e {
        Some(e) => (Some(pgvector::Vector::from(e.vector.clone())), Some(e.model.clone())),
        None => (None, None),
    }
}

fn live(now_param: usize) -> String {
    format!("(expires_at IS NULL OR expires_at > ${now_param})")
}

impl PgStore {
    async fn claim_key(
        &self,
        tx: &mut Tx<'_>,
        tenant: &str,
        key: &IdempotencyKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>> {
        // Takes the key unless a fresh one exists. A concurrent request with
        // the same key blocks here until the first one commits or aborts.
        let cutoff = now - self.idempotency_ttl;
        let claimed: Option<bool> = sqlx::query_scalar(
            "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status, response, created_at, updated_at) \
             VALUES ($1, $2, $3, 0, 'null', $4, $4) \
             ON CONFLICT (tenant_id, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, status = 0, \
                 response = 'null', created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at \
             WHERE idempotency_keys.created_at <= $5 \
             RETURNING true",
        )
        .bind(tenant)
        .bind(&key.key)
        .bind(&key.request_hash)
        .bind(now)
        .bind(cutoff)
        .fetch_optional(&mut **tx)
        .await
        .map_err(store_error)?;
        if claimed.is_some() {
            return Ok(None);
        }
        let (request_hash, status, body): (String, i16, Value) = sqlx::query_as(
            "SELECT request_hash, status, response FROM idempotency_keys WHERE tenant_id = $1 AND key = $2",
        )
        .bind(tenant)
        .bind(&key.key)
        .fetch_one(&mut **tx)
        .await
        .map_err(store_error)?;
        Ok(Some(StoredResponse { request_hash, status: status as u16, body }))
    }

    async fn insert_episodic(
        &self,
        tx: &mut Tx<'_>,
        tenant: &str,
        p: &PreparedMemory,
        now: DateTime<Utc>,
    ) -> StoreResult<Memory> {
        let m = &p.memory;
        let (vector, model) = vector_of(p.embedding.as_ref());
        let sql = format!(
            "INSERT INTO episodic_memory (id, tenant_id, agent_id, user_id, session_id, event_type, content, content_hash, \
                 outcome, importance, embedding, embedding_model, retention, private, metadata, occurred_at, created_at, \
                 updated_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $17, $18) \
             RETURNING {}",
            rows::episodic_columns()
        );
        let row: MemoryRow = sqlx::query_as(AssertSqlSafe(sql))
            .bind(m.id)
            .bind(tenant)
            .bind(&m.agent_id)
            .bind(&m.user_id)
            .bind(&m.session_id)
            .bind(m.event_type.map_or("conversation", |e| e.as_str()))
            .bind(&m.content)
            .bind(&p.content_hash)
            .bind(m.outcome.map(|o| o.as_str()))
            .bind(m.importance)
            .bind(vector)
            .bind(model)
            .bind(m.retention.as_str())
            .bind(m.private)
            .bind(sqlx::types::Json(&m.metadata))
            .bind(m.occurred_at.unwrap_or(now))
            .bind(now)
            .bind(p.expires_at)
            .fetch_one(&mut **tx)
            .await
            .map_err(store_error)?;
        row.try_into()
    }

    /// Inserts a fact, unless an identical valid one exists (returned with
    /// `deduplicated`). A fact with subject and predicate retires the valid
    /// facts about the same pair whose confidence is not higher.
    async fn insert_semantic(
        &self,
        tx: &mut Tx<'_>,
        tenant: &str,
        p: &PreparedMemory,
        now: DateTime<Utc>,
    ) -> StoreResult<WrittenMemory> {
        let m = &p.memory;
        let namespace = m.namespace();
        let cols = rows::semantic_columns();
        let existing: Option<MemoryRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {cols} FROM semantic_memory WHERE tenant_id = $1 AND agent_id = $2 AND namespace = $3 \
             AND content_hash = $4 AND valid_until IS NULL FOR UPDATE"
        )))
        .bind(tenant)
        .bind(&m.agent_id)
        .bind(&namespace)
        .bind(&p.content_hash)
        .fetch_optional(&mut **tx)
        .await
        .map_err(store_error)?;
        if let Some(row) = existing {
            let memory: Memory = row.try_into()?;
            if !memory.is_expired(now) {
                return Ok(WrittenMemory { memory, deduplicated: true });
            }
            // Forgotten but not yet swept: it must not swallow the new fact.
            sqlx::query("DELETE FROM semantic_memory WHERE tenant_id = $1 AND id = $2")
                .bind(tenant)
                .bind(memory.id)
                .execute(&mut **tx)
                .await
                .map_err(store_error)?;
        }

        let mut supersedes = None;
        if let (Some(subject), Some(predicate)) = (&m.subject, &m.predicate) {
            let retired: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
                "UPDATE semantic_memory SET valid_until = $7, updated_at = $7 \
                 WHERE tenant_id = $1 AND agent_id = $2 AND namespace = $3 AND subject = $4 AND predicate = $5 \
                 AND valid_until IS NULL AND confidence <= $6 RETURNING id, created_at",
            )
            .bind(tenant)
            .bind(&m.agent_id)
            .bind(&namespace)
            .bind(subject)
            .bind(predicate)
            .bind(m.confidence.unwrap_or(0.7))
            .bind(now)
            .fetch_all(&mut **tx)
            .await
            .map_err(store_error)?;
            supersedes = retired.into_iter().max_by_key(|(_, created)| *created).map(|(id, _)| id);
        }

        let (vector, model) = vector_of(p.embedding.as_ref());
        let inserted: Option<MemoryRow> = sqlx::query_as(AssertSqlSafe(format!(
            "INSERT INTO semantic_memory (id, tenant_id, agent_id, user_id, session_id, namespace, content, content_hash, \
                 subject, predicate, object, confidence, source_episode_id, supersedes, valid_from, importance, embedding, \
                 embedding_model, retention, private, metadata, occurred_at, created_at, updated_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, \
                 $22, $23, $23, $24) \
             ON CONFLICT (tenant_id, agent_id, namespace, content_hash) WHERE valid_until IS NULL DO NOTHING \
             RETURNING {cols}"
        )))
        .bind(m.id)
        .bind(tenant)
        .bind(&m.agent_id)
        .bind(&m.user_id)
        .bind(&m.session_id)
        .bind(&namespace)
        .bind(&m.content)
        .bind(&p.content_hash)
        .bind(&m.subject)
        .bind(&m.predicate)
        .bind(&m.object)
        .bind(m.confidence.unwrap_or(0.7))
        .bind(m.source_episode_id)
        .bind(supersedes)
        .bind(m.occurred_at.unwrap_or(now))
        .bind(m.importance)
        .bind(vector)
        .bind(model)
        .bind(m.retention.as_str())
        .bind(m.private)
        .bind(sqlx::types::Json(&m.metadata))
        .bind(m.occurred_at.unwrap_or(now))
        .bind(now)
        .bind(p.expires_at)
        .fetch_optional(&mut **tx)
        .await
        .map_err(store_error)?;
        match inserted {
            Some(row) => Ok(WrittenMemory { memory: row.try_into()?, deduplicated: false }),
            None => {
                // A concurrent writer committed the same fact first.
                let row: MemoryRow = sqlx::query_as(AssertSqlSafe(format!(
                    "SELECT {cols} FROM semantic_memory WHERE tenant_id = $1 AND agent_id = $2 AND namespace = $3 \
                     AND content_hash = $4 AND valid_until IS NULL"
                )))
                .bind(tenant)
                .bind(&m.agent_id)
                .bind(&namespace)
                .bind(&p.content_hash)
                .fetch_one(&mut **tx)
                .await
                .map_err(store_error)?;
                Ok(WrittenMemory { memory: row.try_into()?, deduplicated: true })
            }
        }
    }

    /// Inserts a skill or updates the agent's skill of the same name: new
    /// text replaces the old, given fields replace theirs, an outcome moves
    /// the counters, a reward moves the running mean, the version increments.
    async fn upsert_procedural(
        &self,
        tx: &mut Tx<'_>,
        tenant: &str,
        p: &PreparedMemory,
        now: DateTime<Utc>,
    ) -> StoreResult<Memory> {
        let m = &p.memory;
        let (vector, model) = vector_of(p.embedding.as_ref());
        let (success, failure) = match m.outcome {
            Some(Outcome::Success) => (1, 0),
            Some(Outcome::Failure) => (0, 1),
            _ => (0, 0),
        };
        let sql = format!(
            "INSERT INTO procedural_memory AS p (id, tenant_id, agent_id, user_id, session_id, skill_name, content, \
                 content_hash, trigger_pattern, policy, tool_sequence, success_count, failure_count, reward_count, \
                 avg_reward, importance, embedding, embedding_model, retention, private, metadata, occurred_at, \
                 created_at, updated_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, \
                 $22, $23, $23, $24) \
             ON CONFLICT (tenant_id, agent_id, skill_name) DO UPDATE SET \
                 user_id = coalesce(EXCLUDED.user_id, p.user_id), \
                 session_id = coalesce(EXCLUDED.session_id, p.session_id), \
                 content = EXCLUDED.content, content_hash = EXCLUDED.content_hash, \
                 trigger_pattern = coalesce(EXCLUDED.trigger_pattern, p.trigger_pattern), \
                 policy = coalesce(EXCLUDED.policy, p.policy), \
                 tool_sequence = coalesce(EXCLUDED.tool_sequence, p.tool_sequence), \
                 success_count = p.success_count + EXCLUDED.success_count, \
                 failure_count = p.failure_count + EXCLUDED.failure_count, \
                 avg_reward = CASE WHEN EXCLUDED.reward_count = 0 THEN p.avg_reward \
                     ELSE (p.avg_reward * p.reward_count + EXCLUDED.avg_reward) / (p.reward_count + 1) END, \
                 reward_count = p.reward_count + EXCLUDED.reward_count, \
                 importance = EXCLUDED.importance, \
                 embedding = EXCLUDED.embedding, embedding_model = EXCLUDED.embedding_model, \
                 retention = EXCLUDED.retention, private = EXCLUDED.private, \
                 metadata = p.metadata || EXCLUDED.metadata, \
                 occurred_at = EXCLUDED.occurred_at, updated_at = EXCLUDED.updated_at, \
                 expires_at = EXCLUDED.expires_at, version = p.version + 1 \
             RETURNING {}",
            rows::procedural_columns()
        );
        let row: MemoryRow = sqlx::query_as(AssertSqlSafe(sql))
            .bind(m.id)
            .bind(tenant)
            .bind(&m.agent_id)
            .bind(&m.user_id)
            .bind(&m.session_id)
            .bind(&m.skill_name)
            .bind(&m.content)
            .bind(&p.content_hash)
            .bind(&m.trigger_pattern)
            .bind(&m.policy)
            .bind(&m.tool_sequence)
            .bind(success)
            .bind(failure)
            .bind(i32::from(m.reward.is_some()))
            .bind(m.reward.unwrap_or(0.0))
            .bind(m.importance)
            .bind(vector)
            .bind(model)
            .bind(m.retention.as_str())
            .bind(m.private)
            .bind(sqlx::types::Json(&m.metadata))
            .bind(m.occurred_at.unwrap_or(now))
            .bind(now)
            .bind(p.expires_at)
            .fetch_one(&mut **tx)
            .await
            .map_err(store_error)?;
        row.try_into()
    }

    async fn find(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Option<Memory>> {
        let sql = format!(
            "SELECT {e} FROM episodic_memory WHERE tenant_id = $1 AND id = $2 AND {live} \
             UNION ALL SELECT {s} FROM semantic_memory WHERE tenant_id = $1 AND id = $2 AND {live} \
             UNION ALL SELECT {p} FROM procedural_memory WHERE tenant_id = $1 AND id = $2 AND {live}",
            e = rows::episodic_columns(),
            s = rows::semantic_columns(),
            p = rows::procedural_columns(),
            live = live(3),
        );
        let row: Option<MemoryRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant)
            .bind(id)
            .bind(now)
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        row.map(Memory::try_from).transpose()
    }
}

fn push_list_branch(qb: &mut QueryBuilder<Postgres>, tenant: &str, tier: Tier, f: &ListFilter, now: DateTime<Utc>) {
    qb.push(format!("(SELECT {} FROM {} WHERE tenant_id = ", rows::columns(tier), rows::table(tier)));
    qb.push_bind(tenant.to_string());
    qb.push(" AND (expires_at IS NULL OR expires_at > ").push_bind(now).push(")");
    if let Some(a) = &f.agent_id {
        qb.push(" AND agent_id = ").push_bind(a.clone());
    }
    if let Some(u) = &f.user_id {
        qb.push(" AND user_id = ").push_bind(u.clone());
    }
    if let Some(s) = &f.session_id {
        qb.push(" AND session_id = ").push_bind(s.clone());
    }
    if let Some(t) = f.created_after {
        qb.push(" AND created_at >= ").push_bind(t);
    }
    if let Some(t) = f.created_before {
        qb.push(" AND created_at < ").push_bind(t);
    }
    if let Some(c) = f.after {
        qb.push(" AND (created_at, id) < (").push_bind(c.created_at).push(", ").push_bind(c.id).push(")");
    }
    for (k, v) in &f.metadata {
        qb.push(" AND metadata ->> ").push_bind(k.clone()).push(" = ").push_bind(v.clone());
    }
    if tier == Tier::Semantic && !f.include_superseded {
        qb.push(" AND valid_until IS NULL");
    }
    qb.push(" ORDER BY created_at DESC, id DESC LIMIT ").push_bind((f.limit + 1) as i64).push(")");
}

#[async_trait]
impl MemoryStore for PgStore {
    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map_err(store_error)?;
        Ok(())
    }

    async fn idempotent_response(
        &self,
        tenant: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>> {
        let row: Option<(String, i16, Value, DateTime<Utc>)> = sqlx::query_as(
            "SELECT request_hash, status, response, created_at FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 \
             AND status <> 0",
        )
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(row
            .filter(|(_, _, _, created)| *created > now - self.idempotency_ttl)
            .map(|(request_hash, status, body, _)| StoredResponse { request_hash, status: status as u16, body }))
    }

    async fn write(
        &self,
        tenant: &str,
        items: &[PreparedMemory],
        idempotency: Option<&IdempotencyKey>,
        render: RenderResponse<'_>,
        now: DateTime<Utc>,
    ) -> StoreResult<WriteOutcome> {
        let started = Instant::now();
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        if let Some(key) = idempotency
            && let Some(previous) = self.claim_key(&mut tx, tenant, key, now).await?
        {
            tx.rollback().await.map_err(store_error)?;
            return Ok(WriteOutcome::Replayed(previous));
        }
        let mut written = Vec::with_capacity(items.len());
        for p in items {
            let w = match p.memory.tier {
                Tier::Episodic => {
                    WrittenMemory { memory: self.insert_episodic(&mut tx, tenant, p, now).await?, deduplicated: false }
                }
                Tier::Semantic => self.insert_semantic(&mut tx, tenant, p, now).await?,
                Tier::Procedural => WrittenMemory {
                    memory: self.upsert_procedural(&mut tx, tenant, p, now).await?,
                    deduplicated: false,
                },
                Tier::Working => {
                    return Err(StoreError::Internal(anyhow::anyhow!("working memory sent to the persistent store")));
                }
            };
            written.push(w);
        }
        if let Some(key) = idempotency {
            sqlx::query("UPDATE idempotency_keys SET status = 201, response = $3, updated_at = $4 WHERE tenant_id = $1 AND key = $2")
                .bind(tenant)
                .bind(&key.key)
                .bind(render(&written))
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        observe("write", started);
        Ok(WriteOutcome::Written(written))
    }

    async fn get(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Memory> {
        let started = Instant::now();
        let found = self.find(tenant, id, now).await?;
        observe("get", started);
        found.ok_or(StoreError::NotFound)
    }

    async fn list(&self, tenant: &str, filter: &ListFilter, now: DateTime<Utc>) -> StoreResult<Vec<Memory>> {
        let started = Instant::now();
        let tiers: Vec<Tier> =
            [Tier::Episodic, Tier::Semantic, Tier::Procedural].into_iter().filter(|t| filter.wants(*t)).collect();
        if tiers.is_empty() {
            return Ok(Vec::new());
        }
        let mut qb = QueryBuilder::new("SELECT * FROM (");
        for (i, tier) in tiers.iter().enumerate() {
            if i > 0 {
                qb.push(" UNION ALL ");
            }
            push_list_branch(&mut qb, tenant, *tier, filter, now);
        }
        qb.push(") AS m ORDER BY created_at DESC, id DESC LIMIT ").push_bind((filter.limit + 1) as i64);
        let rows: Vec<MemoryRow> = qb.build_query_as().fetch_all(&self.pool).await.map_err(store_error)?;
        observe("list", started);
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn update(
        &self,
        tenant: &str,
        id: Uuid,
        patch: &MemoryPatch,
        embedding: Option<&Embedding>,
        now: DateTime<Utc>,
    ) -> StoreResult<Memory> {
        let started = Instant::now();
        let current = self.find(tenant, id, now).await?.ok_or(StoreError::NotFound)?;
        let table = rows::table(current.tier);
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        // Lock the row and re-read its metadata so concurrent patches merge.
        let locked: Option<sqlx::types::Json<serde_json::Map<String, Value>>> = sqlx::query_scalar(AssertSqlSafe(
            format!("SELECT metadata FROM {table} WHERE tenant_id = $1 AND id = $2 FOR UPDATE"),
        ))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(store_error)?;
        let Some(sqlx::types::Json(mut metadata)) = locked else { return Err(StoreError::NotFound) };
        if let Some(p) = &patch.metadata {
            merge_metadata(&mut metadata, p);
        }
        let retention = patch.retention.unwrap_or(current.retention);
        let mut qb = QueryBuilder::new(format!("UPDATE {table} SET updated_at = "));
        qb.push_bind(now);
        qb.push(", metadata = ").push_bind(sqlx::types::Json(metadata));
        if let Some(importance) = patch.importance {
            qb.push(", importance = ").push_bind(importance);
        }
        if patch.retention.is_some() {
            qb.push(", retention = ").push_bind(retention.as_str());
            qb.push(", expires_at = ").push_bind(self.retention.expires_at(retention, current.created_at));
        }
        if let Some(content) = &patch.content {
            let (vector, model) = vector_of(embedding);
            qb.push(", content = ").push_bind(content.clone());
            qb.push(", content_hash = ").push_bind(crate::domain::content::content_hash(content));
            qb.push(", embedding = ").push_bind(vector);
            qb.push(", embedding_model = ").push_bind(model);
        }
        qb.push(" WHERE tenant_id = ").push_bind(tenant.to_string());
        qb.push(" AND id = ").push_bind(id);
        qb.push(format!(" RETURNING {}", rows::columns(current.tier)));
        let row: MemoryRow = qb.build_query_as().fetch_one(&mut *tx).await.map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        observe("update", started);
        row.try_into()
    }

    async fn delete(&self, tenant: &str, id: Uuid) -> StoreResult<Tier> {
        let started = Instant::now();
        let tier: Option<String> = sqlx::query_scalar(
            "WITH e AS (DELETE FROM episodic_memory WHERE tenant_id = $1 AND id = $2 RETURNING 'episodic'::text AS tier), \
                  s AS (DELETE FROM semantic_memory WHERE tenant_id = $1 AND id = $2 RETURNING 'semantic'::text AS tier), \
                  p AS (DELETE FROM procedural_memory WHERE tenant_id = $1 AND id = $2 RETURNING 'procedural'::text AS tier) \
             SELECT tier FROM e UNION ALL SELECT tier FROM s UNION ALL SELECT tier FROM p",
        )
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_error)?;
        observe("delete", started);
        tier.as_deref().and_then(Tier::parse).ok_or(StoreError::NotFound)
    }

    async fn history(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Vec<Memory>> {
        let current = self.find(tenant, id, now).await?;
        let current = match current {
            Some(m) if m.tier == Tier::Semantic => m,
            Some(m) => return Ok(vec![m]),
            // A superseded fact is still found here (find() keeps them).
            None => return Err(StoreError::NotFound),
        };
        // Walk back through `supersedes` and forward through the rows that
        // supersede this one; depth orders the chain oldest first.
        let sql = format!(
            "WITH RECURSIVE back(id, supersedes, depth) AS ( \
                 SELECT id, supersedes, 0 FROM semantic_memory WHERE tenant_id = $1 AND id = $2 \
                 UNION ALL SELECT s.id, s.supersedes, b.depth - 1 FROM semantic_memory s JOIN back b \
                     ON s.id = b.supersedes WHERE s.tenant_id = $1 AND b.depth > -10000), \
             fwd(id, depth) AS ( \
                 SELECT id, 0 FROM semantic_memory WHERE tenant_id = $1 AND id = $2 \
                 UNION ALL SELECT s.id, f.depth + 1 FROM semantic_memory s JOIN fwd f \
                     ON s.supersedes = f.id WHERE s.tenant_id = $1 AND f.depth < 10000), \
             chain AS (SELECT id, depth FROM back UNION SELECT id, depth FROM fwd) \
             SELECT {} FROM semantic_memory m JOIN chain c ON c.id = m.id \
             WHERE m.tenant_id = $1 AND (m.expires_at IS NULL OR m.expires_at > $3) ORDER BY c.depth",
            rows::semantic_columns().replace("'semantic'::text AS tier, id,", "'semantic'::text AS tier, m.id,")
        );
        let rows: Vec<MemoryRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant)
            .bind(current.id)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn search_embedding(
        &self,
        tenant: &str,
        query: &SearchQuery,
        vector: PendingVector,
        now: DateTime<Utc>,
    ) -> StoreResult<SearchHits> {
        // Both legs need the vector here: the text leg computes its rows'
        // cosine in the same statement.
        let query = SearchQuery { vector: vector.await, ..query.clone() };
        self.search_legs(tenant, &query, now).await
    }

    async fn neighbours(
        &self,
        tenant: &str,
        query: &SearchQuery,
        anchors: &[Uuid],
        known: &std::collections::HashSet<Uuid>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Adjacent>> {
        self.adjacent(tenant, query, anchors, known, now).await
    }

    async fn record_access(
        &self,
        tenant: &str,
        hits: &[(Tier, Uuid)],
        now: DateTime<Utc>,
        counted_after: DateTime<Utc>,
    ) -> StoreResult<()> {
        self.bump_access(tenant, hits, now, counted_after).await
    }
}
