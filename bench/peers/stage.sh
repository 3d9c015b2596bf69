#!/usr/bin/env bash
# Run HERE (CPU machine, repo root): download TRL's and verl's wheels (requirements-trl.txt,
# requirements-verl.txt: Python 3.12, manylinux x86_64) into .gpu-stage/peers/{trl,verl}/ with
# install.sh beside them. The folder travels with one GPU command through `carry` (≤ 55 MB).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(git rev-parse --show-toplevel)
DEST=${DEST:-$ROOT/.gpu-stage/peers}
grep -qx '/.gpu-stage/' "$ROOT/.git/info/exclude" 2>/dev/null || true  # .gitignore has it
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
(cd "$DEST" && sha256sum trl/*.whl verl/*.whl > MANIFEST)
echo "staged in $DEST: $(du -sm "$DEST" | cut -f1) MB (carry .gpu-stage/peers)"
