//! HTTP tests against a real server on a real port, backed by the real
//! Postgres and Redis that `scripts/test.sh` starts. Each test gets its own
//! tenant and Redis key prefix, so tests run in parallel on one database.

mod connections;
mod consolidation;
mod contract;
mod erasure;
mod errors;
mod helpers;
mod holds;
mod inputs;
mod keyless;
mod llm;
mod memories;
mod numbers;
mod operations;
mod recall;
mod reembed;
mod replica;
mod retention;
mod schema;
mod scopes;
mod share;
mod tenancy;
mod transfer;
mod working;
