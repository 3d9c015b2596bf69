#!/usr/bin/env bash
# Run HERE (CPU machine, repo root): stage Ray and the dependencies the GPU image lacks as
# Python 3.12 wheels in .gpu-stage/ray-01 … ray-04. The Ray wheel is slimmed (no Java jar, no
# dashboard source maps: 80 → 45 MB) with shared/gpu's slim_wheel.py, and still travels in
# pieces beside shared/gpu's vLLM parts (a command carries at most 64 MiB with the tree):
#   ray-01..03 (7 MB each) ride with part-01..03, ray-04 (the rest and the small wheels) with
#   the install command. There, `bash bench/gpu/ray_parts.sh stash .gpu-stage/ray-NN` in each
#   command, and `source bench/gpu/setup.sh` installs Ray once every piece is stashed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(git rev-parse --show-toplevel)
DL=${DL:-$ROOT/.gpu-stage/ray-dl}
mkdir -p "$DL"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DL" -r "$HERE/requirements-ray.txt" 2>&1 | grep -v 'WARNING: Location' || true
SHARED=${SHARED:-$ROOT/../shared/gpu}
rm -f "$DL"/ray-*0slim*.whl
full=$(ls "$DL"/ray-*.whl)
python3 "$SHARED/slim_wheel.py" "$full" "$DL" ray/jars/ ray/dashboard/client/build/static/js/main.
wheel=$(ls "$DL"/ray-*0slim*.whl)
for n in 01 02 03 04; do rm -rf "$ROOT/.gpu-stage/ray-$n"; mkdir -p "$ROOT/.gpu-stage/ray-$n"; done
( cd "$DL" && sha256sum "$(basename "$wheel")" > "$ROOT/.gpu-stage/ray-04/ray.sha256" )
split -b 7000000 -a 2 -d "$wheel" "$DL/ray.whl.piece-"
for i in 00 01 02; do mv "$DL/ray.whl.piece-$i" "$ROOT/.gpu-stage/ray-0$((10#$i + 1))/"; done
cat "$DL"/ray.whl.piece-* > "$ROOT/.gpu-stage/ray-04/ray.whl.piece-03" && rm "$DL"/ray.whl.piece-*
cp "$DL"/*.whl "$ROOT/.gpu-stage/ray-04/" && rm "$ROOT"/.gpu-stage/ray-04/ray-*.whl
du -sh "$ROOT"/.gpu-stage/ray-0?
