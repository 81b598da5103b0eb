#!/usr/bin/env bash
# Fairness benchmark: does one tenant's writing slow another tenant's searches?
# A release `engram serve` with the bundled model and two API keys (tenants a and
# b), measured by benches/fairness.rs: tenant b's search latency idle, under tenant
# a's sustained write load, during one 60 × 32 KiB batch from a, and right after.
#
#   scripts/bench-fairness.sh                        Postgres + Redis
#   scripts/bench-fairness.sh --data-dir DIR         the embedded backend, in DIR
#   scripts/bench-fairness.sh ... -- --searches 500  arguments after -- go to the client
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

bench_build fairness
RUN=$(python3 -c 'import uuid; print(uuid.uuid4().hex[:12])')
KEY_A=key-a-$RUN
KEY_B=key-b-$RUN
keys=ENGRAM_API_KEYS="a-$RUN:$KEY_A,b-$RUN:$KEY_B"
if [[ -n $data_dir ]]; then
  rm -rf "$data_dir"
  bench_serve local "$keys" DATABASE_URL= ENGRAM_DATA_DIR="$data_dir"
else
  DB_NAME=engram_bench_fairness
  bench_database "$DB_NAME"
  bench_serve local "$keys" \
    DATABASE_URL="postgres://engram@127.0.0.1:$BENCH_PG_PORT/$DB_NAME" \
    REDIS_URL="$ENGRAM_TEST_REDIS_URL" \
    ENGRAM_REDIS__KEY_PREFIX="engram-bench-$RUN"
fi
bench_client fairness --url "$BENCH_URL" --key-a "$KEY_A" --key-b "$KEY_B" "$@"
