#!/bin/bash
# Thirty-fourth stop's second device call: with s34_gpu/own_qk_tma.diff applied, TMA state stores
# against plain ones on main's pairing (the intra kernel storing q and k), in two processes one after
# the other. Everything under $OUT/s34_2.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/s34_2; rm -rf "$W"; mkdir -p "$W" "$OUT"
. profiling/call_parts.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
device_facts
OUT=$W part probe_tma_plain 150 python3 profiling/results/2026-12-07/s34_gpu/probe_ownqk.py tma_plain
cp "$W/probe_tma_plain.json" "$W/probe_tma_plain_1.json"
OUT=$W part probe_tma_plain2 120 python3 profiling/results/2026-12-07/s34_gpu/probe_ownqk.py tma_plain
cat "$W"/probe_tma_plain*.log | cut -c1-250
parts_summary
head -3 "$W/gpu.txt"
tar -C "$W" -czf "$OUT/s34_2.tgz" .
