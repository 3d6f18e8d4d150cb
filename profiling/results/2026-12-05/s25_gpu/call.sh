#!/bin/bash
# Twenty-fifth stop's device calls (run from the project root; everything under $OUT/s25_<n>.tgz,
# a summary last).
#   1: probe_gluon_seq.py: the Gluon sequential kernel (gluon_seq.py) against the library's on one
#      workspace (correctness, warm == cold, speed at TP 1 and 2)
#   2: as 1 after fixes; probe_decode_fp32.py (decode variants beside FlashInfer's fp32 decode)
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
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; git log -1 --format=%h; git status --short; } > "$W/gpu.txt" 2>&1
case $n in
  1) part gluon_seq 240 env OUT="$W" python3 $D/probe_gluon_seq.py
     grep -v "^ *File\|^    " "$W/gluon_seq.log" | tail -40 ;;
  2) { bash .stage/fi1/unpack.sh; bash .stage/fi2b/unpack.sh; } > "$W/unpack.log" 2>&1
     part gluon_seq 240 env OUT="$W" python3 $D/probe_gluon_seq.py
     part decode_fp32 150 env OUT="$W" PYTHONPATH=$PYTHONPATH:$FI python3 $D/probe_decode_fp32.py
     grep -v "^ *File\|^    " "$W/gluon_seq.log" | tail -30
     tail -40 "$W/decode_fp32.log" ;;
esac
tar -C "$W" -czf "$OUT/s25_$n.tgz" .
printf '%s\n' "${summary[@]}"
