#!/usr/bin/env bash
# Failover as a client sees it (bench/failover.py), on the machine's loopback:
#   redis    one engram on Postgres and a Redis Cluster of three masters with a replica
#            each (scripts/redis-cluster.sh, node timeout ENGRAM_FAILOVER_NODE_TIMEOUT ms,
#            default 2000); one master is killed under load.
#   replica  one engram reading from the test services' hot standby (DATABASE_READ_URL);
#            the standby is killed, started again, frozen and thawed under load.
#   scripts/bench-failover.sh [redis|replica|all]
# Release build (ENGRAM_BENCH_BIN runs another), lexical-hash embedder. The figures go to
# bench/RESULTS.md ("Failover").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# `start` explicitly: a sourced file would otherwise see this script's arguments.
. scripts/services.sh start
bin=${ENGRAM_BENCH_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/engram}
[[ -n ${ENGRAM_BENCH_BIN:-} ]] || cargo build --release --locked --bin engram
work=$(mktemp -d "${TMPDIR:-/tmp}/engram-failover.XXXXXX")
database=engram_failover_$$
export ENGRAM_TEST_CLUSTER_PORT=${ENGRAM_FAILOVER_CLUSTER_PORT:-21391}
export ENGRAM_TEST_CLUSTER_REPLICAS=1 ENGRAM_TEST_CLUSTER_NODE_TIMEOUT=${ENGRAM_FAILOVER_NODE_TIMEOUT:-2000}
cleanup() {
  scripts/redis-cluster.sh stop || true
  "$ENGRAM_PG_BIN/psql" -q "$ENGRAM_TEST_DATABASE_URL" -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" || true
  rm -rf "$work"
}
trap cleanup EXIT

what=${1:-all}
if [[ $what == redis || $what == all ]]; then
  # A new cluster for the run: the last one lost a node.
  scripts/redis-cluster.sh stop
  cluster_url=$(scripts/redis-cluster.sh start)
  "$ENGRAM_PG_BIN/psql" -q "$ENGRAM_TEST_DATABASE_URL" -c "CREATE DATABASE $database"
  db_url=${ENGRAM_TEST_DATABASE_URL%/*}/$database
  DATABASE_URL=$db_url ENGRAM_EMBEDDING__PROVIDER=lexical-hash "$bin" migrate >/dev/null
  python3 bench/failover.py redis "$bin" "$db_url" "$cluster_url" "$work"
fi
if [[ $what == replica || $what == all ]]; then
  # The standby's data directory is named by its port (services.sh).
  replica_port=${ENGRAM_TEST_REPLICA_URL##*:}
  replica_port=${replica_port%%/*}
  python3 bench/failover.py replica "$bin" "$ENGRAM_TEST_PRIMARY_URL" "$ENGRAM_TEST_REPLICA_URL" \
    "$ENGRAM_PG_BIN" "$ENGRAM_CACHE_DIR/pgdata-18-$replica_port" "$work"
fi
