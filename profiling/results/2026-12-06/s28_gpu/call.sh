#!/bin/bash
# Twenty-eighth stop's device calls (run from the project root; everything under $OUT/s28_<n>.tgz,
# a summary last).
#   1: probe_intra.py (the transposed-sweep Gluon intra kernel against s27's and Triton's: bits,
#      speed), then the GPU tier's list B (kernels)
#   2: the GPU tier's list A (engine, graphs, speculative decoding, vLLM slots, safety), the
#      FlashInfer tests (skipped in call 1: not staged; here they did not collect, a test module
#      left out of the carried tree), bench_prefill --quick ours,fi TP 1/2 (FlashInfer 0.6.14 staged)
#   3: the FlashInfer tests, bench_prefill --quick ours,fi TP 1/2 again (FI's times moved from s27's)
#   4: on the committed kernel (P stored straight, call 1's new_pdirect): probe_intra.py and the
#      chunk files' GPU tests (call 1's tier B ran the variant with P through the coalesced layout)
#   5: fi_timing.py: FlashInfer's prefill and ours, eager / in a CUDA graph / host time per call
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s28_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
FI=/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
D=profiling/results/2026-12-06/s28_gpu
T0=$(date +%s)
summary=()
part() {  # part NAME TIMEOUT cmd...: run with a timeout into $W/NAME.log, keep its rc and time
  local name=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" "$@" > "$W/$name.log" 2>&1; local rc=$?
  summary+=("$name: rc=$rc in $(( $(date +%s) - t0 )) s")
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; git log -1 --format=%h; git status --short | grep -v "^ D " | head; } > "$W/gpu.txt" 2>&1
case $n in
  1) part probe 150 env OUT="$W" python3 $D/probe_intra.py
     part tier_b $(( 580 - ($(date +%s) - T0) )) python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
       --junitxml="$W/tier_b.xml" tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py tests/test_chunk.py \
       tests/test_conv.py tests/test_decode.py tests/test_fi_core.py tests/test_fi_prefill.py tests/test_profile.py \
       tests/test_spec_gpu.py
     tail -24 "$W/probe.log"
     grep -E "passed|failed|^FAILED|^ERROR" "$W/tier_b.log" | tail -8 ;;
  2) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
     part tier_a 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/tier_a.xml" \
       tests/test_engine.py tests/test_spec_engine.py tests/test_graphs.py tests/test_decode_stack.py \
       tests/test_spec_lookahead.py tests/test_spec_placement.py tests/test_vllm_slots.py tests/test_gpu_safety.py
     wait
     part fi_tests 150 env PYTHONPATH=$PYTHONPATH:$FI python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
       --junitxml="$W/fi_tests.xml" tests/test_fi_core.py tests/test_fi_prefill.py
     part bench_prefill $(( 585 - ($(date +%s) - T0) )) env PYTHONPATH=$PYTHONPATH:$FI python3 \
       profiling/bench_prefill.py --out "$W" --quick --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     grep -E "passed|failed|^FAILED|^ERROR" "$W/tier_a.log" "$W/fi_tests.log" | tail -8
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90 ;;
  3) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part fi_tests 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/fi_tests.xml" \
       tests/test_fi_core.py tests/test_fi_prefill.py
     part bench_prefill 200 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi --tp 1,2 \
       --no-sweep --no-fla --no-vllm
     grep -E "passed|failed|^FAILED|^ERROR" "$W/fi_tests.log" | tail -8
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90 ;;
  4) part probe 150 env OUT="$W" python3 $D/probe_intra.py
     part gpu_tests 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/gpu_tests.xml" \
       tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py tests/test_chunk.py
     tail -10 "$W/probe.log"
     grep -E "passed|failed|^FAILED|^ERROR" "$W/gpu_tests.log" | tail -8 ;;
  5) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
     part fi_timing 400 env OUT="$W" PYTHONPATH=$PYTHONPATH:$FI python3 $D/fi_timing.py
     cat "$W/fi_timing.log" | grep -v Warn | tail -24 ;;
esac
tar -C "$W" -czf "$OUT/s28_$n.tgz" .
printf '%s\n' "${summary[@]}"
