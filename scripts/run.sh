#!/usr/bin/env bash
# Run engram locally with nothing installed but Rust and Python: fetches the embedding
# model when it is missing (scripts/fetch-model.sh), starts (or reuses) PostgreSQL +
# pgvector and Redis through scripts/services.sh, creates the `engram` database, and
# serves on ENGRAM_LISTEN (default 127.0.0.1:8080).
#
#   scripts/run.sh                 # build (release) and serve
#   scripts/run.sh --listen 0.0.0.0:8080
#
# To use your own Postgres and Redis instead, run the binary directly:
#   DATABASE_URL=postgres://... REDIS_URL=redis://... cargo run --release -- serve
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The model directory the server will read (config default, or ENGRAM_MODEL_DIR);
# fetch-model.sh does nothing when every file is there with the right hash.
export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-data/models/all-MiniLM-L6-v2}
scripts/fetch-model.sh "$ENGRAM_MODEL_DIR"

. scripts/services.sh start
pg_port=${ENGRAM_TEST_PG_PORT:-54329}
if ! "$ENGRAM_PG_BIN/psql" -h 127.0.0.1 -p "$pg_port" -U engram -d postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname = 'engram'" | grep -q 1; then
  "$ENGRAM_PG_BIN/psql" -h 127.0.0.1 -p "$pg_port" -U engram -d postgres -qc 'CREATE DATABASE engram'
fi

export DATABASE_URL=${DATABASE_URL:-postgres://engram@127.0.0.1:$pg_port/engram}
export REDIS_URL=${REDIS_URL:-$ENGRAM_TEST_REDIS_URL}
echo "engram: database $DATABASE_URL, redis $REDIS_URL" >&2
exec cargo run --release --locked --bin engram -- serve "$@"
