#!/bin/bash
# Thirtieth stop's device calls (run from the project root; everything under $OUT/s30_<n>.tgz).
#   1: the GPU tests of both Gluon kernels (test_chunk_intra_gluon's repeated-token bound tightened
#      last stop, not yet run on a GPU; test_chunk_gluon's bits test now runs the sequential kernel
#      making P itself after an intra kernel that did not store it), then own_p_probe.py (both with
#      own_p.diff applied to the library: the working tree of the call, reverted after it)
#   2: seq_variants.py (the sequential kernel: two CTAs an SM at bv 64, a three-stage ring, the
#      checkpoint slot loaded early, states stored in 16-byte runs), then both Gluon kernels' GPU
#      tests on main's tree
#   3: (library: the output tile through the v tile, GLUON_CONFIG at V tile 64) min_pairs.py, own_p64.py, the GPU
#      tier's list B and the engine / graphs tests (FlashInfer 0.6.14 staged: the tree slimmed to
#      carry .stage/fi1, fi2), bench_prefill --quick ours,fi TP 1/2 (the tier failed to collect:
#      test_spec_core.py, which test_spec_gpu imports, was left out of the slimmed tree; rerun on
#      the warm machine as call 4, a one-off command: pytest of the same files, into c4/)
#   5: (prepared, never run: no device time left; library: own_p64.diff applied) the two Gluon
#      kernels' GPU tests, bench_prefill --quick ours,fi TP 1/2, the engine and graphs GPU tests
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s30_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S29=profiling/results/2026-12-06/s29_gpu
D=profiling/results/2026-12-07/s30_gpu
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
  1) part gpu_tests 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/gpu_tests.xml" \
       tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py
     part own_p $(( 560 - ($(date +%s) - T0) )) env OUT="$W" python3 $D/own_p_probe.py
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/gpu_tests.log" | tail -8
     tail -8 "$W/own_p.log" | cut -c1-600 ;;
  2) part seq_variants 300 env OUT="$W" python3 $D/seq_variants.py
     part gpu_tests $(( 560 - ($(date +%s) - T0) )) python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
       --junitxml="$W/gpu_tests.xml" tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py
     tail -4 "$W/seq_variants.log" | cut -c1-900
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/gpu_tests.log" | tail -8 ;;
  3) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
     part min_pairs 120 env OUT="$W" python3 $D/min_pairs.py
     part own_p64 90 env OUT="$W" python3 $D/own_p64.py
     wait
     export PYTHONPATH=$PYTHONPATH:$FI
     part tier 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/tier.xml" \
       tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py tests/test_chunk.py tests/test_conv.py \
       tests/test_decode.py tests/test_fi_core.py tests/test_fi_prefill.py tests/test_profile.py \
       tests/test_spec_gpu.py tests/test_engine.py tests/test_graphs.py
     part bench_prefill $(( 585 - ($(date +%s) - T0) )) python3 profiling/bench_prefill.py --out "$W" --quick \
       --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     cut -c1-200 "$W/min_pairs.log" | tail -10
     cut -c1-300 "$W/own_p64.log" | tail -3
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/tier.log" | tail -10
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90 ;;
  5) { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
     part gluon_tests 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/gluon_tests.xml" \
       tests/test_chunk_intra_gluon.py tests/test_chunk_gluon.py
     wait
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_prefill 90 python3 profiling/bench_prefill.py --out "$W" --quick \
       --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
     part engine_tests $(( 190 - ($(date +%s) - T0) )) python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
       --junitxml="$W/engine_tests.xml" tests/test_engine.py tests/test_graphs.py
     grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/gluon_tests.log" "$W/engine_tests.log" | tail -10
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90 ;;
esac
cat "$W/gpu.txt" | head -3
tar -C "$W" -czf "$OUT/s30_$n.tgz" .
printf '%s\n' "${summary[@]}"
