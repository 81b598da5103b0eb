#!/usr/bin/env bash
# Share benchmark: POST /v1/share of 20 memories to one agent, through a release
# `engram serve` with the bundled model, measured by benches/share.rs (p50, p95,
# p99 over 200 shares, one at a time, after 10 to warm up).
#
#   scripts/bench-share.sh                        Postgres + Redis
#   scripts/bench-share.sh --data-dir DIR         the embedded backend, in DIR
#   scripts/bench-share.sh ... -- --shares 500    arguments after -- go to the client
# The table is printed at the end; copy it into bench/RESULTS.md with the machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/bench-lib.sh

data_dir=
if [[ ${1:-} == --data-dir ]]; then
  data_dir=$2
  shift 2
fi
[[ ${1:-} == -- ]] && shift

bench_build share
RUN=$(python3 -c 'import uuid; print(uuid.uuid4().hex[:12])')
if [[ -n $data_dir ]]; then
  rm -rf "$data_dir"
  bench_serve local DATABASE_URL= ENGRAM_DATA_DIR="$data_dir" ENGRAM_AUTH__DEFAULT_TENANT="bench-share-$RUN"
else
  DB_NAME=engram_bench_share
  bench_database "$DB_NAME"
  bench_serve local \
    DATABASE_URL="postgres://engram@127.0.0.1:$BENCH_PG_PORT/$DB_NAME" \
    REDIS_URL="$ENGRAM_TEST_REDIS_URL" \
    ENGRAM_REDIS__KEY_PREFIX="engram-bench-$RUN" ENGRAM_AUTH__DEFAULT_TENANT="bench-share-$RUN"
fi
bench_client share --url "$BENCH_URL" "$@"
