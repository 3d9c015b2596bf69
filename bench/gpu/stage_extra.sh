#!/usr/bin/env bash
# Run HERE (CPU machine, repo root): download requirements-extra.txt as Python 3.12 x86_64 wheels
# into .gpu-stage/extra/ (a few MB; it travels with the GPU command through `carry`).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEST=${DEST:-$(git rev-parse --show-toplevel)/.gpu-stage/extra}
mkdir -p "$DEST"
grep -v '^\s*#' "$HERE/requirements-extra.txt" | grep -v '^\s*$' > "$DEST/requirements.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" -r "$DEST/requirements.txt" 2>&1 | grep -v 'WARNING: Location' || true
echo "staged $(ls "$DEST"/*.whl | wc -l) wheels ($(du -sh "$DEST" | cut -f1)) in $DEST"
