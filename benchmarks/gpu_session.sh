#!/usr/bin/env bash
# One device-tool call: the CUDA test folder, the GPU benchmark, the overhead probe.  Logs go to $OUT.
#   run: bash benchmarks/gpu_session.sh [tests|bench|probe|tests+probe|all]  (on the GPU machine, repo root)
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/fxwrap-gpu}"
mkdir -p "$OUT"
what="${1:-all}"
# registers the "fxwrap" dynamo backend (entry point) on a fresh machine; no dependencies fetched
python -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
if [[ "$what" == tests || "$what" == all || "$what" == tests+probe ]]; then
  timeout 300 python -m pytest -q -x -p no:cacheprovider tests/cuda > "$OUT/tests_cuda.log" 2>&1
  echo "tests/cuda rc=$?" >> "$OUT/gpu.txt"
fi
if [[ "$what" == bench || "$what" == all ]]; then
  timeout 420 python benchmarks/compare.py --device cuda --json "$OUT/bench_cuda.json" > "$OUT/bench_cuda.txt" 2>&1
  echo "compare.py rc=$?" >> "$OUT/gpu.txt"
fi
if [[ "$what" == probe || "$what" == all || "$what" == tests+probe ]]; then
  timeout 300 python benchmarks/overhead_probe.py --calls --compile > "$OUT/probe.txt" 2>&1
  echo "overhead_probe.py rc=$?" >> "$OUT/gpu.txt"
fi
cat "$OUT/gpu.txt"
tail -n 5 "$OUT/tests_cuda.log" 2>/dev/null
tail -n 30 "$OUT/bench_cuda.txt" 2>/dev/null
tail -n 45 "$OUT/probe.txt" 2>/dev/null
