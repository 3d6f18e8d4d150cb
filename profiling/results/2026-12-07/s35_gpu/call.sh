#!/bin/bash
# Thirty-fifth stop's device calls (run from the project root on one warm machine, back to back;
# the carry limit takes one vLLM part a call, so each of 1 and 2 only unpacks):
#   1: .stage/p1 (vLLM 0.26, ../shared/tools/vllm_stage.sh) into /tmp/site
#   2: .stage/p2 into /tmp/site
#   3: .stage/fi1 + fi2 (FlashInfer 0.6.14) into /tmp/fisite, then bench_prefill --quick with ours,
#      FlashInfer's kernel alone and vLLM's default GDN prefill sequence ("vllm_fi": its prep,
#      gather, FlashInfer, scatter), TP 1 and 2, eager and replayed from CUDA graphs.
# BENCH_S (default 420) bounds the bench, TPS (default 1,2) picks the head counts: a short call where
# little device time is left. Everything under $OUT/s35_<n>.tgz.
set -u
n=$1
OUT=${OUT:-/tmp/out}; W=/tmp/s35_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
. profiling/call_parts.sh
export PYTHONUNBUFFERED=1
case $n in
  1) bash .stage/p1/unpack.sh ;;
  2) bash .stage/p2/unpack.sh ;;
  3)
    device_facts
    { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
    test -d /tmp/site/vllm || echo "vLLM is not unpacked: the vllm_fi column will say so"
    export PYTHONPATH=/tmp/site:$PWD:$FI VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
    part bench_prefill ${BENCH_S:-420} python3 profiling/bench_prefill.py --out "$W" --quick --only ours,fi,vllm_fi \
      --tp ${TPS:-1,2} --no-sweep --no-fla
    grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" \
      | grep -E "ours B=256|FI off|FI ckpt B=256|vLLM default|CUDA graphs" | cut -c1-200
    grep -E "not compared|Error|error" "$W/bench_prefill.log" | cut -c1-200 | head -8
    parts_summary
    head -3 "$W/gpu.txt"
    tar -C "$W" -czf "$OUT/s35_$n.tgz" . ;;
esac
