#!/bin/bash
# Thirty-third stop's device calls (run from the project root; everything under $OUT/s33_<n>.tgz).
#   1: the tree (the Gluon sequential kernel with a loader warp group): the GPU tests of
#      test_chunk, both Gluon kernels, the engine and the graphs; probe_ws.py on this tree and on
#      main's library (.stage/main_src/main.tgz, 2266253) on the same card; bench_prefill --quick
#      ours,fi TP 1/2 with FlashInfer 0.6.14 staged (the issue's ratios, on whatever card came).
#      (The tier's 200 s ran out after 22 tests passed: a cold start compiles every kernel.)
#   2: the tree with GLUON_MIN_PAIRS 32: the same GPU tests with 330 s, then bench_prefill.
#   3: the same GPU tests alone with 300 s (what the device time left allows).
#   4: the three tests call 1's tier did not reach, 120 s.
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s33_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
. profiling/call_parts.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
device_facts
{ for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
mkdir -p /tmp/mainsrc && tar -xzf .stage/main_src/main.tgz -C /tmp/mainsrc
if [ "$n" = 4 ]; then
  pytest_part tier 120 --durations=8 tests/test_engine.py::test_gpu_qwen3_next_decode_speedup tests/test_graphs.py
else
  pytest_part tier $(case $n in 1) echo 200;; 2) echo 330;; *) echo 300;; esac) --durations=8 tests/test_chunk.py tests/test_chunk_gluon.py \
    tests/test_chunk_intra_gluon.py tests/test_engine.py tests/test_graphs.py
fi
PR=profiling/results/2026-12-07/s33_gpu/probe_ws.py
if [ "$n" = 1 ]; then
  OUT=$W part probe_ws 110 python3 $PR ws
  OUT=$W PYTHONPATH=/tmp/mainsrc part probe_main 100 python3 $PR main
fi
wait
export PYTHONPATH=$PYTHONPATH:$FI
[ "$n" -lt 3 ] && part bench_prefill $(( $([ "$n" = 1 ] && echo 575 || echo 455) - ($(date +%s) - T0) )) python3 profiling/bench_prefill.py --out "$W" --quick \
  --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/tier.log" | tail -8
cat "$W"/probe_*.log 2>/dev/null | cut -c1-160 | tail -24
grep -A10 "slowest" "$W/tier.log" | cut -c1-120
grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90
parts_summary
head -3 "$W/gpu.txt"
tar -C "$W" -czf "$OUT/s33_$n.tgz" .
