#!/usr/bin/env bash
# Run HERE (CPU machine, repo root): download TRL's and verl's wheels (requirements-trl.txt,
# requirements-verl.txt: Python 3.12, manylinux x86_64) into .gpu-stage/peers/{trl,verl}/ with
# install.sh beside them, and .gpu-stage/race-tokenizer (MODEL_PY: a python with transformers).
# Each folder travels with a GPU command through `carry` (20 MB and 2.6 MB).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(git rev-parse --show-toplevel)
DEST=${DEST:-$ROOT/.gpu-stage/peers}
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
for peer in trl verl; do
  mkdir -p "$DEST/$peer"
  grep -v '^\s*#' "$HERE/requirements-$peer.txt" | grep -v '^\s*$' | while read -r spec; do
    name=${spec%%==*}; ver=${spec##*==}
    fname=$(echo "$name" | tr '-' '_' | tr 'A-Z' 'a-z')
    if ls "$DEST/$peer/" | tr 'A-Z' 'a-z' | grep -q "^${fname}-${ver}-"; then continue; fi
    if [ "$name" = antlr4-python3-runtime ]; then  # an sdist only: a pure-Python wheel built here
      python3 -m pip wheel -q --no-deps -w "$DEST/$peer" "$spec" 2>&1 | grep -v 'WARNING: Location' || true
    else
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp $PLAT -d "$DEST/$peer" "$spec" 2>&1 | grep -v 'WARNING: Location' || true
    fi
    ls "$DEST/$peer/" | tr 'A-Z' 'a-z' | grep -q "^${fname}-${ver}-" || { echo "download failed: $spec" >&2; exit 1; }
  done
  echo "$peer: $(ls "$DEST/$peer"/*.whl | wc -l) wheels, $(du -sh "$DEST/$peer" | cut -f1)"
done
cp "$HERE/install.sh" "$DEST/"
# the race's tokenizer (2.6 MB, its own folder: the agentloop command carries it): the staged tiny
# BPE one padded to the model's vocabulary
STAGE=$(dirname "$DEST")
PY=${MODEL_PY:-python3}
if [ ! -f "$STAGE/tiny-qwen2/tokenizer.json" ]; then
  (cd "$STAGE" && $PY "${SHARED:-$ROOT/../shared/gpu}/make_tiny_model.py" tiny-qwen2)
fi
$PY -c "import sys; sys.path.insert(0, '$HERE'); from pathlib import Path; import workload as w; \
w.race_tokenizer(Path('$STAGE/tiny-qwen2'), Path('$STAGE/race-tokenizer'), 151936)"
(cd "$DEST" && sha256sum trl/*.whl verl/*.whl > MANIFEST)
echo "staged in $DEST: $(du -sm "$DEST" | cut -f1) MB (carry .gpu-stage/peers)"
echo "race tokenizer in $STAGE/race-tokenizer: $(du -sm "$STAGE/race-tokenizer" | cut -f1) MB"
