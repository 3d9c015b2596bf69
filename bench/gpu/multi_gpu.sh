#!/usr/bin/env bash
# Run THERE (GPU machine with 2+ GPUs, repo root), after `source bench/gpu/setup.sh`:
#   bash bench/gpu/multi_gpu.sh OUT_DIR [TEST …]
# runs the multi-GPU tests (default: all of them), each in its own pytest under a time limit
# so one hang costs one test file, with logs and JUnit XML in OUT_DIR. Runs that need Ray start
# a private local Ray from inside the run and shut down only that.
set -uo pipefail
OUT=${1:?usage: multi_gpu.sh OUT_DIR [TEST ...]}; shift
ROOT=$(pwd)
mkdir -p "$OUT"
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 VLLM_USE_FLASHINFER_SAMPLER=0
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=(
  "tests/trainers/test_trainer_worker.py::test_two_nccl_ranks_match_one_cpu_rank"
  "tests/engines/test_vllm_gpu.py::test_a_tensor_parallel_engine_takes_the_trainers_weights"
  "tests/trainers/test_multi_gpu.py"
)
nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$OUT/gpus.csv"
status=0
for test in "${TESTS[@]}"; do
  name=$(basename "${test%%::*}" .py)${test##*::}; name=${name//[^A-Za-z0-9_.-]/_}
  SECONDS=0
  # from /tmp: `python -m pytest` puts its cwd first on sys.path
  (cd /tmp && timeout -k 10 "${TIMEOUT_S:-480}" python3 -m pytest -q -s -m gpu -p no:cacheprovider \
     --rootdir "$ROOT" -c "$ROOT/pyproject.toml" --junitxml="$OUT/$name.xml" "$ROOT/$test") \
     > "$OUT/$name.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "$test: rc=$rc in ${SECONDS}s; $(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$OUT/$name.log" | tail -1)"
done
exit $status
