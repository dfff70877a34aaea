#!/usr/bin/env bash
# The paper's table on a GPU, in one step: builds the Python package on this machine (pip without
# build isolation, as a machine without network access needs; the nanobind module only), then runs
# bench/bench_hf.py on CUDA (bf16, Sheared-LLaMA-1.3B's shape, 64 and 256 prompts; 7B's shape at
# 64 with --7b), writing hf-cuda.md and .csv, then bench/bench_lm_eval.py where lm_eval is
# installed (lm-eval-cuda.md). Needs torch with CUDA, transformers >= 5.14,
# nanobind and scikit-build-core (or CMake >= 3.25 and a C++17 compiler, used directly when
# scikit-build-core is missing).
#   bench/gpu_hf.sh [--7b] [--out DIR] [--no-lm-eval] [more bench_hf.py arguments]
# --out: where the reports go (default bench/results); bench_hf.py rewrites its report after
# each prompt count, so a run stopped by a time limit keeps the counts it finished.
# --no-lm-eval: the transformers table only.
# On a lent machine whose files come back from $OUT, in one call (its length on a GPU is not yet
# measured: give it the call's whole limit; the 64-prompt report is written first):
#   PYTHONUNBUFFERED=1 bench/gpu_hf.sh --out "$OUT" --no-lm-eval
# Before device time is spent on it: python/tests/test_hf_device.py runs both benchmarks' CUDA
# paths on a CPU (a virtual CUDA device); it passes on CI's stack and on the one such machines
# hold (torch 2.11, transformers 5.17).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
extra=()
out=bench/results
lm_eval=1
while [ $# -gt 0 ]; do
  case "$1" in
    --7b) extra+=(--model 7b --prompts 64); shift ;;
    --out) out=${2:?gpu_hf: --out needs a folder}; shift 2 ;;
    --no-lm-eval) lm_eval=0; shift ;;
    *) break ;;
  esac
done
mkdir -p "$out"

if "$py" -c "import scikit_build_core" 2>/dev/null; then
  "$py" -m pip install --quiet --no-build-isolation --no-deps .
else
  echo "gpu_hf: scikit-build-core missing, building the module with CMake"
  cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v "$py")" \
    -DPREPACK_PYTHON=ON -DPREPACK_BUILD_TESTS=OFF -DPREPACK_BUILD_BENCH=OFF \
    -DPREPACK_BUILD_EXAMPLES=OFF -DPREPACK_INSTALL=OFF -DPREPACK_REFERENCE=OFF \
    -DPREPACK_CHECKPOINT=OFF -DPREPACK_TEXT=OFF -DPREPACK_NATIVE=OFF >/dev/null
  cmake --build build/gpu --target _prepack -j "$(nproc)"
  export PYTHONPATH="$PWD/build/gpu/python${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
echo "gpu_hf: package built after ${SECONDS} s"
"$py" bench/bench_hf.py --device cuda --out "$out" "${extra[@]}" "$@"
echo "gpu_hf: bench_hf.py done after ${SECONDS} s"
# Evaluation with prepacking (bench/results/lm-eval-cuda.md) where lm-evaluation-harness is
# installed (pip install lm_eval): --model hf at auto, 32 and 64 against --model prepack.
if [ "$lm_eval" = 0 ]; then
  echo "gpu_hf: bench/bench_lm_eval.py left out (--no-lm-eval)"
elif "$py" -c "import lm_eval" 2>/dev/null; then
  "$py" bench/bench_lm_eval.py --device cuda --out "$out"
  echo "gpu_hf: bench_lm_eval.py done after ${SECONDS} s"
else
  echo "gpu_hf: lm_eval not installed, bench/bench_lm_eval.py skipped"
fi
