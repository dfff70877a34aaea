#!/usr/bin/env bash
# The paper's table on a GPU, in one step: builds the Python package on this machine (pip without
# build isolation, as a machine without network access needs; the nanobind module only), then runs
# bench/bench_hf.py on CUDA (bf16, Sheared-LLaMA-1.3B's shape, 64 and 256 prompts; 7B's shape at
# 64 with --7b), writing bench/results/hf-cuda.md and .csv, then bench/bench_lm_eval.py where
# lm_eval is installed. Needs torch with CUDA, transformers >= 5.14,
# nanobind and scikit-build-core (or CMake >= 3.25 and a C++17 compiler, used directly when
# scikit-build-core is missing).
#   bench/gpu_hf.sh [--7b] [more bench_hf.py arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
extra=()
if [ "${1:-}" = "--7b" ]; then
  shift
  extra=(--model 7b --prompts 64)
fi

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
"$py" bench/bench_hf.py --device cuda "${extra[@]}" "$@"
# Evaluation with prepacking (bench/results/lm-eval-cuda.md) where lm-evaluation-harness is
# installed (pip install lm_eval): --model hf at auto, 32 and 64 against --model prepack.
if "$py" -c "import lm_eval" 2>/dev/null; then
  "$py" bench/bench_lm_eval.py --device cuda
else
  echo "gpu_hf: lm_eval not installed, bench/bench_lm_eval.py skipped"
fi
