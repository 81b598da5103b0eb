//! Sharing memories between agents of one tenant: grants and teams (from the
//! API and the configuration), and the share itself: the access check, the
//! choice of memories, redaction, and the copies written through the
//! ordinary write path with their provenance. Revoking a grant can withdraw
//! what was shared under it, through an erasure of the copies.
//!
//! Must not: hold SQL (`store::share`) or decide what may leave an agent
//! (`domain::share`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::clock::Clock;
use crate::config::SharingConfig;
use crate::domain::Tier;
use crate::domain::WrittenMemory;
use crate::domain::erasure::{ErasureRecord, Subject};
use crate::domain::redact::Redactor;
use crate::domain::share::{self, Grant, GrantTarget, Provenance, Refusal, Teams};
use crate::jobs::erasure::Eraser;
use crate::recall::SearchParams;
use crate::service::{MemoryService, ServiceError};
use crate::store::StoreError;
use crate::store::share::{Copies, Sharing};

/// The actor the configuration's grants are made by.
pub const CONFIG_ACTOR: &str = "config";

#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// No grant lets the sender share with these agents.
    #[error("no grant lets {from} share with {}", .agents.join(", "))]
    NotGranted { from: String, agents: Vec<String> },
    #[error("no grant with this id")]
    GrantNotFound,
    /// Grants from the configuration change with the configuration only.
    #[error("this grant comes from the configuration ([[sharing.grants]]); change it there")]
    ConfiguredGrant,
    #[error(transparent)]
    Service(#[from] ServiceError),
}

impl From<StoreError> for ShareError {
    fn from(e: StoreError) -> Self {
        ShareError::Service(e.into())
    }
}

pub type ShareResult<T> = Result<T, ShareError>;

/// Whom a share goes to.
#[derive(Debug, Clone)]
pub enum Targets {
    Agents(Vec<String>),
    Team(String),
}

/// Which of the sender's memories.
#[derive(Debug, Clone)]
pub enum Selection {
    Ids(Vec<Uuid>),
    /// The sender's search: its best `top_k` persistent memories.
    Query {
        query: String,
        top_k: usize,
        user_id: Option<String>,
    },
}

#[derive(Debug, Clone)]
pub struct ShareRequest {
    pub from_agent_id: String,
    pub targets: Targets,
    pub selection: Selection,
}

/// One memory copied to one agent.
#[derive(Debug, Clone)]
pub struct SharedCopy {
    pub source_memory_id: Uuid,
    pub target_agent_id: String,
    pub grant_id: Uuid,
    /// The target's memory: the copy, or (deduplicated) what it already held.
    pub written: WrittenMemory,
    pub redactions: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default)]
pub struct ShareOutcome {
    pub shared: Vec<SharedCopy>,
    /// Memories not shared, and why; each once.
    pub refused: Vec<(Uuid, Refusal)>,
}

pub struct SharingService {
    pub memories: Arc<MemoryService>,
    pub store: Arc<dyn Sharing>,
    pub eraser: Arc<Eraser>,
    pub clock: Arc<dyn Clock>,
    pub max_memories: usize,
    /// The configuration's grants and teams, by tenant.
    config_grants: BTreeMap<String, Vec<Grant>>,
    config_teams: BTreeMap<String, Teams>,
    default_redactor: Redactor,
    redactors: BTreeMap<String, Redactor>,
}

impl SharingService {
    /// Fails on rules the configuration's validation would have refused.
    pub fn new(
        config: &SharingConfig,
        memories: Arc<MemoryService>,
        store: Arc<dyn Sharing>,
        eraser: Arc<Eraser>,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<SharingService> {
        let default_redactor =
            Redactor::new(&config.redaction).map_err(|e| anyhow::anyhow!("sharing.redaction: {e}"))?;
        let mut redactors = BTreeMap::new();
        for (tenant, t) in &config.tenants {
            let r =
                Redactor::new(&t.redaction).map_err(|e| anyhow::anyhow!("sharing.tenants.{tenant}.redaction: {e}"))?;
            redactors.insert(tenant.clone(), r);
        }
        let mut config_grants: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
        for g in &config.grants {
            let target = match (&g.to_agent_ids, &g.team) {
                (Some(agents), _) => GrantTarget::Agents(agents.clone()),
                (None, Some(team)) => GrantTarget::Team(team.clone()),
                (None, None) => anyhow::bail!("sharing.grants: a grant names neither to_agent_ids nor team"),
            };
            let id = config_grant_id(&g.tenant, &g.from_agent_id, &target);
            config_grants.entry(g.tenant.clone()).or_default().push(Grant {
                id,
                from_agent_id: g.from_agent_id.clone(),
                target,
                created_by: CONFIG_ACTOR.into(),
                created_at: DateTime::<Utc>::UNIX_EPOCH,
                revoked_at: None,
            });
        }
        let mut config_teams: BTreeMap<String, Teams> = BTreeMap::new();
        for t in &config.teams {
            config_teams
                .entry(t.tenant.clone())
                .or_default()
                .entry(t.name.clone())
                .or_default()
                .extend(t.agent_ids.iter().cloned());
        }
        Ok(SharingService {
            memories,
            store,
            eraser,
            clock,
            max_memories: config.max_memories,
            config_grants,
            config_teams,
            default_redactor,
            redactors,
        })
    }

    /// The tenant's grants: the configuration's, then those made through
    /// the API (revoked ones too).
    pub async fn grants(&self, tenant: &str) -> ShareResult<Vec<Grant>> {
        let mut all = self.config_grants.get(tenant).cloned().unwrap_or_default();
        all.extend(self.store.grants(tenant).await?);
        Ok(all)
    }

    pub async fn create_grant(
        &self,
        tenant: &str,
        actor: &str,
        from_agent_id: String,
        target: GrantTarget,
    ) -> ShareResult<Grant> {
        // Whole microseconds, as the database keeps them: the 201 and a
        // later GET show the same instant.
        let now = self.clock.now();
        let created_at = DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now);
        let grant = Grant {
            id: Uuid::now_v7(),
            from_agent_id,
            target,
            created_by: actor.to_string(),
            created_at,
            revoked_at: None,
        };
        self.store.insert_grant(tenant, &grant).await?;
        metrics::counter!("engram_share_grants_total", "change" => "granted").increment(1);
        Ok(grant)
    }

    /// Revokes a grant; with `withdraw`, first erases the copies made under
    /// it (returned: the erasure that removes them).
    pub async fn revoke_grant(
        &self,
        tenant: &str,
        actor: &str,
        id: Uuid,
        withdraw: bool,
    ) -> ShareResult<(Grant, Option<ErasureRecord>)> {
        if self.config_grants.get(tenant).is_some_and(|g| g.iter().any(|g| g.id == id)) {
            return Err(ShareError::ConfiguredGrant);
        }
        if !self.store.grants(tenant).await?.iter().any(|g| g.id == id) {
            return Err(ShareError::GrantNotFound);
        }
        let mut erasure = None;
        if withdraw {
            let now = self.clock.now();
            let copies = self.store.copies(tenant, Copies::Grant(id), now, usize::MAX >> 1).await?;
            if !copies.is_empty() {
                let ids = copies.into_iter().map(|m| m.id).collect();
                let record = self.eraser.request(tenant, actor, Subject::Memories { memory_ids: ids }).await?;
                erasure = Some(record);
            }
        }
        let grant =
            self.store.revoke_grant(tenant, id, actor, self.clock.now()).await?.ok_or(ShareError::GrantNotFound)?;
        metrics::counter!("engram_share_grants_total", "change" => "revoked").increment(1);
        Ok((grant, erasure))
    }

    /// The tenant's teams: the configuration's members and the API's.
    pub async fn teams(&self, tenant: &str) -> ShareResult<Teams> {
        let mut teams = self.store.teams(tenant).await?;
        for (name, members) in self.config_teams.get(tenant).into_iter().flatten() {
            teams.entry(name.clone()).or_default().extend(members.iter().cloned());
        }
        Ok(teams)
    }

    pub async fn set_team(&self, tenant: &str, team: &str, agents: &[String]) -> ShareResult<()> {
        Ok(self.store.set_team(tenant, team, agents).await?)
    }

    /// Copies shared into (`into`) or out of an agent, newest first.
    pub async fn copies(
        &self,
        tenant: &str,
        which: Copies<'_>,
        limit: usize,
    ) -> ShareResult<Vec<crate::domain::Memory>> {
        Ok(self.store.copies(tenant, which, self.clock.now(), limit).await?)
    }

    fn redactor(&self, tenant: &str) -> &Redactor {
        self.redactors.get(tenant).unwrap_or(&self.default_redactor)
    }

    /// Shares memories of one agent with others: every target must be
    /// granted (else nothing is shared), each memory is checked
    /// (`domain::share::refusal`), redacted once and copied to every target
    /// in one transaction.
    pub async fn share(&self, tenant: &str, actor: &str, req: ShareRequest) -> ShareResult<ShareOutcome> {
        let now = self.clock.now();
        let from = req.from_agent_id.as_str();
        // Read once: they resolve a team target and decide the grants.
        let teams = self.teams(tenant).await?;
        let targets: Vec<String> = match &req.targets {
            Targets::Agents(agents) => {
                let mut seen = BTreeSet::new();
                agents.iter().filter(|a| seen.insert(a.as_str())).cloned().collect()
            }
            Targets::Team(team) => {
                let members: Vec<String> =
                    teams.get(team).into_iter().flatten().filter(|a| a.as_str() != from).cloned().collect();
                if members.is_empty() {
                    return Err(ServiceError::Invalid(crate::domain::validate::FieldError::new(
                        "/team",
                        format!("team {team:?} has no member other than {from:?}"),
                    ))
                    .into());
                }
                members
            }
        };
        let grants = self.grants(tenant).await?;
        let mut granted: Vec<(String, Uuid)> = Vec::with_capacity(targets.len());
        let mut missing = Vec::new();
        for to in &targets {
            match share::grant_for(&grants, &teams, from, to) {
                Some(g) => granted.push((to.clone(), g.id)),
                None => missing.push(to.clone()),
            }
        }
        if !missing.is_empty() {
            metrics::counter!("engram_share_refusals_total", "reason" => "not_granted").increment(1);
            return Err(ShareError::NotGranted { from: from.to_string(), agents: missing });
        }

        let mut outcome = ShareOutcome::default();
        let chosen = match &req.selection {
            Selection::Ids(ids) => {
                let mut seen = BTreeSet::new();
                let mut found = Vec::new();
                for id in ids.iter().filter(|id| seen.insert(**id)) {
                    match self.memories.get_current(tenant, *id).await {
                        Ok(m) => found.push(m),
                        Err(ServiceError::Store(StoreError::NotFound)) => {
                            outcome.refused.push((*id, Refusal::NotFound))
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                found
            }
            Selection::Query { query, top_k, user_id } => {
                let params = SearchParams {
                    agent_id: from.to_string(),
                    user_id: user_id.clone(),
                    session_id: None,
                    query: query.clone(),
                    top_k: *top_k,
                    tiers: vec![Tier::Episodic, Tier::Semantic, Tier::Procedural],
                    weights: None,
                    metadata: Vec::new(),
                    since: None,
                    until: None,
                    min_relevance: None,
                    include_candidates: false,
                    as_of: None,
                    valid_at: None,
                };
                // Found by a search (which a read replica may serve), copied
                // as the primary holds each one now.
                let mut found = Vec::new();
                for hit in self.memories.search(tenant, &params).await?.results {
                    match self.memories.get_current(tenant, hit.memory.id).await {
                        Ok(m) => found.push(m),
                        Err(ServiceError::Store(StoreError::NotFound)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                found
            }
        };
        let redactor = self.redactor(tenant);
        let redact = |text: &str| {
            let r = redactor.redact(text);
            (r.text, r.applied.into_iter().map(|(k, n)| (k.name().to_string(), n as u64)).collect())
        };
        let mut copies = Vec::new();
        let mut sources = Vec::new();
        for m in chosen {
            if let Some(why) = share::refusal(&m, from, now) {
                metrics::counter!("engram_share_refusals_total", "reason" => why.as_str()).increment(1);
                outcome.refused.push((m.id, why));
                continue;
            }
            let (draft, redactions) = share::copy_draft(&m, from, &redact);
            for (kind, n) in &redactions {
                metrics::counter!("engram_share_redactions_total", "kind" => kind.clone()).increment(*n);
            }
            for (to, grant_id) in &granted {
                let provenance = Provenance {
                    source_agent_id: from.to_string(),
                    source_memory_id: m.id,
                    shared_by: actor.to_string(),
                    shared_at: now,
                    grant_id: *grant_id,
                    redactions: redactions.clone(),
                };
                let mut copy = draft.clone();
                copy.agent_id = to.clone();
                copies.push(crate::service::Copy { draft: copy, provenance, source_expires_at: m.expires_at });
                sources.push((m.id, to.clone(), *grant_id, redactions.clone()));
            }
        }
        if copies.is_empty() {
            return Ok(outcome);
        }
        let pointer = |i: usize| format!("/copies/{i}");
        let written = self.memories.write_copies(tenant, copies, &pointer).await?;
        for ((source_memory_id, target_agent_id, grant_id, redactions), w) in sources.into_iter().zip(written) {
            let kind = if w.deduplicated {
                "deduplicated"
            } else if w.memory.contested_by.is_some() {
                // The target's own fact kept its slot: the copy is a candidate.
                "candidate"
            } else {
                "copied"
            };
            metrics::counter!("engram_shares_total", "outcome" => kind).increment(1);
            outcome.shared.push(SharedCopy { source_memory_id, target_agent_id, grant_id, written: w, redactions });
        }
        Ok(outcome)
    }
}

/// A configured grant's id: stable across restarts and replicas, derived
/// from what the grant says.
fn config_grant_id(tenant: &str, from: &str, target: &GrantTarget) -> Uuid {
    use sha2::{Digest, Sha256};
    let text = serde_json::json!({"tenant": tenant, "from": from, "target": target}).to_string();
    let digest = Sha256::digest(text.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}
