#!/bin/bash
# Thirty-seventh stop's device calls (from the project root, on one warm machine, back to back):
#   1: .stage/p1 (vLLM 0.26) into /tmp/site        2: .stage/p2 into /tmp/site
#   3: .stage/fi1 + fi2 (FlashInfer 0.6.14); the GPU tier of the chunked prefill (every config's
#      bits against the default's); probe_configs.py; bench_prefill --quick for one sequence of
#      8,192 and 32,768 tokens with ours (chunk_config now takes a V tile of 16 at HV 16),
#      FlashInfer's kernel and vLLM's default GDN prefill sequence, TP 1 and 2.
#   4: (no carry, where little device time is left) the GPU tier of the chunked prefill and
#      probe_configs.py only.
# Everything under $OUT/s37_<n>.tgz.
set -u
n=$1
case $n in 1|2) exec bash profiling/results/2026-12-07/s35_gpu/call.sh "$n" ;; esac  # the same unpacking
OUT=${OUT:-/tmp/out}; W=/tmp/s37_$n; rm -rf "$W"; mkdir -p "$W" "$OUT"
. profiling/call_parts.sh
export PYTHONUNBUFFERED=1
case $n in
  4)
    device_facts
    export PYTHONPATH=$PWD:$PWD/profiling
    pytest_part gpu_chunk ${TEST_S:-200} tests/test_chunk.py tests/test_chunk_gluon.py
    part probe ${PROBE_S:-150} python3 profiling/results/2026-12-08/s37_gpu/probe_configs.py "$W"
    tail -2 "$W/gpu_chunk.log"
    sed -n '/^a state every/,$p' "$W/probe.log"
    grep -E "Error|error" "$W/probe.log" | cut -c1-200 | head -8
    parts_summary
    head -3 "$W/gpu.txt"
    tar -C "$W" -czf "$OUT/s37_$n.tgz" . ;;
  3)
    device_facts
    { for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1
    export PYTHONPATH=/tmp/site:$PWD:$PWD/profiling:$FI VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
    pytest_part gpu_chunk ${TEST_S:-200} tests/test_chunk.py tests/test_chunk_gluon.py
    part probe ${PROBE_S:-150} python3 profiling/results/2026-12-08/s37_gpu/probe_configs.py "$W"
    part bench_prefill ${BENCH_S:-200} python3 profiling/bench_prefill.py --out "$W" --quick \
      --only ours,fi,vllm_fi --tp 1,2 --shapes 1x8192,1x32768 --no-sweep --no-fla
    tail -2 "$W/gpu_chunk.log"
    sed -n '/^a state every/,$p' "$W/probe.log"
    grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" \
      | grep -E "ours B=256|FI off|vLLM default|CUDA graphs" | cut -c1-220
    grep -E "Error|error" "$W/probe.log" "$W/bench_prefill.log" | cut -c1-200 | head -8
    parts_summary
    head -3 "$W/gpu.txt"
    tar -C "$W" -czf "$OUT/s37_$n.tgz" . ;;
esac
