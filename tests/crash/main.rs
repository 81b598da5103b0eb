//! Crash safety: what the server acknowledged or committed survives `kill -9`.
//!
//! This is its own test binary because it runs the real `engram` executable
//! (not the router in-process): only a separate process can be killed without
//! warning. `load` kills it under a write load and reads every acknowledged
//! id back; `outbox` kills it between a batch's Postgres commit and its
//! Redis write and checks that the batch ends up whole, once; `erasure`
//! kills it among an erasure's deletes and checks that the erasure resumes;
//! `consolidation` kills it among a consolidation's groups and checks that a
//! new run takes each episode the killed one had not reached, once;
//! `skill_cache` stops Redis under two server processes and checks that no
//! replica serves a skill changed meanwhile as it was before.

mod consolidation;
mod erasure;
mod load;
mod outbox;
mod server;
mod skill_cache;
