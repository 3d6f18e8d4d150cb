#!/bin/bash
# Twenty-fifth stop's device calls (run from the project root; everything under $OUT/s25_<n>.tgz,
# a summary last).
#   1: probe_gluon_seq.py: the Gluon sequential kernel (gluon_seq.py) against the library's on one
#      workspace (correctness, warm == cold, speed at TP 1 and 2)
#   2: as 1 after fixes; probe_decode_fp32.py (decode variants beside FlashInfer's fp32 decode)
#   3: as 1 with four Gluon variants (V tile 128 / 64, output staged / stored straight from the
#      accumulator: 64 + straight = 112 KB of shared memory, two CTAs an SM); probe_decode_fp32.py
#      with the library kernel under PDL (as the runtime launches it) beside FlashInfer, B 16-1024
#   4: bench_decode (ours, ours under PDL: the new column, FlashInfer, copy; TP 1 and 2, fp32 and
#      bf16 pools) and bench_prefill --quick (ours, FlashInfer) at TP 1 and 2: the tables
#      (never ran: no H200 came)
#   5: bench_decode alone, B 16-1024 at TP 1 and 2 (its new +PDL column's first GPU run)
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s25_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
FI=/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
D=profiling/results/2026-12-05/s25_gpu
summary=()
part() {  # part NAME TIMEOUT cmd...: run with a timeout into $W/NAME.log, keep its rc and time
  local name=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" "$@" > "$W/$name.log" 2>&1; local rc=$?
  summary+=("$name: rc=$rc in $(( $(date +%s) - t0 )) s")
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; git log -1 --format=%h; git status --short | grep -v "^ D " | head; } > "$W/gpu.txt" 2>&1
case $n in
  1) part gluon_seq 240 env OUT="$W" python3 $D/probe_gluon_seq.py
     grep -v "^ *File\|^    " "$W/gluon_seq.log" | tail -40 ;;
  2) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     part gluon_seq 240 env OUT="$W" python3 $D/probe_gluon_seq.py
     part decode_fp32 150 env OUT="$W" PYTHONPATH=$PYTHONPATH:$FI python3 $D/probe_decode_fp32.py
     grep -v "^ *File\|^    " "$W/gluon_seq.log" | tail -30
     tail -40 "$W/decode_fp32.log" ;;
  3) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     part gluon_seq 240 env OUT="$W" python3 $D/probe_gluon_seq.py
     part decode_fp32 200 env OUT="$W" PYTHONPATH=$PYTHONPATH:$FI python3 $D/probe_decode_fp32.py \
       --only lib_pdl,fi,copy,tcopy --batches 16,64,256,1024
     grep -v "^ *File\|^    " "$W/gluon_seq.log" | grep -v "PASS$" | tail -30
     grep -A16 "^% of copy" "$W/decode_fp32.log" ;;
  5) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_decode 280 python3 profiling/bench_decode.py --out "$W" --no-sweep --no-stack \
       --only ours,fi,copy --tp 1,2 --batches 16,64,256,1024 --batches-tp2 16,64,256,1024
     grep -A40 "^columns side by side" "$W/bench_decode.log" | grep -v "it/s" | head -45 ;;
  4) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     export PYTHONPATH=$PYTHONPATH:$FI
     part bench_decode 260 python3 profiling/bench_decode.py --out "$W" --no-sweep --no-stack \
       --only ours,fi,copy --tp 1,2
     part bench_prefill 170 python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi \
       --tp 1,2 --no-sweep --no-fla --no-vllm
     grep -A40 "^columns side by side" "$W/bench_decode.log" | grep -v "it/s" | head -45
     grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256|via FI B=256 graph" ;;
esac
tar -C "$W" -czf "$OUT/s25_$n.tgz" .
printf '%s\n' "${summary[@]}"
