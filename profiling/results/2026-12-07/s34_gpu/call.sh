#!/bin/bash
# Thirty-fourth stop's device call (run from the project root; everything under $OUT/s34_1.tgz):
# the tree with q and k normalised by the Gluon sequential kernel's loader (own q and k) and block
# states stored by TMA: the GPU tests of test_chunk, both Gluon kernels, the engine and the graphs;
# probe_ownqk.py (own q and k against the intra kernel storing them; TMA state stores against plain
# ones; same tree, same card); bench_prefill --quick ours,fi TP 1/2 with FlashInfer 0.6.14 staged.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/s34_1; rm -rf "$W"; mkdir -p "$W" "$OUT"
. profiling/call_parts.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
device_facts
{ for u in .stage/fi*/unpack.sh; do bash "$u"; done; } > "$W/unpack.log" 2>&1 &
pytest_part tier 300 --durations=8 tests/test_chunk_gluon.py tests/test_chunk_intra_gluon.py tests/test_chunk.py \
  tests/test_engine.py tests/test_graphs.py
OUT=$W part probe_ownqk 90 python3 profiling/results/2026-12-07/s34_gpu/probe_ownqk.py ownqk
OUT=$W part probe_tma 90 python3 profiling/results/2026-12-07/s34_gpu/probe_ownqk.py tma
wait
export PYTHONPATH=$PYTHONPATH:$FI
part bench_prefill $(( 560 - ($(date +%s) - T0) )) python3 profiling/bench_prefill.py --out "$W" --quick \
  --only ours,fi --tp 1,2 --no-sweep --no-fla --no-vllm
grep -E "passed|failed|^FAILED|^ERROR|Error" "$W/tier.log" | tail -8
cat "$W/probe_ownqk.log" "$W/probe_tma.log" | cut -c1-230 | tail -16
grep -v "it/s" "$W/bench_prefill.log" | grep -E "^ +[0-9]+x[0-9]+" | grep -E "ours B=256|FI off|FI ckpt B=256" | cut -c1-90
parts_summary
head -3 "$W/gpu.txt"
tar -C "$W" -czf "$OUT/s34_1.tgz" .
