#!/bin/bash
# Twenty-third stop: two device calls back to back on one warm machine (FlashInfer's parts
# .stage/fi1 then .stage/fi2 unpack into /tmp/fisite; /tmp survives ~30 s between calls).
# The twenty-first and twenty-second stops' patches (phases.patch, qk.patch; written and
# CPU-tested, never run on a GPU) are applied to the device's copy of the tree first.
#   1: fi1; the GPU tests of what the patches change (chunk, conv, engine); probe_phases.py
#      (TP 1, 2: P in 1, 2, 4, 8 at four knobs, every row checked bit for bit; no FlashInfer yet)
#   2: fi2; the FlashInfer path's GPU tests; bench_prefill --quick ours (the chunk_config rule)
#      beside FlashInfer's kernel and the FlashInfer path (TP 1, 2); the rest of the GPU tier
#   3, 4 (qk.patch alone: call 1's probe left the phases off; device time was short):
#   3: fi1; the short GPU test files (graphs, decode stack, safety, slots, spec placement)
#   4: fi2; the FlashInfer GPU tests; probe_fi_qk.py (conv + prefill step: the path on main, the
#      path with qk.patch, ours; FlashInfer's kernel alone beside); bench_prefill as in 2
#   5: calls 3 and 4's FlashInfer work in one call (device time was shorter still): fi1 and fi2b
#      (fi2 without the cuDNN frontend, which FlashInfer imports only inside try blocks, so both
#      parts fit one call's 64 MiB), the FlashInfer GPU tests, probe_fi_qk.py at TP 1 (200 s of device time were left)
# Everything under $OUT/s23_<n>.tgz; a summary last. Run from the project root.
set -u
n=$1
PATCHES="profiling/results/2026-12-04/s21_phases/phases.patch profiling/results/2026-12-04/s22_fi_qk/qk.patch"
[ "$n" -ge 3 ] && PATCHES=profiling/results/2026-12-04/s22_fi_qk/qk.patch  # calls 3, 4: qk alone
for PATCH in $PATCHES; do
  if git apply --check "$PATCH" 2>/dev/null; then git apply "$PATCH"
  elif ! git apply --check -R "$PATCH" 2>/dev/null; then echo "$PATCH neither applies nor is applied"; exit 3; fi
done
OUT=${OUT:-/tmp/out}; W=/tmp/s23_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
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
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; git log -1 --format=%h; git status --short; } > "$W/gpu.txt" 2>&1
case $n in
  1) bash .stage/fi1/unpack.sh > "$W/unpack.log" 2>&1
     tests tests_patched 270 tests/test_chunk.py tests/test_conv.py tests/test_engine.py
     part probe 230 python3 profiling/results/2026-12-04/s21_phases/probe_phases.py --out "$W"
     grep -E "FAILED|ERROR" "$W/tests_patched.log" | head -20
     tail -60 "$W/probe.log" ;;
  3) bash .stage/fi1/unpack.sh > "$W/unpack.log" 2>&1
     tests tests_rest 70 tests/test_graphs.py tests/test_decode_stack.py \
       tests/test_gpu_safety.py tests/test_vllm_slots.py tests/test_spec_placement.py
     grep -E "FAILED|ERROR" "$W/tests_rest.log" | head -20 ;;
  4) bash .stage/fi2/unpack.sh > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     tests tests_fi 100 tests/test_fi_core.py tests/test_fi_prefill.py
     part probe_fi_qk 110 env OUT="$W" python3 profiling/results/2026-12-05/s23_gpu/probe_fi_qk.py
     part bench_prefill 130 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi \
       --tp 1,2 --no-sweep --no-fla --no-vllm
     grep -E "FAILED|ERROR" "$W/tests_fi.log" | head -20
     tail -8 "$W/probe_fi_qk.log"
     grep -v "it/s" "$W/bench_prefill.log" | tail -45 ;;
  5) bash .stage/fi1/unpack.sh > "$W/unpack.log" 2>&1; bash .stage/fi2b/unpack.sh >> "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     tests tests_fi 80 tests/test_fi_core.py tests/test_fi_prefill.py
     part probe_fi_qk 85 env OUT="$W" PROBE_TPS=1 PROBE_REPS=2 python3 \
       profiling/results/2026-12-05/s23_gpu/probe_fi_qk.py
     grep -E "FAILED|ERROR" "$W/tests_fi.log" | head -20
     tail -6 "$W/probe_fi_qk.log" ;;
  2) bash .stage/fi2/unpack.sh > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     tests tests_fi 110 tests/test_fi_core.py tests/test_fi_prefill.py
     part bench_prefill 160 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi \
       --tp 1,2 --no-sweep --no-fla --no-vllm
     tests tests_rest 250 tests/test_graphs.py tests/test_decode_stack.py tests/test_gpu_safety.py \
       tests/test_vllm_slots.py tests/test_spec_engine.py tests/test_spec_lookahead.py \
       tests/test_spec_placement.py tests/test_decode.py tests/test_spec_gpu.py tests/test_profile.py
     grep -E "FAILED|ERROR" "$W/tests_fi.log" "$W/tests_rest.log" | head -20
     grep -v "it/s" "$W/bench_prefill.log" | tail -45 ;;
esac
tar -C "$W" -czf "$OUT/s23_$n.tgz" .
printf '%s\n' "${summary[@]}"
