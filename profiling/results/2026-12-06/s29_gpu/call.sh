#!/bin/bash
# Twenty-ninth stop's device calls (run from the project root; everything under $OUT/s29_<n>.tgz).
#   1: probe_phases.py (clock64 phases of the Gluon intra and sequential kernels; the intra kernel
#      with fp16 sweeps, ex2.ftz decays and its loads first against s28's), then the chunk files'
#      GPU tests
#   2: probe_phases.py again (with the sequential kernel's gates-first variant), the GPU tier's list B
#      (kernels; FlashInfer 0.6.14 staged), bench_prefill --quick ours,fi TP 1/2
#   3: repeated_token_err.py, test_chunk_intra_gluon.py again (its repeated-token test rewritten after
#      call 2), the GPU tier's list A (engine, graphs, speculative decoding, vLLM slots, safety)
#   4: (prepared, never run: the session's device time ran out) bytes_probe.py (each kernel with some of its global traffic removed: is memory its pace?; the
#      sequential kernel computing P itself: its bits and speed)
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s29_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
D=profiling/results/2026-12-06/s29_gpu
FI=/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
T0=$(date +%s)
summary=()
part() {  # part NAME TIMEOUT cmd...: run with a timeout into $W/NAME.log, keep its rc and time
  local name=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" "$@" > "$W/$name.log" 2>&1; local rc=$?
  summary+=("$name: rc=$rc in $(( $(date +%s) - t0 )) s")
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv; git log -1 --format=%h; git status --short | head; } > "$W/gpu.txt" 2>&1
case $n in
  1) part probe 240 env OUT="$W" python3 $D/probe_phases.py
     part gpu_tests $(( 570 - ($(date +%s) - T0) )) python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
       --junitxml="$W/gpu_tests.xml" tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py tests/test_chunk.py
     tail -16 "$W/probe.log"
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/gpu_tests.log" | tail -12 ;;
  2) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
     part probe 200 env OUT="$W" python3 $D/probe_phases.py
     wait
     export PYTHONPATH=$PYTHONPATH:$FI
     part tier_b 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
       --junitxml="$W/tier_b.xml" tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py tests/test_chunk.py \
       tests/test_conv.py tests/test_decode.py tests/test_fi_core.py tests/test_fi_prefill.py tests/test_profile.py \
       tests/test_spec_gpu.py
     part bench_prefill $(( 585 - ($(date +%s) - T0) )) python3 profiling/bench_prefill.py --out "$W" --quick \
       --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     grep -v "^{" "$W/probe.log" | grep -E "^[0-9]|seq |intra \(" | cut -c1-250
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/tier_b.log" | tail -10
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90 ;;
  4) part bytes 150 env OUT="$W" python3 $D/bytes_probe.py
     cat "$W/bytes.log" | tail -6 ;;
  3) part rep_err 60 env PYTHONPATH=$PYTHONPATH:tests python3 $D/repeated_token_err.py
     part intra_tests 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_chunk_intra_gluon.py
     part tier_a 400 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/tier_a.xml" \
       tests/test_engine.py tests/test_spec_engine.py tests/test_graphs.py tests/test_decode_stack.py \
       tests/test_spec_lookahead.py tests/test_spec_placement.py tests/test_vllm_slots.py tests/test_gpu_safety.py
     cat "$W/rep_err.log" | tail -24
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/intra_tests.log" "$W/tier_a.log" | tail -12 ;;
esac
cat "$W/gpu.txt" | head -3
tar -C "$W" -czf "$OUT/s29_$n.tgz" .
printf '%s\n' "${summary[@]}"
