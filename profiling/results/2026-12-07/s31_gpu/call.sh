#!/bin/bash
# Thirty-first stop's device calls (run from the project root; everything under $OUT/s31_<n>.tgz).
#   1: (library: own P landed from s30's own_p64.diff, plus OWN_QK: the sequential kernel
#      normalises q and k) both Gluon kernels' GPU tests, own_qk.py, bench_prefill --quick ours,fi
#      TP 1/2 (FlashInfer 0.6.14 staged), the engine and graphs GPU tests. The tree: own_p64.diff
#      and own_qk.diff applied to ca0beef (git status in gpu.txt).
#   2: (on the warm machine, a one-off command) bench_prefill --quick ours,fi TP 1/2 again with
#      OWN_QK switched off in chunk_intra_fwd_for: own P alone, as landed (into call2/)
#   3: main with own P landed (own_p64.diff's form: the seq kernel's q and k offsets constant, as
#      before OWN_QK): the GPU tests of both Gluon kernels, engine and graphs
#   4: main as landed: bench_prefill --quick ours,fi TP 1/2 (FlashInfer staged), for an H200's figures
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s31_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
D=profiling/results/2026-12-07/s31_gpu
. profiling/call_parts.sh  # FI, part, pytest_part, device_facts, parts_summary (the helpers these calls ran inline)
device_facts
case $n in
  1) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
     pytest_part gluon_tests 120 tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py
     part own_qk 200 env OUT="$W" python3 $D/own_qk.py
     wait
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_prefill 120 python3 profiling/bench_prefill.py --out "$W" --quick \
       --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     pytest_part engine_tests $(( 560 - ($(date +%s) - T0) )) tests/test_engine.py tests/test_graphs.py
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/gluon_tests.log" "$W/engine_tests.log" | tail -10
     cut -c1-400 "$W/own_qk.log" | tail -12
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90 ;;
  3) # main as landed (own P, no OWN_QK): the Gluon kernels' GPU tests, the engine and graphs
     pytest_part tier 300 tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py tests/test_engine.py \
       tests/test_graphs.py
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/tier.log" | tail -10 ;;
  4) # main as landed, whole prefill against FlashInfer 0.6.14 (staged: the tree slimmed to carry .stage/fi1, fi2)
     { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_prefill 200 python3 profiling/bench_prefill.py --out "$W" --quick \
       --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90 ;;
esac
head -3 "$W/gpu.txt"
tar -C "$W" -czf "$OUT/s31_$n.tgz" .
parts_summary
