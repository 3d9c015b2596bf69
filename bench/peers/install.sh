#!/usr/bin/env bash
# Run THERE (GPU machine, repo root), after `source bench/gpu/setup.sh` (vLLM, Ray, agentloop):
#   bash bench/peers/install.sh [.gpu-stage/peers]
# checks the staged wheels against MANIFEST and installs each peer into its own dir with
# --no-index --no-deps (/tmp/peer-trl, /tmp/peer-verl), so they never mix with each other or with
# /tmp/site; race.py puts a peer's dir first on the PYTHONPATH of that peer's process only.
set -euo pipefail
SRC=${1:-.gpu-stage/peers}
(cd "$SRC" && sha256sum --quiet -c MANIFEST)
for peer in trl verl; do
  rm -rf "/tmp/peer-$peer"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "/tmp/peer-$peer" "$SRC/$peer"/*.whl > "/tmp/peer-$peer.pip.log" 2>&1 \
    || { cat "/tmp/peer-$peer.pip.log"; exit 4; }
done
PEERS=$PWD/bench/peers  # run from the repo root: the multi variant's loops import from it
cd /tmp  # the repo root's agentloop/ must not shadow anything
PYTHONPATH=/tmp/peer-trl:${PYTHONPATH:-} python3 -W ignore -c \
  'import trl, vllm, transformers; from trl import GRPOConfig, GRPOTrainer; print("trl", trl.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__)'
# vllm.entrypoints.*: what verl's replicas import when their vLLM server builds its app (lazily:
# a missing dependency shows there only after Ray and the workers have started)
PYTHONPATH=/tmp/peer-verl:${PYTHONPATH:-} python3 -W ignore -c \
  'import verl, ray, transformers, tensordict, transfer_queue; import verl.trainer.main_ppo, verl.trainer.ppo.v1.trainer_sync, verl.workers.rollout.vllm_rollout.vllm_async_server; import vllm.entrypoints.serve.instrumentator.metrics, vllm.entrypoints.generate.api_router, vllm.entrypoints.serve.sagemaker.api_router, vllm.entrypoints.scale_out.factories; print("verl", verl.__version__, "ray", ray.__version__, "transformers", transformers.__version__)'
PYTHONPATH=/tmp/peer-verl:${PYTHONPATH:-}:$PEERS python3 -W ignore -c \
  'import verl_race_loop, trl_turns; print("multi-variant loops import: verl_race_loop, trl_turns")'
