//! Erasure (the right to be forgotten) and the audit log: what belongs to a
//! data subject, what an erasure's states mean, and how audit entries chain.
//!
//! Rules, all decided here and used by every backend and job:
//! - **The subject** is a user of the tenant (optionally narrowed to one
//!   agent), or a list of memory ids. A user's memories are those with its
//!   `user_id` ingested at or before the request (a memory written after the
//!   request is new data, not part of the erasure).
//! - **What follows a memory**: the facts derived from it (`source_episode_id`)
//!   and the older versions it superseded (`supersedes`), transitively, unless
//!   such a fact belongs to another user (a user's data is never erased for
//!   someone else). Candidates that contested an erased fact stay: they are
//!   their writer's claims, not the subject's.
//! - **Remembered responses** (idempotency records) that show a subject's
//!   memory are forgotten with it: a replay would hand its content back.
//! - **The audit chain**: each entry's hash covers its fields and the previous
//!   entry's hash (per tenant), so an edited, removed or reordered entry breaks
//!   the chain at the first entry it touched.
//!
//! Must not: know where rows live or how they are deleted.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::Memory;
use super::validate::{self, FieldError};

/// Most memory ids one erasure request may name.
pub const MAX_MEMORY_IDS: usize = 1000;

/// Whose data an erasure removes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Subject {
    /// Every memory of one user, or of one user with one agent.
    User {
        user_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_id: Option<String>,
    },
    /// These memories (unknown ids are ignored: existence must not leak).
    Memories { memory_ids: Vec<Uuid> },
}

impl Subject {
    /// Checks a subject as a request gives it.
    pub fn validate(&self) -> Result<(), FieldError> {
        match self {
            Subject::User { user_id, agent_id } => {
                validate::identifier("/user_id", user_id)?;
                if let Some(a) = agent_id {
                    validate::identifier("/agent_id", a)?;
                }
            }
            Subject::Memories { memory_ids } => {
                if memory_ids.is_empty() || memory_ids.len() > MAX_MEMORY_IDS {
                    return Err(FieldError::new(
                        "/memory_ids",
                        format!("must list from 1 to {MAX_MEMORY_IDS} memory ids"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The subject as stored with its erasure (JSON text).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a subject is JSON")
    }

    pub fn from_json(text: &str) -> Option<Subject> {
        serde_json::from_str(text).ok()
    }

    /// Whether a memory (of the subject's tenant) belongs to the subject of
    /// an erasure requested at `requested_at`.
    pub fn covers(&self, m: &Memory, requested_at: DateTime<Utc>) -> bool {
        self.covers_fields(m.id, m.user_id.as_deref(), &m.agent_id, m.created_at, requested_at)
    }

    fn covers_fields(
        &self,
        id: Uuid,
        user_id: Option<&str>,
        agent_id: &str,
        created_at: DateTime<Utc>,
        requested_at: DateTime<Utc>,
    ) -> bool {
        match self {
            Subject::User { user_id: u, agent_id: a } => {
                user_id == Some(u.as_str()) && a.as_deref().is_none_or(|a| a == agent_id) && created_at <= requested_at
            }
            Subject::Memories { memory_ids } => memory_ids.contains(&id),
        }
    }

    /// Whether a remembered write response (`{"memories": [...]}`) shows a
    /// memory of the subject, or one of `ids`.
    pub fn in_response(&self, body: &Value, ids: &HashSet<Uuid>, requested_at: DateTime<Utc>) -> bool {
        let Some(items) = body.get("memories").and_then(Value::as_array) else { return false };
        items.iter().any(|m| {
            let Some(id) = m.get("id").and_then(Value::as_str).and_then(|s| s.parse::<Uuid>().ok()) else {
                return false;
            };
            let created_at = m
                .get("created_at")
                .and_then(Value::as_str)
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(|t| t.with_timezone(&Utc));
            ids.contains(&id)
                || created_at.is_some_and(|created_at| {
                    self.covers_fields(
                        id,
                        m.get("user_id").and_then(Value::as_str),
                        m.get("agent_id").and_then(Value::as_str).unwrap_or_default(),
                        created_at,
                        requested_at,
                    )
                })
        })
    }
}

/// Whether a fact linked to an erased memory (derived from it, or an older
/// version it superseded) goes with it: not when it is another user's.
pub fn follows_link(linked_user: Option<&str>, erased_user: Option<&str>) -> bool {
    linked_user.is_none() || linked_user == erased_user
}

/// Where an erasure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErasureState {
    /// Accepted (the subject is hidden from every read), not yet worked on.
    Pending,
    /// Being deleted and verified.
    Running,
    /// A store was unavailable; the job tries again.
    Retrying,
    /// Deleted everywhere, and verification found nothing left.
    Completed,
    /// Verification found something left: see the receipt.
    Failed,
}

impl ErasureState {
    pub fn as_str(self) -> &'static str {
        match self {
            ErasureState::Pending => "pending",
            ErasureState::Running => "running",
            ErasureState::Retrying => "retrying",
            ErasureState::Completed => "completed",
            ErasureState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<ErasureState> {
        Some(match s {
            "pending" => ErasureState::Pending,
            "running" => ErasureState::Running,
            "retrying" => ErasureState::Retrying,
            "completed" => ErasureState::Completed,
            "failed" => ErasureState::Failed,
            _ => return None,
        })
    }

    pub fn is_final(self) -> bool {
        matches!(self, ErasureState::Completed | ErasureState::Failed)
    }
}

/// Records of one kind per store: `{"postgres": {"episodic": 3, ...}, ...}`.
pub type Counts = BTreeMap<String, BTreeMap<String, u64>>;

/// What an erasure did and found (no memory content).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// Per store, how many records of each kind were erased.
    pub deleted: Counts,
    /// Per store, how many records of the subject each check found after the
    /// deletion (all zero when the erasure completed).
    pub verification: Counts,
    /// When verification ran.
    pub verified_at: Option<DateTime<Utc>>,
    /// What was done about deleted bytes (vacuum, checkpoint), per store.
    pub purge: BTreeMap<String, String>,
    /// The hash of the erasure's audit entry.
    pub audit_hash: Option<String>,
}

impl Receipt {
    pub fn add(counts: &mut Counts, store: &str, kind: &str, n: u64) {
        *counts.entry(store.to_string()).or_default().entry(kind.to_string()).or_default() += n;
    }

    /// Survivors found by verification.
    pub fn survivors(&self) -> u64 {
        self.verification.values().flat_map(|m| m.values()).sum()
    }
}

/// An erasure as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ErasureRecord {
    pub id: Uuid,
    pub tenant: String,
    pub subject: Subject,
    pub requested_by: String,
    pub state: ErasureState,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub receipt: Receipt,
    pub requested_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// Erasures accepted and not finished, per tenant: the job keeps this up to
/// date on every replica, and working-memory reads leave out what it covers
/// until the entries are deleted (working memory is not in the database
/// whose rows the request hides).
#[derive(Default)]
pub struct Erasing {
    by_tenant: std::sync::RwLock<BTreeMap<String, Vec<Pending>>>,
}

/// An unfinished erasure's subject and request time.
type Pending = (Subject, DateTime<Utc>);

impl Erasing {
    /// Replaces the whole set (from the stored unfinished erasures).
    pub fn set(&self, unfinished: impl IntoIterator<Item = (String, Subject, DateTime<Utc>)>) {
        let mut next: BTreeMap<String, Vec<Pending>> = BTreeMap::new();
        for (tenant, subject, at) in unfinished {
            next.entry(tenant).or_default().push((subject, at));
        }
        *self.by_tenant.write().unwrap_or_else(|p| p.into_inner()) = next;
    }

    pub fn add(&self, tenant: &str, subject: Subject, at: DateTime<Utc>) {
        self.by_tenant
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(tenant.to_string())
            .or_default()
            .push((subject, at));
    }

    /// Whether a memory is being erased.
    pub fn hides(&self, tenant: &str, m: &Memory) -> bool {
        let map = self.by_tenant.read().unwrap_or_else(|p| p.into_inner());
        map.get(tenant).is_some_and(|subjects| subjects.iter().any(|(s, at)| s.covers(m, *at)))
    }
}

/// The hash an audit log starts from.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// An audit entry to append (the store adds the chain).
#[derive(Debug, Clone, PartialEq)]
pub struct NewAuditEntry {
    pub tenant: String,
    pub at: DateTime<Utc>,
    /// The API key's id (never the key), or `cli` for the command line.
    pub actor: String,
    /// `erasure`, `subject_export`, `export`, `import`, `legal_hold_placed`,
    /// `legal_hold_released`.
    pub operation: String,
    /// What it applied to, as JSON (a selector; never content).
    pub target: Value,
    /// How much it touched, as JSON.
    pub counts: Value,
}

/// An audit entry as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    pub seq: i64,
    pub tenant: String,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub operation: String,
    /// JSON text, exactly as hashed.
    pub target: String,
    /// JSON text, exactly as hashed.
    pub counts: String,
    pub prev_hash: String,
    pub hash: String,
}

impl NewAuditEntry {
    /// The entry's fields as stored: time to the microsecond (what both
    /// databases keep), JSON as compact text.
    pub fn fields(&self) -> (DateTime<Utc>, String, String) {
        let at = DateTime::from_timestamp_micros(self.at.timestamp_micros()).unwrap_or(self.at);
        (at, self.target.to_string(), self.counts.to_string())
    }
}

/// The hash of an entry: SHA-256 over the previous hash and every field,
/// each length-prefixed so that no two entries hash the same text.
pub fn entry_hash(
    prev_hash: &str,
    tenant: &str,
    at: DateTime<Utc>,
    actor: &str,
    operation: &str,
    target: &str,
    counts: &str,
) -> String {
    let mut h = Sha256::new();
    let micros = at.timestamp_micros().to_string();
    for field in [prev_hash, tenant, micros.as_str(), actor, operation, target, counts] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The first entry where a tenant's chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Broken {
    pub seq: i64,
    pub tenant: String,
    pub reason: String,
}

/// Checks chains of entries in `seq` order (any mix of tenants; each
/// tenant's chain checked on its own), continuing from `heads` (the last
/// hash seen per tenant, for a log read in pages). Returns the first broken
/// entry.
pub fn verify_chain<'a>(
    entries: impl IntoIterator<Item = &'a AuditEntry>,
    heads: &mut BTreeMap<String, String>,
) -> Option<Broken> {
    for e in entries {
        let prev = heads.get(&e.tenant).map(String::as_str).unwrap_or(GENESIS_HASH);
        let broken = |reason: &str| Some(Broken { seq: e.seq, tenant: e.tenant.clone(), reason: reason.into() });
        if e.prev_hash != prev {
            return broken(
                "its previous hash is not the hash of the tenant's entry before it (an entry was removed, reordered or changed)",
            );
        }
        let expected = entry_hash(&e.prev_hash, &e.tenant, e.at, &e.actor, &e.operation, &e.target, &e.counts);
        if e.hash != expected {
            return broken("its hash does not match its fields (the entry was edited)");
        }
        heads.insert(e.tenant.clone(), e.hash.clone());
    }
    None
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::*;

    fn at(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 5, 1, h, 0, 0).unwrap()
    }

    fn chain(n: usize) -> Vec<AuditEntry> {
        let mut prev = GENESIS_HASH.to_string();
        (0..n)
            .map(|i| {
                let (tenant, actor, op, target, counts) = ("t", "k1", "erasure", "{\"user_id\":\"u\"}", "{}");
                let hash = entry_hash(&prev, tenant, at(i as u32), actor, op, target, counts);
                let e = AuditEntry {
                    seq: i as i64 + 1,
                    tenant: tenant.into(),
                    at: at(i as u32),
                    actor: actor.into(),
                    operation: op.into(),
                    target: target.into(),
                    counts: counts.into(),
                    prev_hash: prev.clone(),
                    hash: hash.clone(),
                };
                prev = hash;
                e
            })
            .collect()
    }

    #[test]
    fn an_intact_chain_verifies_and_an_edit_or_removal_is_named() {
        let entries = chain(4);
        assert_eq!(verify_chain(&entries, &mut BTreeMap::new()), None);

        let mut edited = entries.clone();
        edited[2].counts = "{\"episodic\":0}".into();
        assert_eq!(verify_chain(&edited, &mut BTreeMap::new()).unwrap().seq, 3);

        let mut removed = entries.clone();
        removed.remove(1);
        assert_eq!(verify_chain(&removed, &mut BTreeMap::new()).unwrap().seq, 3);

        // Read in two pages: the head carries over.
        let mut heads = BTreeMap::new();
        assert_eq!(verify_chain(&entries[..2], &mut heads), None);
        assert_eq!(verify_chain(&entries[2..], &mut heads), None);
    }

    #[test]
    fn field_boundaries_are_part_of_the_hash() {
        let a = entry_hash(GENESIS_HASH, "t", at(0), "ab", "c", "{}", "{}");
        let b = entry_hash(GENESIS_HASH, "t", at(0), "a", "bc", "{}", "{}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_user_subject_covers_its_memories_up_to_the_request_and_its_agent_only() {
        let s = Subject::User { user_id: "alice".into(), agent_id: Some("a1".into()) };
        let id = Uuid::new_v4();
        assert!(s.covers_fields(id, Some("alice"), "a1", at(1), at(2)));
        assert!(!s.covers_fields(id, Some("alice"), "a2", at(1), at(2)));
        assert!(!s.covers_fields(id, Some("bob"), "a1", at(1), at(2)));
        assert!(!s.covers_fields(id, None, "a1", at(1), at(2)));
        // Written after the request: new data.
        assert!(!s.covers_fields(id, Some("alice"), "a1", at(3), at(2)));
    }

    #[test]
    fn remembered_responses_showing_the_subject_are_found() {
        let s = Subject::User { user_id: "alice".into(), agent_id: None };
        let (mine, other) = (Uuid::new_v4(), Uuid::new_v4());
        let body = |id: Uuid, user: &str| json!({"memories": [{"id": id, "user_id": user, "agent_id": "a", "created_at": "2026-05-01T01:00:00Z"}]});
        let none = HashSet::new();
        assert!(s.in_response(&body(mine, "alice"), &none, at(2)));
        assert!(!s.in_response(&body(other, "bob"), &none, at(2)));
        // A memory claimed through a link (a derived fact without a user).
        assert!(s.in_response(&body(other, "bob"), &HashSet::from([other]), at(2)));
        assert!(!s.in_response(&json!({"error": {}}), &none, at(2)));
    }

    #[test]
    fn links_never_reach_another_users_facts() {
        assert!(follows_link(None, Some("alice")));
        assert!(follows_link(Some("alice"), Some("alice")));
        assert!(!follows_link(Some("bob"), Some("alice")));
        assert!(!follows_link(Some("bob"), None));
    }

    #[test]
    fn subjects_round_trip_and_validate() {
        let u = Subject::User { user_id: "alice".into(), agent_id: None };
        assert_eq!(u.to_json(), "{\"user_id\":\"alice\"}");
        assert_eq!(Subject::from_json(&u.to_json()), Some(u));
        let m = Subject::Memories { memory_ids: vec![] };
        assert_eq!(m.validate().unwrap_err().field, "/memory_ids");
        let bad = Subject::User { user_id: "al\u{202e}ice".into(), agent_id: None };
        assert_eq!(bad.validate().unwrap_err().field, "/user_id");
    }
}
