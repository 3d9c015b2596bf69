#!/usr/bin/env bash
# Run THERE (GPU machine, repo root), after `source bench/gpu/setup.sh`: one demo family's GPU
# overlay, its numbers and curve copied to OUT as <machine>-<date>-<family>.{json,png}.
#   bash bench/gpu/demo.sh retool|deepeyes|search_r1 OUT [section.key=value ...]
# Brings along (carry) .gpu-stage/demo, which bench/gpu/stage_extra.sh writes: bubblewrap's .deb
# (the GPU image has no bwrap: unpacked with dpkg -x, user namespaces work there) and the demo
# wheels the image lacks (bm25s).
set -euo pipefail
family=$1 out=$2
shift 2
DEMO=${DEMO:-$(pwd)/.gpu-stage/demo}
if ! command -v bwrap >/dev/null; then
  for deb in "$DEMO"/*.deb; do dpkg -x "$deb" /; done
fi
for whl in "$DEMO"/*.whl; do
  [ -e "$whl" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site "$whl"
done
machine=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
stamp="${machine}-$(date -u +%F)-${family}"
run=/tmp/demo-$family
mkdir -p "$out"
set +e
python3 -m agentloop.cli demo --recipe "$family" --config "recipes/tiny_$family/gpu.yaml" \
  "demo.out_dir=$run" "$@" 2>&1 | tee "$out/$stamp.log" | grep -v "it/s\]$"
rc=${PIPESTATUS[0]}
set -e
[ -f "$run/demo_result.json" ] && cp "$run/demo_result.json" "$out/$stamp.json"
[ -f "$run/curve.png" ] && cp "$run/curve.png" "$out/$stamp.png"
exit "$rc"
