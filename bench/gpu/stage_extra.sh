#!/usr/bin/env bash
# Run HERE (CPU machine, repo root): download requirements-extra.txt as Python 3.12 x86_64 wheels
# into .gpu-stage/extra/ (a few MB; it travels with the GPU command through `carry`), and
# .gpu-stage/demo/ for bench/gpu/demo.sh.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEST=${DEST:-$(git rev-parse --show-toplevel)/.gpu-stage/extra}
mkdir -p "$DEST"
grep -v '^\s*#' "$HERE/requirements-extra.txt" | grep -v '^\s*$' > "$DEST/requirements.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" -r "$DEST/requirements.txt" 2>&1 | grep -v 'WARNING: Location' || true
echo "staged $(ls "$DEST"/*.whl | wc -l) wheels ($(du -sh "$DEST" | cut -f1)) in $DEST"
# bench/gpu/demo.sh's carry: bubblewrap's .deb (unpacked there with dpkg -x) and the demo wheels
DEMO=${DEMO:-$(dirname "$DEST")/demo}
mkdir -p "$DEMO"
(cd "$DEMO" && apt-get download -q bubblewrap 2>&1 | grep -v unsandboxed || true)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$DEMO" "bm25s==0.3.16" \
  2>&1 | grep -v 'WARNING: Location' || true
echo "staged $(ls "$DEMO" | wc -l) files for bench/gpu/demo.sh in $DEMO"
