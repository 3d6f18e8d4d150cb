#!/usr/bin/env bash
# One device call: GPU tests + benchmarks, a short table printed last, everything under $OUT.
#   run(command="bash profiling/gpu_session.sh [tests|bench|all] [pytest -k expr]", carry=[".whl"])
# .whl holds wheels the GPU image lacks (nvtx, fla-core) for Python 3.12; see profiling/README.md.
set -uo pipefail
what=${1:-all}; kexpr=${2:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  t0=$(date +%s)
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider ${kexpr:+-k "$kexpr"} \
    -rP --junitxml="$OUT/gpu_tests.xml" tests 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|Error|error|FAIL" | tail -40
  rc=${PIPESTATUS[0]}
  echo "gpu tests: rc=$rc in $(( $(date +%s) - t0 )) s"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for b in bench_decode bench_prefill; do
    [ -f "profiling/$b.py" ] || continue
    t0=$(date +%s)
    timeout "${BENCH_TIMEOUT:-200}" python3 "profiling/$b.py" --out "$OUT" > "$OUT/$b.log" 2>&1; brc=$?
    echo "$b: rc=$brc in $(( $(date +%s) - t0 )) s"; tail -25 "$OUT/$b.log"
  done
fi
exit $rc
