#!/bin/bash
# Thirty-fourth stop's third device call: main's library (f9306a3's) with bench_prefill timing
# ours and FlashInfer's non-CP kernels replayed from CUDA graphs beside the eager figures:
# --quick ours,fi TP 1/2 with FlashInfer 0.6.14 staged. Everything under $OUT/s34_3.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/s34_3; rm -rf "$W"; mkdir -p "$W" "$OUT"
. profiling/call_parts.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
device_facts
{ for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
export PYTHONPATH=$PYTHONPATH:$FI
part bench_prefill 200 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi --tp 1,2 --no-sweep \
  --no-fla --no-vllm
grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256|CUDA graphs" | cut -c1-160
parts_summary
head -3 "$W/gpu.txt"
tar -C "$W" -czf "$OUT/s34_3.tgz" .
