//! The memory service: what a request means, independent of HTTP. It decides
//! tiers, embeds, and coordinates working memory (Redis) with the persistent
//! store: a batch's persistent part commits first with its working entries
//! in an outbox, working memory is written after, and a batch is
//! acknowledged only once both are done (`write`).

use std::sync::Arc;

use chrono::{DateTime, Utc};

use serde_json::Value;
use uuid::Uuid;

use crate::clock::Clock;
use crate::domain::classify::Classifier;
use crate::domain::draft::Draft;
use crate::domain::validate::FieldError;
use crate::domain::{Memory, MemoryPatch, NewMemory, Retention, RetentionPolicy, Tier, WrittenMemory};
use crate::embed::{EmbedError, Embedder};
use crate::store::{
    Embedding, IdempotencyKey, ListFilter, MemoryStore, PreparedMemory, SkillCache, StoreError, StoredResponse,
    WorkingMemory, WriteOutcome,
};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Invalid(#[from] FieldError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Embedding(#[from] EmbedError),
    #[error("the idempotency key was used with another request")]
    IdempotencyKeyReused,
}

pub type ServiceResult<T> = Result<T, ServiceError>;

/// What a write produced: fresh results, or the remembered response of an
/// earlier request with the same idempotency key.
pub enum Written {
    Fresh(Vec<WrittenMemory>),
    Replayed { status: u16, body: Value },
}

/// A page of a listing and what it left out.
pub struct Listing {
    /// Newest first; one more than the limit when there are more.
    pub memories: Vec<Memory>,
    /// `WORKING_MEMORY_UNAVAILABLE` when the session's working memory could
    /// not be read and the page holds the persistent tiers only.
    pub warnings: Vec<String>,
}

pub struct MemoryService {
    /// Episodic, semantic and procedural tiers.
    pub store: Arc<dyn MemoryStore>,
    /// Working memory (sessions).
    pub working: Arc<dyn WorkingMemory>,
    /// Cache of procedural skills read by id.
    pub skills: Arc<dyn SkillCache>,
    /// Gives persistent memories their vectors; None stores none.
    pub embedder: Option<Arc<dyn Embedder>>,
    /// Decides tier and importance when the writer did not.
    pub classifier: Arc<dyn Classifier>,
    pub clock: Arc<dyn Clock>,
    /// Per-agent scoring weights from the configuration.
    pub agent_weights: std::collections::BTreeMap<String, crate::domain::scoring::Weights>,
    /// Recalled memories at least this alike (cosine) count as one.
    pub dedup_cosine: f64,
    /// Share of relevance from the vector leg when both legs ran.
    pub vector_share: f64,
    /// Share of the better neighbouring episode's relevance added to an episode's.
    pub neighbour_share: f64,
    /// Relevance added to a memory whose speaker the query names.
    pub speaker_share: f64,
    /// Relevance added to a memory within a date the query names.
    pub date_share: f64,
    /// Persistent relevance spread from the median candidate's to the best's.
    pub relative_relevance: bool,
    /// Candidates scored before context packing.
    pub context_candidates: usize,
    /// Counts accesses off the request path; None counts nothing.
    pub access: Option<crate::recall::AccessRecorder>,
    /// Which fact predicates hold several values (`facts.multi_valued_predicates`).
    pub cardinality: crate::domain::facts::Cardinality,
    /// How long each retention keeps a memory (the expiry of writes and of
    /// patches that change the retention).
    pub retention: RetentionPolicy,
    /// Erasures accepted and not finished: their working-memory entries and
    /// cached skills are not returned while the worker deletes them.
    pub erasing: Arc<crate::domain::erasure::Erasing>,
}

/// The body of a write response, in request order, as remembered for an
/// idempotency key: the HTTP response's own JSON (`http::response`), so that
/// a replay answers exactly what the first request did.
pub fn write_body(items: &[WrittenMemory]) -> Value {
    crate::http::response::write_body(items)
}

/// A memory another agent shared, for `MemoryService::write_copies`.
pub struct Copy {
    pub draft: Draft,
    pub provenance: crate::domain::share::Provenance,
    /// When the source expires: the copy expires then at the latest.
    pub source_expires_at: Option<DateTime<Utc>>,
}

impl MemoryService {
    /// Embeds texts a tenant writes (the write lane of the embedder's queue).
    async fn embed_one_each(&self, tenant: &str, texts: Vec<String>) -> ServiceResult<Vec<Option<Embedding>>> {
        let Some(embedder) = &self.embedder else { return Ok(vec![None; texts.len()]) };
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let vectors = embedder.embed_in(&texts, crate::embed::Lane::Write { tenant }).await?;
        Ok(vectors
            .into_iter()
            .map(|vector| Some(Embedding { model: embedder.model_id().to_string(), vector }))
            .collect())
    }

    /// Classifies drafts that need it, then checks each against its tier.
    /// `pointer(i)` names draft i in errors.
    async fn finish(
        &self,
        drafts: Vec<Draft>,
        pointer: &(dyn Fn(usize) -> String + Sync),
    ) -> ServiceResult<Vec<NewMemory>> {
        let mut out = Vec::with_capacity(drafts.len());
        for (i, draft) in drafts.into_iter().enumerate() {
            let input = draft.classify_input();
            let tier = match draft.tier {
                Some(t) => t,
                None => self.classifier.tier(&input).await,
            };
            let importance = match draft.importance {
                Some(i) => i,
                None => self.classifier.importance(tier, &input).await,
            };
            out.push(draft.finish(&pointer(i), tier, importance)?);
        }
        Ok(out)
    }

    /// Writes a batch: the persistent memories, the idempotency record and
    /// the working-memory entries (in the outbox) in one transaction, then
    /// the entries to working memory. A crash between the two leaves the
    /// entries in the outbox: a retry with the same key writes them before
    /// it replays the response, and the outbox job writes what is left
    /// (`complete_staged`), so a batch is never half-written for good and a
    /// retry never duplicates it. A working-only batch without a key has no
    /// persistent half and goes to working memory directly.
    pub async fn write(
        &self,
        tenant: &str,
        drafts: Vec<Draft>,
        pointer: &(dyn Fn(usize) -> String + Sync),
        idempotency: Option<IdempotencyKey>,
    ) -> ServiceResult<Written> {
        let now = self.clock.now();
        if let Some(key) = &idempotency
            && let Some(previous) = self.store.idempotent_response(tenant, &key.key, now).await?
        {
            return self.replay(tenant, previous, key).await;
        }
        let memories = self.finish(drafts, pointer).await?;

        let (persistent_idx, working_idx): (Vec<usize>, Vec<usize>) =
            (0..memories.len()).partition(|&i| memories[i].tier != Tier::Working);
        if !working_idx.is_empty() {
            // Refused before anything commits while working memory is known down.
            self.working.available()?;
        }
        let texts = persistent_idx.iter().map(|&i| memories[i].content.clone()).collect();
        let embeddings = self.embed_one_each(tenant, texts).await?;
        let prepared: Vec<PreparedMemory> = persistent_idx
            .iter()
            .zip(embeddings)
            .map(|(&i, embedding)| self.prepare(&memories[i], embedding))
            .collect();
        let working: Vec<Memory> = working_idx
            .iter()
            .map(|&i| {
                let m = &memories[i];
                let expires_at = self.retention.expires_at(m.retention, now);
                crate::domain::rows::new_row(m, now, expires_at, crate::domain::facts::Source::Agent)
            })
            .collect();

        let order = |persistent: &[WrittenMemory]| -> Vec<WrittenMemory> {
            let mut slots: Vec<Option<WrittenMemory>> = vec![None; memories.len()];
            for (&i, w) in persistent_idx.iter().zip(persistent) {
                slots[i] = Some(w.clone());
            }
            for (&i, m) in working_idx.iter().zip(&working) {
                slots[i] = Some(WrittenMemory { memory: m.clone(), deduplicated: false });
            }
            slots.into_iter().flatten().collect()
        };
        let render = |persistent: &[WrittenMemory]| write_body(&order(persistent));

        if prepared.is_empty() && idempotency.is_none() {
            self.working.append(tenant, &working, now).await?;
            return Ok(Written::Fresh(order(&[])));
        }
        let outcome = self.store.write_staging(tenant, &prepared, &working, idempotency.as_ref(), &render, now).await?;
        match outcome {
            WriteOutcome::Written(persistent) => {
                for w in persistent.iter().filter(|w| w.memory.tier == Tier::Procedural) {
                    self.evict_skill(tenant, w.memory.id).await;
                }
                let written = order(&persistent);
                if !working.is_empty() {
                    self.append_staged(tenant, working.clone(), now).await?;
                }
                Ok(Written::Fresh(written))
            }
            WriteOutcome::Replayed(previous) => {
                self.replay(tenant, previous, idempotency.as_ref().expect("replay implies a key")).await
            }
        }
    }

    /// A validated memory as the store writes it: its lifetime and the
    /// cardinality of its predicate from the configuration.
    fn prepare(&self, m: &NewMemory, embedding: Option<Embedding>) -> PreparedMemory {
        PreparedMemory {
            lifetime: self.retention.duration(m.retention),
            multi_valued: m.predicate.as_deref().is_some_and(|p| self.cardinality.is_multi_valued(p)),
            ..PreparedMemory::new(m.clone(), embedding)
        }
    }

    /// Writes copies another agent shared, each with its provenance, in one
    /// transaction: the ordinary write path (dedup, the contradiction rule)
    /// with the trust of a shared memory, so a copy never silently replaces
    /// what the target holds (`domain::share`). Persistent tiers only.
    pub async fn write_copies(
        &self,
        tenant: &str,
        copies: Vec<Copy>,
        pointer: &(dyn Fn(usize) -> String + Sync),
    ) -> ServiceResult<Vec<WrittenMemory>> {
        let now = self.clock.now();
        let (drafts, provenances): (Vec<Draft>, Vec<_>) =
            copies.into_iter().map(|c| (c.draft, (c.provenance, c.source_expires_at))).unzip();
        let memories = self.finish(drafts, pointer).await?;
        let texts = memories.iter().map(|m| m.content.clone()).collect();
        let embeddings = self.embed_one_each(tenant, texts).await?;
        let prepared: Vec<PreparedMemory> = memories
            .iter()
            .zip(embeddings)
            .zip(provenances)
            .map(|((m, embedding), (provenance, source_expires_at))| {
                let prepared = self.prepare(m, embedding);
                PreparedMemory {
                    source: crate::domain::facts::Source::Shared,
                    provenance: Some(provenance),
                    lifetime: crate::domain::share::copy_lifetime(prepared.lifetime, source_expires_at, now),
                    ..prepared
                }
            })
            .collect();
        let render = |written: &[WrittenMemory]| write_body(written);
        match self.store.write_staging(tenant, &prepared, &[], None, &render, now).await? {
            WriteOutcome::Written(written) => {
                for w in written.iter().filter(|w| w.memory.tier == Tier::Procedural) {
                    self.evict_skill(tenant, w.memory.id).await;
                }
                Ok(written)
            }
            WriteOutcome::Replayed(_) => {
                Err(StoreError::Internal(anyhow::anyhow!("a write without an idempotency key was replayed")).into())
            }
        }
    }

    /// Writes what consolidation made of a group (summaries, facts) by the
    /// ordinary rules, with the trust of consolidation, and in the same
    /// transaction marks its episodes consolidated, counts the outcomes they
    /// report for skills and hands them on as `group.policy` says
    /// (`write::write_consolidated`). A new fact of a multi-valued predicate
    /// that nearly repeats a current one (objects at least `merge_cosine`
    /// alike) is settled against it by the contradiction rule.
    pub async fn write_consolidated(
        &self,
        tenant: &str,
        drafts: Vec<Draft>,
        group: &crate::store::write::GroupEffects<'_>,
        merge_cosine: f64,
    ) -> ServiceResult<crate::store::write::Consolidated> {
        let now = self.clock.now();
        // A derived record the write rules refuse (a field too long, say)
        // is left out, not allowed to stop its group forever.
        let mut memories = Vec::with_capacity(drafts.len());
        for draft in drafts {
            match self.finish(vec![draft], &|_| String::new()).await {
                Ok(mut m) => memories.append(&mut m),
                Err(ServiceError::Invalid(e)) => {
                    tracing::warn!(field = %e.field, message = %e.message, "a consolidated record was left out")
                }
                Err(e) => return Err(e),
            }
        }
        let texts = memories.iter().map(|m| m.content.clone()).collect();
        let embeddings = self.embed_one_each(tenant, texts).await?;
        let mut prepared: Vec<PreparedMemory> = memories
            .iter()
            .zip(embeddings)
            .map(|(m, embedding)| PreparedMemory {
                source: crate::domain::facts::Source::Consolidated,
                ..self.prepare(m, embedding)
            })
            .collect();
        for p in prepared.iter_mut() {
            p.near_duplicates = self.near_duplicates(tenant, p, merge_cosine).await?;
        }
        let tx = self.store.begin().await?;
        let done = crate::store::write::write_consolidated(tx, tenant, &prepared, group, now).await?;
        for id in &done.skills {
            self.evict_skill(tenant, *id).await;
        }
        Ok(done)
    }

    /// The current facts of a new fact's subject and predicate (a
    /// multi-valued one) whose objects are at least `threshold` alike to
    /// its object, by the embedder; none without one. Read before the write
    /// transaction (embedding inside it would hold its locks); the write
    /// checks they are still current.
    async fn near_duplicates(&self, tenant: &str, p: &PreparedMemory, threshold: f64) -> ServiceResult<Vec<Uuid>> {
        let m = &p.memory;
        let (Some(subject), Some(predicate), Some(object)) = (&m.subject, &m.predicate, &m.object) else {
            return Ok(Vec::new());
        };
        if !p.multi_valued || self.embedder.is_none() || threshold > 1.0 {
            return Ok(Vec::new());
        }
        let namespace = m.namespace();
        let slot = crate::store::write::Slot { agent_id: &m.agent_id, namespace: &namespace, subject, predicate };
        let now = self.clock.now();
        let others: Vec<Memory> = {
            let mut tx = self.store.begin().await?;
            tx.slot_facts(tenant, &slot, None).await?
        }
        .into_iter()
        .filter(|f| !f.is_expired(now) && f.object.as_deref().is_some_and(|o| o != object))
        .collect();
        if others.is_empty() {
            return Ok(Vec::new());
        }
        let mut texts = vec![object.clone()];
        texts.extend(others.iter().map(|f| f.object.clone().unwrap_or_default()));
        let mut vectors = self.embed_one_each(tenant, texts).await?.into_iter().map(|e| e.map(|e| e.vector));
        let Some(Some(new)) = vectors.next() else { return Ok(Vec::new()) };
        let others: Vec<(Uuid, Vec<f32>)> =
            others.iter().zip(vectors).filter_map(|(f, v)| v.map(|v| (f.id, v))).collect();
        Ok(crate::domain::consolidate::near_duplicates(&new, &others, threshold))
    }

    /// Writes committed entries to working memory and takes them out of the
    /// outbox, in a task of its own: a request dropped meanwhile (a timeout,
    /// a client gone) does not stop it halfway.
    async fn append_staged(&self, tenant: &str, entries: Vec<Memory>, now: DateTime<Utc>) -> ServiceResult<()> {
        let (working, store, tenant) = (self.working.clone(), self.store.clone(), tenant.to_string());
        let task = tokio::spawn(async move {
            working.append(&tenant, &entries, now).await?;
            let ids: Vec<Uuid> = entries.iter().map(|m| m.id).collect();
            store.unstage_working(&tenant, &ids).await
        });
        task.await.map_err(|e| StoreError::Internal(anyhow::Error::new(e).context("the working-memory task")))??;
        Ok(())
    }

    /// The remembered response of a key, once the working-memory entries of
    /// its batch a crash left in the outbox are written.
    async fn replay(&self, tenant: &str, previous: StoredResponse, key: &IdempotencyKey) -> ServiceResult<Written> {
        if previous.request_hash != key.request_hash {
            return Err(ServiceError::IdempotencyKeyReused);
        }
        let staged = self.store.staged_working(Some((tenant, &key.key)), self.clock.now(), usize::MAX >> 1).await?;
        if !staged.is_empty() {
            let entries = staged.into_iter().map(|s| s.memory).collect();
            self.append_staged(tenant, entries, self.clock.now()).await?;
        }
        Ok(Written::Replayed { status: previous.status, body: previous.body })
    }

    /// Writes to working memory up to `limit` outbox entries staged at or
    /// before `staged_before` (batches whose request crashed or failed
    /// after the commit); returns how many. Entries already expired are
    /// only taken out.
    pub async fn complete_staged(&self, staged_before: DateTime<Utc>, limit: usize) -> ServiceResult<usize> {
        let now = self.clock.now();
        let staged = self.store.staged_working(None, staged_before, limit).await?;
        let count = staged.len();
        let mut by_tenant: std::collections::BTreeMap<String, Vec<Memory>> = Default::default();
        for s in staged {
            by_tenant.entry(s.tenant).or_default().push(s.memory);
        }
        for (tenant, entries) in by_tenant {
            let (live, expired): (Vec<Memory>, Vec<Memory>) = entries.into_iter().partition(|m| !m.is_expired(now));
            if !live.is_empty() {
                self.append_staged(&tenant, live, now).await?;
            }
            let gone: Vec<Uuid> = expired.iter().map(|m| m.id).collect();
            self.store.unstage_working(&tenant, &gone).await?;
        }
        Ok(count)
    }

    /// Evicts from the skill cache, again, up to `limit` skills that writes
    /// changed or deleted (`WriteTx::stage_eviction`) and takes their rows
    /// out; returns how many rows. A row read here was committed before the
    /// eviction, so the eviction covers it; a write committed meanwhile adds
    /// its own row. Stops at the first failed eviction (Redis still away):
    /// the rest stay for the next run.
    pub async fn complete_evictions(&self, limit: usize) -> ServiceResult<usize> {
        let staged = self.store.staged_evictions(limit).await?;
        let mut done = Vec::with_capacity(staged.len());
        let mut failed = None;
        for row in &staged {
            match self.skills.evict(&row.tenant_id, row.id).await {
                Ok(()) => done.push(row.eviction_id),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        self.store.unstage_evictions(&done).await?;
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(done.len()),
        }
    }

    async fn evict_skill(&self, tenant: &str, id: Uuid) {
        if let Err(e) = self.skills.evict(tenant, id).await {
            tracing::warn!(error = %e, %id, "could not evict a cached skill");
        }
    }

    /// Finds a memory in working memory, the skill cache, then the store.
    pub async fn get(&self, tenant: &str, id: Uuid) -> ServiceResult<Memory> {
        self.find(tenant, id, false).await
    }

    /// `get`, with the persistent tiers read as the primary holds them now
    /// (`MemoryStore::get_current`): for a write made from what it reads.
    pub async fn get_current(&self, tenant: &str, id: Uuid) -> ServiceResult<Memory> {
        self.find(tenant, id, true).await
    }

    async fn find(&self, tenant: &str, id: Uuid, current: bool) -> ServiceResult<Memory> {
        let now = self.clock.now();
        let redis_error = match self.working.get(tenant, id).await {
            Ok(Some(m)) if self.erasing.hides(tenant, &m) => return Err(StoreError::NotFound.into()),
            Ok(Some(m)) => return Ok(m),
            Ok(None) => None,
            Err(e) => Some(e),
        };
        if redis_error.is_none()
            && let Ok(Some(m)) = self.skills.get(tenant, id).await
            && !m.is_expired(now)
            && !self.erasing.hides(tenant, &m)
        {
            return Ok(m);
        }
        let found = match current {
            true => self.store.get_current(tenant, id, now).await,
            false => self.store.get(tenant, id, now).await,
        };
        match found {
            Ok(m) => {
                if m.tier == Tier::Procedural
                    && redis_error.is_none()
                    && let Err(e) = self.skills.put(tenant, &m).await
                {
                    tracing::warn!(error = %e, "could not cache a skill");
                }
                Ok(m)
            }
            // Not persistent, and working memory could not be asked.
            Err(StoreError::NotFound) if redis_error.is_some() => Err(redis_error.expect("checked").into()),
            Err(e) => Err(e.into()),
        }
    }

    /// Lists memories newest first; returns one more than the limit when
    /// there are more. Working memory is listed for a given session; when it
    /// cannot be read the listing goes on without it and says so, unless
    /// working memory is all that was asked for.
    pub async fn list(&self, tenant: &str, filter: &ListFilter) -> ServiceResult<Listing> {
        let now = self.clock.now();
        let mut out = self.store.list(tenant, filter, now).await?;
        let mut warnings = Vec::new();
        if filter.wants(Tier::Working)
            && let (Some(agent), Some(session)) = (&filter.agent_id, &filter.session_id)
        {
            match self.working.session(tenant, agent, session).await {
                Ok(entries) => out.extend(
                    entries
                        .into_iter()
                        .filter(|m| filter.matches(m) && !m.is_expired(now) && !self.erasing.hides(tenant, m)),
                ),
                Err(e) if filter.tiers == [Tier::Working] => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(error = %e, "listing without working memory: Redis unavailable");
                    warnings.push(crate::recall::WORKING_MEMORY_UNAVAILABLE.to_string());
                }
            }
        }
        out.sort_by_key(|m| std::cmp::Reverse((m.created_at, m.id)));
        out.truncate(filter.limit + 1);
        Ok(Listing { memories: out, warnings })
    }

    /// Every live memory of one user, all tiers (a data subject's export):
    /// the persistent tiers newest first, then the user's working-memory
    /// entries. Memories an unfinished erasure covers are left out.
    pub async fn subject_memories(&self, tenant: &str, user_id: &str) -> ServiceResult<Vec<Memory>> {
        let now = self.clock.now();
        let mut filter = ListFilter {
            user_id: Some(user_id.to_string()),
            tiers: vec![Tier::Episodic, Tier::Semantic, Tier::Procedural],
            limit: 500,
            include_superseded: true,
            ..ListFilter::default()
        };
        let mut out = Vec::new();
        loop {
            let mut page = self.store.list(tenant, &filter, now).await?;
            let more = page.len() > filter.limit;
            page.truncate(filter.limit);
            filter.after = page.last().map(|m| crate::store::Cursor { created_at: m.created_at, id: m.id });
            out.extend(page);
            if !more {
                break;
            }
        }
        let working = self.working.entries(tenant).await?;
        out.extend(
            working.into_iter().filter(|m| {
                m.user_id.as_deref() == Some(user_id) && !m.is_expired(now) && !self.erasing.hides(tenant, m)
            }),
        );
        Ok(out)
    }

    pub async fn update(&self, tenant: &str, id: Uuid, mut patch: MemoryPatch) -> ServiceResult<Memory> {
        let now = self.clock.now();
        patch.lifetime = patch.retention.and_then(|r| self.retention.duration(r));
        let redis_error = match self.working.get(tenant, id).await {
            Ok(Some(mut m)) => {
                if patch.retention == Some(Retention::Permanent) {
                    return Err(
                        FieldError::new("/retention", "working memory must expire; use long_term at most").into()
                    );
                }
                patch.apply(&mut m, now);
                self.working.replace(tenant, &m, now).await?;
                return Ok(m);
            }
            Ok(None) => None,
            Err(e) => Some(e),
        };
        let embedding = match &patch.content {
            Some(content) => self.embed_one_each(tenant, vec![content.clone()]).await?.pop().flatten(),
            None => None,
        };
        match self.store.update(tenant, id, &patch, embedding.as_ref(), now).await {
            Ok(m) => {
                if m.tier == Tier::Procedural {
                    self.evict_skill(tenant, id).await;
                }
                Ok(m)
            }
            Err(StoreError::NotFound) if redis_error.is_some() => Err(redis_error.expect("checked").into()),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn delete(&self, tenant: &str, id: Uuid) -> ServiceResult<()> {
        let redis_error = match self.working.get(tenant, id).await {
            Ok(Some(m)) => {
                self.working.remove(tenant, std::slice::from_ref(&m)).await?;
                // A crash may have left it in the outbox too: it must not come back.
                if let Err(e) = self.store.unstage_working(tenant, &[id]).await {
                    tracing::warn!(error = %e, %id, "could not take a deleted entry out of the outbox");
                }
                return Ok(());
            }
            Ok(None) => None,
            Err(e) => Some(e),
        };
        match self.store.delete(tenant, id, self.clock.now()).await {
            Ok(Tier::Procedural) => {
                self.evict_skill(tenant, id).await;
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(StoreError::NotFound) if redis_error.is_some() => Err(redis_error.expect("checked").into()),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn history(&self, tenant: &str, id: Uuid) -> ServiceResult<Vec<Memory>> {
        let now = self.clock.now();
        match self.working.get(tenant, id).await {
            Ok(Some(m)) if self.erasing.hides(tenant, &m) => return Err(StoreError::NotFound.into()),
            Ok(Some(m)) => return Ok(vec![m]),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "history without working memory: Redis unavailable"),
        }
        Ok(self.store.history(tenant, id, now).await?)
    }
}
