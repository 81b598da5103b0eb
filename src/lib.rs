//! engram: a memory server for AI agents.
//!
//! A map of the crate, outside in:
//! - [`http`]: routes, extractors, middleware, the OpenAPI document, and the
//!   request and response types (the wire schema, apart from the domain's). No SQL.
//! - [`service`]: what each operation means, across working memory and the
//!   persistent store; [`recall`]: search, scoring and context assembly;
//!   [`sharing`]: grants, teams and copies of memories between agents.
//! - [`domain`]: tiers, retention, classification, validation: pure rules.
//! - [`store`]: the storage traits and their backends (Postgres, Redis).
//! - [`embed`]: embedders behind one trait.
//! - [`jobs`]: background upkeep (expired idempotency keys, re-embedding,
//!   the retention sweep, erasure).
//! - [`transfer`]: `engram export` and `engram import`, a tenant as JSON Lines.
//! - [`app`]: builds the state, runs the server, shuts it down; [`server`]:
//!   the connections under the router (timeouts, a limit, lingering close).
//! - [`config`], [`error`], [`telemetry`], [`clock`]: the plumbing.

pub mod app;
pub mod clock;
pub mod config;
pub mod domain;
pub mod embed;
pub mod error;
pub mod http;
pub mod jobs;
pub mod llm;
pub mod mcp;
pub mod progress;
pub mod recall;
pub mod server;
pub mod service;
pub mod sharing;
pub mod store;
pub mod telemetry;
pub mod transfer;
