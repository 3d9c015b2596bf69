#!/usr/bin/env bash
# Run THERE (GPU machine, repo root), after shared/gpu's install.sh has put vLLM in /tmp/site:
#   source bench/gpu/setup.sh
# installs the staged extra wheels the image lacks (and Ray, when staged) into /tmp/site and makes `import agentloop`
# work without pip (a link tree maps tools/, envs/, trainers/, sandboxes/ under agentloop/,
# as pyproject's package-dir does).
REPO=$(pwd)
EXTRA=${EXTRA:-$REPO/.gpu-stage/extra}
mkdir -p /tmp/site
for whl in "$EXTRA"/*.whl; do  # keep the image's own copy of a package when it has one
  dist=$(basename "$whl" | cut -d- -f1)
  python3 -c "import importlib.metadata as m; m.version('$dist')" 2>/dev/null \
    || python3 -m pip install -q --no-index --no-deps --target /tmp/site "$whl"
done
# Ray (multi-GPU runs), once its pieces are stashed (stage_ray.sh, ray_parts.sh)
if [ -f /root/persist/ray/ray.sha256 ] && [ ! -d /tmp/site/ray ]; then
  bash "$REPO/bench/gpu/ray_parts.sh" install
fi
rm -rf /tmp/alpkg && mkdir -p /tmp/alpkg/agentloop
for f in "$REPO"/agentloop/*; do ln -s "$f" /tmp/alpkg/agentloop/; done
for sub in tools envs trainers sandboxes; do ln -sfn "$REPO/$sub" "/tmp/alpkg/agentloop/$sub"; done
export PYTHONPATH=/tmp/alpkg:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
echo "agentloop importable from /tmp/alpkg; extras in /tmp/site"
