#!/bin/bash
# Thirty-second stop's device calls (run from the project root; everything under $OUT/s32_<n>.tgz).
#   1: the tree with q and k as given and their row factors (rq, rk) in the workspace: the GPU
#      tests of test_chunk, both Gluon kernels (the bits test on a NaN-filled workspace), the
#      engine and the graphs; bench_prefill --quick ours,fi TP 1/2 with FlashInfer 0.6.14 staged;
#      then main's library and bench (2266253, carried as .stage/main_src/main.tgz) --only ours on
#      the same card, for the before/after.
#   2: bench_decode ours,fi,copy (both pools, TP 1/2) for the decode figures on this card.
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s32_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
. profiling/call_parts.sh
device_facts
case $n in
  1) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
     mkdir -p /tmp/mainsrc && tar -xzf .stage/main_src/main.tgz -C /tmp/mainsrc
     pytest_part tier 260 tests/test_chunk.py tests/test_chunk_gluon.py tests/test_chunk_intra_gluon.py \
       tests/test_engine.py tests/test_graphs.py
     wait
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_prefill 170 python3 profiling/bench_prefill.py --out "$W" --quick \
       --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     mkdir -p "$W/main"
     part bench_main $(( 570 - ($(date +%s) - T0) )) python3 /tmp/mainsrc/profiling/bench_prefill.py \
       --out "$W/main" --quick --only ours --tp 1,2 --no-sweep --no-fla --no-vllm
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/tier.log" | tail -10
     for f in "$W/bench_prefill.log" "$W/main/../bench_main.log"; do
       echo "== $f"; grep -v "it/s" "$f" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90
     done ;;
  2) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_decode 500 python3 profiling/bench_decode.py --out "$W" --quick \
       --only ours,fi,copy --tp 1,2 --no-sweep --no-fla --no-vllm --no-stack
     tail -40 "$W/bench_decode.log" | cut -c1-130 ;;
esac
head -3 "$W/gpu.txt"
tar -C "$W" -czf "$OUT/s32_$n.tgz" .
parts_summary
