#!/bin/bash
# Thirty-second stop's device calls (run from the project root; everything under $OUT/s32_<n>.tgz).
#   1: main: the GPU tests of both Gluon kernels (the bits test now on a NaN-filled workspace),
#      the engine and the graphs; bench_prefill --quick ours,fi TP 1/2 with FlashInfer 0.6.14
#      staged (the ratios on whatever card came; H200 is the issue's); then, if time is
#      left, bench_decode ours,fi (both pools, TP 1/2) for the decode figures on the same card.
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s32_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
. profiling/call_parts.sh
device_facts
case $n in
  1) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
     pytest_part tier 280 tests/test_chunk_gluon.py tests/test_chunk_intra_gluon.py tests/test_engine.py \
       tests/test_graphs.py
     wait
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_prefill 200 python3 profiling/bench_prefill.py --out "$W" --quick \
       --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     left=$(( 560 - ($(date +%s) - T0) ))
     [ "$left" -gt 60 ] && part bench_decode "$left" python3 profiling/bench_decode.py --out "$W" --quick \
       --only ours,fi,copy --tp 1,2 --no-sweep --no-fla --no-vllm --no-stack
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/tier.log" | tail -10
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90
     tail -30 "$W/bench_decode.log" 2>/dev/null | cut -c1-120 ;;
esac
head -3 "$W/gpu.txt"
tar -C "$W" -czf "$OUT/s32_$n.tgz" .
parts_summary
