#!/usr/bin/env bash
# The tests that need a real chat model, kept out of scripts/test.sh because building the
# model server takes minutes on an empty cache: starts the services and llama-server with
# SmolLM2-135M (scripts/llm-server.sh, built once and cached), then runs the chat-model
# tests of the HTTP suite (tests/api/llm.rs) on both backends. Arguments go to `cargo test`.
#   scripts/test-llm.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

. scripts/services.sh start
. scripts/llm-server.sh start
export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
scripts/fetch-model.sh "$ENGRAM_MODEL_DIR"

cargo test --locked --test api llm:: "$@"
echo "test-llm.sh: the chat-model tests again on the embedded backend" >&2
ENGRAM_TEST_BACKEND=embedded cargo test --locked --test api llm:: "$@"
