#!/usr/bin/env bash
# Conversational-recall benchmark (LoCoMo): a release `engram serve` with its default
# configuration, on a database of its own (engram_bench_locomo) and a free port, measured
# by the client program benches/locomo.rs.
#   scripts/bench-locomo.sh DATA                                  the server's defaults
#   scripts/bench-locomo.sh DATA ENGRAM_EMBEDDING__PROVIDER=none  another provider
#   scripts/bench-locomo.sh DATA --conversations conv-26,conv-30 --diagnose 10
#   scripts/bench-locomo.sh DATA ENGRAM_CONSOLIDATION__MIN_AGE_SECS=0 --consolidate
#                                                                 recall after consolidation
#   scripts/bench-locomo.sh DATA --context-budgets 1000,4000      and the evidence /v1/context packs
# DATA is a LoCoMo JSON file (e.g. conversations-dev.json; CC BY-NC 4.0): it is read,
# never copied. Arguments of the form NAME=VALUE are given to the server's environment
# (the embedding provider comes from ENGRAM_EMBEDDING__PROVIDER, in the environment or
# there; default `local`, the server's); the others go to the program. The tables are
# printed at the end; copy them into bench/RESULTS.md with the provider and the machine.
#
# Each run writes the conversations again under new agent ids. The memories of earlier runs
# are deleted first: left in place they would grow the HNSW index that every search walks
# (filtered to one agent), and with another provider they would be re-embedded in the
# background during the run. One run at a time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $# -lt 1 || ! -f $1 ]]; then
  echo "usage: $0 DATA [NAME=VALUE server environment...] [benchmark arguments...]" >&2
  exit 2
fi
DATA=$(realpath "$1")
shift
EXTRA_ENV=()
BENCH_ARGS=()
for arg in "$@"; do
  if [[ $arg =~ ^[A-Z_][A-Z0-9_]*= ]]; then
    EXTRA_ENV+=("$arg")
  else
    BENCH_ARGS+=("$arg")
  fi
done
PROVIDER=${ENGRAM_EMBEDDING__PROVIDER:-local}
for e in "${EXTRA_ENV[@]}"; do
  [[ $e == ENGRAM_EMBEDDING__PROVIDER=* ]] && PROVIDER=${e#*=}
done

. scripts/bench-lib.sh

DB_NAME=engram_bench_locomo
TENANT=bench-locomo
bench_database "$DB_NAME"
# The table exists once a server has migrated the database.
if [[ "$(psql_engram -d "$DB_NAME" -tAc "SELECT to_regclass('episodic_memory') IS NOT NULL")" == t ]]; then
  echo "bench: deleting the memories of earlier runs" >&2
  # VACUUM without ANALYZE: analysing the emptied table would leave the planner no column
  # statistics, and the run writes and searches before autovacuum analyses it again; on
  # those the neighbours statement takes about 25 ms instead of 2 (bench/RESULTS.md). The
  # earlier run's statistics describe a table of the same shape. A new database's first
  # run has none either, so its Postgres latencies read high.
  psql_engram -d "$DB_NAME" -c "DELETE FROM episodic_memory WHERE tenant_id = '$TENANT'" -c 'VACUUM episodic_memory'
fi
bench_build locomo

# One tenant and Redis prefix for every run; runs differ by their agent ids.
bench_serve "$PROVIDER" \
  DATABASE_URL="postgres://engram@127.0.0.1:$BENCH_PG_PORT/$DB_NAME" \
  REDIS_URL="$ENGRAM_TEST_REDIS_URL" \
  ENGRAM_AUTH__DEFAULT_TENANT="$TENANT" \
  ENGRAM_REDIS__KEY_PREFIX=engram-bench-locomo \
  "${EXTRA_ENV[@]}"
bench_client locomo --data "$DATA" --url "$BENCH_URL" "${BENCH_ARGS[@]}"
