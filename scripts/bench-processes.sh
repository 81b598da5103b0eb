#!/usr/bin/env bash
# One engram process against several, and working memory on one Redis against a cluster
# (bench/processes.py), on the machine's loopback:
#   search   LOCOMO_JSON: the LoCoMo turns written with the default embedder (the bundled
#            model), then searches and contexts of its questions at concurrency 1 and 8 of one
#            process, of three behind HAProxy (apt-get install haproxy), and of one again.
#   working  working-memory writes and session listings at concurrency 1 and 8 of one
#            process on the test services' Redis, then on a Redis Cluster of three masters
#            (scripts/redis-cluster.sh).
#   scripts/bench-processes.sh search LOCOMO_JSON
#   scripts/bench-processes.sh working
# Release build (ENGRAM_BENCH_BIN runs another, say the parent commit's, against the same
# client). Everything shares the machine's cores. The figures go to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

what=${1:-}
if [[ $what == search ]]; then
  [[ -f ${2:-} ]] || { echo "usage: $0 search LOCOMO_JSON" >&2; exit 2; }
  locomo=$(realpath "$2")
  command -v haproxy >/dev/null || { echo "haproxy is needed (apt-get install haproxy)" >&2; exit 1; }
elif [[ $what != working ]]; then
  echo "usage: $0 search LOCOMO_JSON | working" >&2
  exit 2
fi

# `start` explicitly: a sourced file would otherwise see this script's arguments.
. scripts/services.sh start
bin=${ENGRAM_BENCH_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/engram}
[[ -n ${ENGRAM_BENCH_BIN:-} ]] || cargo build --release --locked --bin engram
work=$(mktemp -d "${TMPDIR:-/tmp}/engram-processes.XXXXXX")
database=engram_processes_$$
cleanup() {
  [[ $what != working ]] || scripts/redis-cluster.sh stop || true
  "$ENGRAM_PG_BIN/psql" -q "$ENGRAM_TEST_DATABASE_URL" -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" || true
  rm -rf "$work"
}
trap cleanup EXIT
"$ENGRAM_PG_BIN/psql" -q "$ENGRAM_TEST_DATABASE_URL" -c "CREATE DATABASE $database"
db_url=${ENGRAM_TEST_DATABASE_URL%/*}/$database
DATABASE_URL=$db_url ENGRAM_EMBEDDING__PROVIDER=lexical-hash "$bin" migrate >/dev/null
echo "bench: $("$bin" --version), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

if [[ $what == search ]]; then
  export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
  scripts/fetch-model.sh "$ENGRAM_MODEL_DIR"
  python3 bench/processes.py search "$bin" "$db_url" "$ENGRAM_TEST_REDIS_URL" "$work" "$locomo"
else
  echo "single Redis ($ENGRAM_TEST_REDIS_URL)"
  python3 bench/processes.py working "$bin" "$db_url" "$ENGRAM_TEST_REDIS_URL" "$work"
  cluster_url=$(scripts/redis-cluster.sh start)
  echo "Redis Cluster, three masters ($cluster_url)"
  python3 bench/processes.py working "$bin" "$db_url" "$cluster_url" "$work"
fi
