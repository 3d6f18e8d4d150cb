#!/usr/bin/env bash
# One device call: GPU tests, benchmarks and the demo; a short summary printed last; everything
# packed into $OUT/session.tgz (the device returns at most 8 files).
#   run(command="bash profiling/gpu_session.sh tests bench demo", carry=[".whl"])
# Targets: tests (pytest -m gpu; TEST_K=expr selects), bench (decode + prefill), sweep (prefill
# launch knobs only; BENCHES="bench_decode" picks), demo (gdn-graphs demo at full size), profile
# (gdn-graphs profile, qwen3-next preset), soak (profiling/soak.py, 10,000 steps full vs eager),
# sanitizer (compute-sanitizer memcheck/racecheck/synccheck over tests/test_gpu_safety.py's
# random plans), safety (soak and the three sanitizer tools at once), run (RUN="script args": a
# one-off probe, OUT set to the session folder). .whl holds wheels the GPU
# image lacks (nvtx, fla-core) for Python 3.12; see
# profiling/README.md. OLD=DIR runs bench/demo from another tree (DIR holds its gdn_graphs and
# profiling/) with results under $W/old: a before/after comparison in one session
# (OLD_BENCHES="" skips its benchmarks). DECODE_ARGS / PREFILL_ARGS are added to the bench
# scripts' command lines (e.g. PREFILL_ARGS="--tp 1 --only ours,fi"); BENCH_TIMEOUT is per script.
# FlashInfer: when /tmp/fisite exists (unpacked in earlier calls of the same warm machine by
# .stage/fi1/unpack.sh and .stage/fi2/unpack.sh, made by ../shared/tools/flashinfer_stage.sh),
# PYTHONPATH gains it and its CuTe-DSL package, and the benches add FlashInfer's columns; vLLM's
# columns appear when vLLM imports (vllm_stage.sh's parts unpacked into /tmp/site).
set -uo pipefail
OUT=${OUT:-/tmp/out}; W=/tmp/session; rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
# wheels or vLLM's parts unpacked by an earlier call of the same warm machine
case ":$PYTHONPATH:" in *:/tmp/site:*) ;; *) [ -d /tmp/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/site ;; esac
if [ -d /tmp/fisite ]; then
  # the CuTe-DSL package is found through a .pth file, which PYTHONPATH does not read
  export PYTHONPATH=$PYTHONPATH:/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
fi
echo "PYTHONPATH=$PYTHONPATH"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; git rev-parse --short HEAD; } > "$W/gpu.txt" 2>&1
summary=()
sanitize() {  # sanitize TOOL: tests/test_gpu_safety.py's workload under compute-sanitizer
  local env=(); [ $1 = memcheck ] && env=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1)
  local extra=(); [ $1 = memcheck ] && extra=(--leak-check no)
  timeout "${SAN_TIMEOUT:-300}" "${env[@]}" compute-sanitizer --tool $1 "${extra[@]}" --error-exitcode 9 \
    python3 tests/test_gpu_safety.py > "$W/sanitizer_$1.log" 2>&1
}
for what in ${@:-tests bench}; do
  t0=$(date +%s)
  case $what in
    tests) timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} \
             -rP --junitxml="$W/gpu_tests.xml" tests > "$W/gpu_tests.log" 2>&1; rc=$?
           grep -E "^(PASSED|FAILED|ERROR)|speedup|passed|failed" "$W/gpu_tests.log" | tail -30 ;;
    bench) rc=0
           for b in ${BENCHES:-bench_decode bench_prefill}; do
             extra=${DECODE_ARGS:-}; [ $b = bench_prefill ] && extra="--no-sweep ${PREFILL_ARGS:-}"
             timeout "${BENCH_TIMEOUT:-420}" python3 "profiling/$b.py" --out "$W" $extra > "$W/$b.log" 2>&1 || rc=$?
             n=22; [ $b = bench_prefill ] && n=100; [ $b = bench_decode ] && n=60
             tail -$n "$W/$b.log" | tr '\r' '\n' | grep -v "it/s\]"
           done ;;
    sweep) timeout "${BENCH_TIMEOUT:-200}" python3 profiling/bench_prefill.py --out "$W" --sweep-only > "$W/sweep.log" 2>&1; rc=$?
           tail -20 "$W/sweep.log" ;;
    demo)  timeout "${DEMO_TIMEOUT:-420}" python3 -m gdn_graphs.engine.cli demo --json-out "$W/demo.json" ${DEMO_ARGS:-} > "$W/demo.log" 2>&1; rc=$?
           tail -12 "$W/demo.log" ;;
    old)   # bench and demo of another tree ($OLD), same machine, same session
           mkdir -p "$W/old"; rc=0
           for b in ${OLD_BENCHES-bench_decode bench_prefill}; do
             extra=; [ $b = bench_prefill ] && extra=--no-sweep
             (cd "$OLD" && PYTHONPATH=$PWD:/tmp/site timeout "${BENCH_TIMEOUT:-200}" python3 "profiling/$b.py" --out "$W/old" $extra > "$W/old/$b.log" 2>&1) || rc=$?
           done
           (cd "$OLD" && PYTHONPATH=$PWD:/tmp/site timeout "${DEMO_TIMEOUT:-420}" python3 -m gdn_graphs.cli demo --json-out "$W/old/demo.json" ${DEMO_ARGS:-} > "$W/old/demo.log" 2>&1) || rc=$?
           tail -3 "$W/old/demo.log" ;;
    profile) timeout "${PROFILE_TIMEOUT:-300}" python3 -m gdn_graphs.engine.cli profile --out "$W/profile" ${PROFILE_ARGS:-} > "$W/profile.log" 2>&1; rc=$?
           grep -v "it/s" "$W/profile.log" | tail -30 ;;
    soak)  timeout "${SOAK_TIMEOUT:-300}" python3 profiling/soak.py --out "$W" ${SOAK_ARGS:-} > "$W/soak.log" 2>&1; rc=$?
           tail -2 "$W/soak.log" ;;
    sanitizer) rc=0
           for tool in memcheck racecheck synccheck; do sanitize $tool || rc=$?; done ;;
    safety) # issue 14 in one call: the soak and the three sanitizer tools at once (separate
           # processes; neither is a timing)
           timeout "${SOAK_TIMEOUT:-300}" python3 profiling/soak.py --out "$W" ${SOAK_ARGS:-} > "$W/soak.log" 2>&1 &
           pids=($!); for tool in memcheck racecheck synccheck; do sanitize $tool & pids+=($!); done
           rc=0; for p in "${pids[@]}"; do wait $p || rc=$?; done
           tail -2 "$W/soak.log"
           for tool in memcheck racecheck synccheck; do echo "$tool: $(tail -1 "$W/sanitizer_$tool.log")"; done ;;
    run)   # a one-off probe (RUN="path/to/script.py args"), its OUT the session folder
           OUT=$W timeout "${RUN_TIMEOUT:-300}" python3 $RUN > "$W/run.log" 2>&1; rc=$?
           tail -${RUN_TAIL:-20} "$W/run.log" ;;
    *) echo "unknown target $what"; rc=2 ;;
  esac
  summary+=("$what: rc=$rc in $(( $(date +%s) - t0 )) s")
done
tar -C "$W" -czf "$OUT/session.tgz" . && cp "$W"/*.json "$OUT"/ 2>/dev/null
printf '%s\n' "${summary[@]}"
