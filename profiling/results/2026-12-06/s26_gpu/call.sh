#!/bin/bash
# Twenty-sixth stop's device calls (run from the project root; everything under $OUT/s26_<n>.tgz,
# a summary last).
#   1: probe_gluon_seq.py (the Gluon sequential kernel with _seq_chunk's rounding order: the same
#      bits as the library's Triton kernel?), bench_decode (ours, ours under PDL, FlashInfer, copy;
#      TP 1 and 2, both pools, B 16-1024), the GPU tests of test_chunk_gluon and test_chunk (the
#      library's Gluon route), then bench_prefill --quick (ours, FlashInfer) if time is left
#   2: the whole GPU tier (the lists of 2026-12-04's two calls, 117 tests, and test_chunk_gluon.py)
#      on the tree with the Gluon route
#   3: bench_prefill --quick (ours with the route, FlashInfer) at TP 1 and 2
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s26_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
FI=/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
D=profiling/results/2026-12-06/s26_gpu
T0=$(date +%s)
summary=()
part() {  # part NAME TIMEOUT cmd...: run with a timeout into $W/NAME.log, keep its rc and time
  local name=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" "$@" > "$W/$name.log" 2>&1; local rc=$?
  summary+=("$name: rc=$rc in $(( $(date +%s) - t0 )) s")
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; git log -1 --format=%h; git status --short | grep -v "^ D " | head; } > "$W/gpu.txt" 2>&1
case $n in
  1) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1 &
     part gluon_seq 200 env OUT="$W" python3 $D/probe_gluon_seq.py
     part gpu_tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_chunk_gluon.py tests/test_chunk.py
     wait
     part bench_decode 220 env PYTHONPATH=$PYTHONPATH:$FI python3 profiling/bench_decode.py --out "$W" \
       --no-sweep --no-stack --only ours,fi,copy --tp 1,2 --batches 16,64,256,1024 --batches-tp2 16,64,256,1024
     if (( $(date +%s) - T0 < 390 )); then
       part bench_prefill $(( 560 - ($(date +%s) - T0) )) env PYTHONPATH=$PYTHONPATH:$FI python3 \
         profiling/bench_prefill.py --out "$W" --quick --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     fi
     grep -v "^ *File\|^    " "$W/gluon_seq.log" | grep -v "PASS$" | tail -32
     tail -15 "$W/gpu_tests.log"
     grep -A40 "^columns side by side" "$W/bench_decode.log" | grep -v "it/s" | head -45
     [ -f "$W/bench_prefill.log" ] && grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" \
       | grep -E "ours B=256|FI off|FI ckpt B=256|via FI B=256 graph" ;;
  2) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     tier() { local name=$1 t=$2; shift 2
       part "$name" "$t" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/$name.xml" "$@"; }
     tier tier_b 290 tests/test_chunk_gluon.py tests/test_chunk.py tests/test_conv.py tests/test_decode.py \
       tests/test_fi_core.py tests/test_fi_prefill.py tests/test_profile.py tests/test_spec_gpu.py
     tier tier_a 240 tests/test_engine.py tests/test_spec_engine.py tests/test_graphs.py tests/test_decode_stack.py \
       tests/test_spec_lookahead.py tests/test_spec_placement.py tests/test_vllm_slots.py tests/test_gpu_safety.py
     for f in tier_b tier_a; do grep -E "passed|failed|^FAILED|^ERROR" "$W/$f.log" | tail -8; done ;;
  3) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_prefill 400 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi --tp 1,2 \
       --no-sweep --no-fla --no-vllm
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256|knobs" ;;
esac
tar -C "$W" -czf "$OUT/s26_$n.tgz" .
printf '%s\n' "${summary[@]}"
