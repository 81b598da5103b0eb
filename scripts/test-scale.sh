#!/usr/bin/env bash
# The scale-out tests, a second test command (they start several servers and a load
# balancer): three `engram serve` processes on one Postgres database and one Redis, behind
# HAProxy from the OS packages (apt-get install haproxy), driven by
# tests/scale/three_processes.py: the idempotency race across processes, consolidation asked
# of all three at once (each episode consolidated once), the retention sweep every second on
# each (each expired memory deleted once, and gone), and kill -9 of one process under
# write load with every acknowledged write read back and no retry written twice. The servers
# embed with the lexical-hash provider: the subject is the processes, not the model. Working
# memory and the skill cache on a Redis Cluster run in scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'test-scale.sh: %s\n' "$*" >&2; }
command -v haproxy >/dev/null || { log "haproxy is needed (apt-get install haproxy)" && exit 1; }
. scripts/services.sh start
cargo build --locked --bin engram
bin=${CARGO_TARGET_DIR:-$PWD/target}/debug/engram

work=$(mktemp -d "${TMPDIR:-/tmp}/engram-scale.XXXXXX")
database=engram_scale_$$
cleanup() {
  "$ENGRAM_PG_BIN/psql" -q "$ENGRAM_TEST_DATABASE_URL" -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" || true
  rm -rf "$work"
}
trap cleanup EXIT
"$ENGRAM_PG_BIN/psql" -q "$ENGRAM_TEST_DATABASE_URL" -c "CREATE DATABASE $database"
# The first process migrates; the others start once it has.
ENGRAM_EMBEDDING__PROVIDER=lexical-hash DATABASE_URL="${ENGRAM_TEST_DATABASE_URL%/*}/$database" "$bin" migrate
status=0
python3 tests/scale/three_processes.py "$bin" \
  "${ENGRAM_TEST_DATABASE_URL%/*}/$database" "$ENGRAM_TEST_REDIS_URL" "$work" || status=$?
if ((status != 0)); then
  log "failed; the servers' logs follow"
  tail -n 20 "$work"/*.log >&2 || true
fi
exit "$status"
