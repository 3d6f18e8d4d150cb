#!/bin/bash
# Twenty-first stop, one device call per argument (1, 2, 3), back to back on one warm machine for
# 1 and 2 (FlashInfer's parts .stage/fi1 then .stage/fi2 unpack into /tmp/fisite); 3 on any machine.
#   1: fi1; the GPU tests that need no FlashInfer (engines, graphs, decode stack, safety, chunk,
#      conv, decode, profile, spec kernels)
#   2: fi2; the FlashInfer path's GPU tests; probe_phases.py (TP 1, 2) with FlashInfer's kernel
#      beside ours; bench_prefill --quick ours + FlashInfer (TP 1, 2: the chunk_config rule)
#   3 (if device time is left): the chunk and engine GPU tests again, with the rule the probe
#      picked; bench_decode's quick sweep (ours, copy)
# (each part has a timeout: at most ~550 s a call; 1 + 2 + 3 at most ~1,700 s with two starts)
# Everything under $OUT/s21_<n>.tgz; a summary last. The phases (phases.patch, beside this file,
# not on main: written and CPU-tested on 2026-12-04, never run on a GPU) are applied to the device's
# copy of the tree first (each call gets a fresh copy); run from the project root.
# The twenty-second stop's patch (../s22_fi_qk/qk.patch: the conv l2-normalises q and k for the
# FlashInfer path and writes them into its workspace; written and CPU-tested, never run on a GPU)
# is applied too: its GPU tests are test_conv's and test_fi_core's, in calls 1 and 2.
set -u
for PATCH in profiling/results/2026-12-04/s21_phases/phases.patch \
             profiling/results/2026-12-04/s22_fi_qk/qk.patch; do
  if git apply --check "$PATCH" 2>/dev/null; then git apply "$PATCH"
  elif ! git apply --check -R "$PATCH" 2>/dev/null; then echo "$PATCH neither applies nor is applied"; exit 3; fi
done
n=$1; OUT=${OUT:-/tmp/out}; W=/tmp/s21_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
FI=/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
summary=()
part() {  # part NAME TIMEOUT cmd...: run with a timeout into $W/NAME.log, keep its rc and time
  local name=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" "$@" > "$W/$name.log" 2>&1; local rc=$?
  summary+=("$name: rc=$rc in $(( $(date +%s) - t0 )) s")
}
tests() {  # tests NAME TIMEOUT files...
  local name=$1 t=$2; shift 2
  part "$name" "$t" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/$name.xml" "$@"
  summary+=("   $(tail -1 "$W/$name.log")")
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; git log -1 --format=%h; } > "$W/gpu.txt" 2>&1
case $n in
  1) bash .stage/fi1/unpack.sh > "$W/unpack.log" 2>&1
     tests tests_a 300 tests/test_chunk.py tests/test_engine.py tests/test_graphs.py \
       tests/test_decode_stack.py tests/test_gpu_safety.py tests/test_vllm_slots.py \
       tests/test_spec_engine.py tests/test_spec_lookahead.py tests/test_spec_placement.py
     tests tests_b 230 tests/test_conv.py tests/test_decode.py tests/test_profile.py \
       tests/test_spec_gpu.py ;;
  2) bash .stage/fi2/unpack.sh > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     tests tests_fi 140 tests/test_fi_core.py tests/test_fi_prefill.py
     part probe 290 python3 profiling/results/2026-12-04/s21_phases/probe_phases.py --out "$W"
     part bench_prefill 120 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi \
       --tp 1,2 --no-sweep --no-fla --no-vllm
     tail -75 "$W/probe.log"; grep -v "it/s" "$W/bench_prefill.log" | tail -30 ;;
  3) tests tests_c 150 tests/test_chunk.py tests/test_engine.py
     part bench_decode 200 python3 profiling/bench_decode.py --out "$W" --quick --only ours,copy \
       --tp 1 --no-stack --batches 16,64,256,1024
     grep -v "it/s" "$W/bench_decode.log" | tail -60 ;;
esac
tar -C "$W" -czf "$OUT/s21_$n.tgz" .
printf '%s\n' "${summary[@]}"
