//! Pure rules and types of engram's memory model: tiers, retention (expiry
//! and decay), content normalisation, classification, input validation and
//! the redaction of personal data and secrets before memories are shared.
//!
//! Nothing here knows about HTTP, SQL or Redis, so every rule can be unit
//! tested with exact values and reused by every storage backend.

pub mod classify;
pub mod consolidate;
pub mod content;
pub mod context;
pub mod draft;
pub mod erasure;
pub mod extract;
pub mod facts;
pub mod holds;
pub mod memory;
pub mod redact;
pub mod retention;
pub mod rows;
pub mod scoring;
pub mod share;
pub mod speaker;
pub mod tokens;
pub mod validate;
pub mod when;
pub mod words;

pub use memory::{EventType, Memory, MemoryPatch, NewMemory, Outcome, Retention, Tier, WrittenMemory};
pub use retention::{Period, RetentionPolicy};
