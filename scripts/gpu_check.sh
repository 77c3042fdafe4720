#!/usr/bin/env bash
# The GPU check, one command: the `cuda` tests, then scripts/bench.py on every workload with both engines,
# plain and with each fast path (bf16, channels-last, compile, TF32), then a 64-job sweep stacked vs one after
# another (scripts/bench_stacked.sh gpu), every table into one folder.
#   bash scripts/gpu_check.sh [OUT_DIR]      (default: $OUT, else gpu_check/)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu_check}}
mkdir -p "$out"
nvidia-smi > "$out/nvidia_smi.txt" 2>&1
"${PYTHON:-python3}" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py > "$out/cuda_tests.txt" 2>&1
echo "cuda tests: $(tail -n 1 "$out/cuda_tests.txt")"
for flags in "" "--precision bf16" "--channels-last" "--compile" "--tf32"; do
  name=bench${flags// /_}
  "${PYTHON:-python3}" scripts/bench.py --device cuda --rounds 3 --data-root "${FEDAGG_DATA:-data}" $flags > "$out/${name//--/_}.txt" 2>&1
  echo "bench ${flags:-(fp32)}: done"; tail -n 12 "$out/${name//--/_}.txt"
done
# a sweep trained together: 64 jobs of MNIST cnn_small cross-device, stacked vs one after another
PYTHON="${PYTHON:-python3}" FEDAGG_DATA="${FEDAGG_DATA:-data}" bash scripts/bench_stacked.sh gpu "$out/stacked"
cat "$out/stacked/times.txt"
