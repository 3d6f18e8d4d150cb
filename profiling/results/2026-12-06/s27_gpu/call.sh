#!/bin/bash
# Twenty-seventh stop's device calls (run from the project root; everything under $OUT/s27_<n>.tgz,
# a summary last).
#   1: probe_gluon_intra.py (the Gluon intra kernel against Triton's: numerics, speed), the GPU
#      tests of the chunk files (now on the Gluon intra route), bench_prefill --quick ours,fi TP 1/2
#   2: probe_gluon_intra.py again (the kernel with fewer registers), the GPU tier's list B (kernels),
#      bench_prefill --quick ours,fi TP 1/2
#   3: the GPU tier's list A (engine, graphs, speculative decoding, vLLM slots, safety) and
#      test_profile.py again (its ncu test now expects the Hopper intra kernel)
#   4: probe_gluon_intra.py with the row steps on the Triton kernel's layout (mirror) and on a
#      lane per column, D - N T as Triton forms it; the chunk files' GPU tests
#   5: ncu --set full on one launch each of the Triton and Gluon intra kernels and the Gluon seq
#      kernel at TP-1 8 x 2048 (ncu_intra.py)
#   6: probe_gluon_intra.py and the chunk files' GPU tests with a_s swizzled (bank conflicts)
#   7: bench_prefill --quick ours,fi TP 1/2 on that kernel
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s27_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
FI=/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
D=profiling/results/2026-12-06/s27_gpu
T0=$(date +%s)
summary=()
part() {  # part NAME TIMEOUT cmd...: run with a timeout into $W/NAME.log, keep its rc and time
  local name=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" "$@" > "$W/$name.log" 2>&1; local rc=$?
  summary+=("$name: rc=$rc in $(( $(date +%s) - t0 )) s")
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; git log -1 --format=%h; git status --short | grep -v "^ D " | head; } > "$W/gpu.txt" 2>&1
case $n in
  1) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
     part probe 150 env OUT="$W" python3 $D/probe_gluon_intra.py
     part gpu_tests 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_chunk_intra_gluon.py \
       tests/test_chunk.py tests/test_chunk_gluon.py
     wait
     if (( $(date +%s) - T0 < 400 )); then
       part bench_prefill $(( 570 - ($(date +%s) - T0) )) env PYTHONPATH=$PYTHONPATH:$FI python3 \
         profiling/bench_prefill.py --out "$W" --quick --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     fi
     cat "$W/probe.log" | tail -30
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/gpu_tests.log" | tail -12
     [ -f "$W/bench_prefill.log" ] && grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" \
       | grep -E "ours B=256|FI off|FI ckpt B=256" ;;
  2) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part probe 120 env OUT="$W" python3 $D/probe_gluon_intra.py
     part tier_b 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/tier_b.xml" \
       tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py tests/test_chunk.py tests/test_conv.py \
       tests/test_decode.py tests/test_fi_core.py tests/test_fi_prefill.py tests/test_profile.py tests/test_spec_gpu.py
     if (( $(date +%s) - T0 < 480 )); then
       part bench_prefill $(( 590 - ($(date +%s) - T0) )) python3 profiling/bench_prefill.py --out "$W" --quick \
         --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     fi
     cat "$W/probe.log" | tail -32
     grep -E "passed|failed|^FAILED|^ERROR" "$W/tier_b.log" | tail -8
     [ -f "$W/bench_prefill.log" ] && grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" \
       | grep -E "ours B=256|FI off |FI ckpt B=256" ;;
  3) tier_a() { part tier_a 400 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/tier_a.xml" "$@"; }
     tier_a tests/test_engine.py tests/test_spec_engine.py tests/test_graphs.py tests/test_decode_stack.py \
       tests/test_spec_lookahead.py tests/test_spec_placement.py tests/test_vllm_slots.py tests/test_gpu_safety.py \
       tests/test_profile.py
     grep -E "passed|failed|^FAILED|^ERROR" "$W/tier_a.log" | tail -8 ;;
  4) part probe 120 env OUT="$W" python3 $D/probe_gluon_intra.py
     part gpu_tests 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_chunk_intra_gluon.py \
       tests/test_chunk.py tests/test_chunk_gluon.py
     cat "$W/probe.log" | tail -30
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/gpu_tests.log" | tail -12 ;;
  7) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
     part bench_prefill 200 env PYTHONPATH=$PYTHONPATH:$FI python3 profiling/bench_prefill.py --out "$W" --quick \
       --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90 ;;
  6) part probe 120 env OUT="$W" python3 $D/probe_gluon_intra.py
     part gpu_tests 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_chunk_intra_gluon.py \
       tests/test_chunk.py tests/test_chunk_gluon.py
     cat "$W/probe.log" | tail -20
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/gpu_tests.log" | tail -12 ;;
  5) NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
     part ncu 400 "$NCU" --profile-from-start off --set full --target-processes all -o "$W/intra" -f \
       python3 $D/ncu_intra.py
     part ncu_print 100 "$NCU" --import "$W/intra.ncu-rep" --print-summary none --page details
     grep -E "^  [_a-z]|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|No Eligible|One or More|Warp Cycles Per Issued|Active Warps Per|Eligible Warps|L1/TEX Hit|Mem Busy|Max Bandwidth|Shared Memory Configuration Size|Dynamic Shared|Stall|stall" "$W/ncu_print.log" | head -150 ;;
esac
tar -C "$W" -czf "$OUT/s27_$n.tgz" .
printf '%s\n' "${summary[@]}"
