#!/bin/bash
# Twenty-fourth stop's device calls (run from the project root; everything under $OUT/s24_<n>.tgz,
# a summary last).
#   1: qk.patch (profiling/results/2026-12-04/s22_fi_qk) applied to the device's copy; FlashInfer
#      in one call (.stage/fi1 + .stage/fi2b, as s23_gpu/call.sh 5); the FlashInfer GPU tests;
#      s23's probe_fi_qk.py at TP 1 and 2 (the path on main, with qk.patch, ours, FlashInfer's
#      kernel alone beside); bench_prefill --quick ours,fi at TP 1 and 2
#   2: main as it is (no patch); FlashInfer as in 1; probe_gluon_ws.py (does Gluon's
#      warp_specialize run a loader + wgmma pipeline on sm_90?); bench_decode with the same-bytes
#      copy column beside ours and FlashInfer's pool decode (fp32, bf16 pools; TP 1, 2): is the
#      95% of copy bandwidth at B = 64 reachable by a plain copy of those bytes?
#   3: main; FlashInfer as in 1; bench_prefill --quick ours,fi at TP 1 and 2 (call 2 came on an
#      H200, the issue's device: its one-run prefill table); the GPU test files that do not need
#      vLLM or the engines' long compiles (chunk, conv, decode, graphs, decode stack, safety,
#      spec on the GPU, FlashInfer)
set -u
n=$1
PATCH=profiling/results/2026-12-04/s22_fi_qk/qk.patch
if [ "$n" = 1 ]; then
  if git apply --check "$PATCH" 2>/dev/null; then git apply "$PATCH"
  elif ! git apply --check -R "$PATCH" 2>/dev/null; then echo "$PATCH neither applies nor is applied"; exit 3; fi
fi
OUT=${OUT:-/tmp/out}; W=/tmp/s24_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
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
  1) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     tests tests_fi 150 tests/test_fi_core.py tests/test_fi_prefill.py
     part probe_fi_qk 240 env OUT="$W" PROBE_TPS=1,2 PROBE_REPS=3 python3 \
       profiling/results/2026-12-05/s23_gpu/probe_fi_qk.py
     part bench_prefill 150 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi \
       --tp 1,2 --no-sweep --no-fla --no-vllm
     grep -E "FAILED|ERROR" "$W/tests_fi.log" | head -20
     tail -8 "$W/probe_fi_qk.log"
     grep -v "it/s" "$W/bench_prefill.log" | tail -40 ;;
  2) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part gluon_ws 150 env OUT="$W" python3 profiling/results/2026-12-05/s24_gpu/probe_gluon_ws.py
     part bench_decode 300 python3 profiling/bench_decode.py --out "$W" --no-sweep --no-stack \
       --only ours,fi,copy --tp 1,2
     tail -25 "$W/gluon_ws.log"
     grep -v "it/s" "$W/bench_decode.log" | tail -40 ;;
  3) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_prefill 170 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi \
       --tp 1,2 --no-sweep --no-fla --no-vllm
     tests tests_gpu 330 tests/test_chunk.py tests/test_conv.py tests/test_decode.py \
       tests/test_graphs.py tests/test_decode_stack.py tests/test_gpu_safety.py \
       tests/test_spec_gpu.py \
       tests/test_fi_core.py tests/test_fi_prefill.py
     grep -E "FAILED|ERROR" "$W/tests_gpu.log" | head -20
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256|via FI B=256 graph" ;;
esac
tar -C "$W" -czf "$OUT/s24_$n.tgz" .
printf '%s\n' "${summary[@]}"
