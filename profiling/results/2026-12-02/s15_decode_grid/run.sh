#!/bin/bash
# Fifteenth stop, call 2 (after fj1): the decode kernel's flat grid (a row's tiles fastest) against
# the previous tree (.old: HEAD 96acc80's gdn_graphs and profiling) in one session, FlashInfer and
# fla-core beside them; the decode GPU tests first.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash .stage/fj2/unpack.sh > /dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
FI=/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
export PYTHONUNBUFFERED=1
PYTHONPATH=$PWD:/tmp/site:$FI timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider \
  -k "decode or spec" tests > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
(cd .old && PYTHONPATH=$PWD:/tmp/site:$FI timeout 150 python3 profiling/bench_decode.py --out "$OUT/old" \
  --no-sweep --no-stack --only ours > "$OUT/old.log" 2>&1); echo "old rc=$?"
PYTHONPATH=$PWD:/tmp/site:$FI timeout 240 python3 profiling/bench_decode.py --out "$OUT/new" \
  --no-sweep --no-stack --no-vllm > "$OUT/new.log" 2>&1; echo "new rc=$?"
tail -45 "$OUT/new.log" | grep -v "it/s"
grep -E "^\s*(1|2) " "$OUT/old.log" | head -40
