#!/usr/bin/env bash
# Write-latency benchmark: a release `engram serve` on its own database and a free
# port, measured by the client program benches/write.rs. Arguments go to that program:
#   scripts/bench-write.sh                    every class at concurrency 1, 8 and 32
#   scripts/bench-write.sh --total 2000       a quicker run
# The table is printed at the end; copy it into bench/RESULTS.md with the machine.
#
# Vectors come from the lexical-hash stand-in, so that the figures measure the write
# path (validation, classification, transactions, indexes), not the model's CPU time.
# The server and the load generator run on the same machine: on a small one they
# compete for the cores, which the numbers include.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/bench-lib.sh

# A database of its own: benchmark rows never mix with test data. Kept between runs
# (each run writes under new agent ids), so later runs see a fuller table, as a real
# server would.
DB_NAME=engram_bench
bench_database "$DB_NAME"
bench_build write

# A tenant and a Redis prefix of its own per run.
RUN=$(python3 -c 'import uuid; print(uuid.uuid4().hex[:12])')
bench_serve lexical-hash \
  DATABASE_URL="postgres://engram@127.0.0.1:$BENCH_PG_PORT/$DB_NAME" \
  REDIS_URL="$ENGRAM_TEST_REDIS_URL" \
  ENGRAM_AUTH__DEFAULT_TENANT="bench-$RUN" \
  ENGRAM_REDIS__KEY_PREFIX="engram-bench-$RUN"
bench_client write --url "$BENCH_URL" "$@"
