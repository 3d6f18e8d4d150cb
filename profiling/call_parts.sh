# Helpers for a stop's device-call script (sourced; see profiling/results/*/s*_gpu/call.sh).
# The caller sets W (the call's folder, packed into $OUT at the end). Defines:
#   FI              the PYTHONPATH entries of FlashInfer 0.6.14 once .stage/fi*/unpack.sh ran
#   part NAME T cmd...      run cmd with a timeout of T s into $W/NAME.log; its rc and seconds go
#                           to the summary printed by parts_summary
#   pytest_part NAME T files...   the GPU tier of those test files, junit XML into $W/NAME.xml
#   device_facts            the card, driver, clocks, commit and changed files into $W/gpu.txt
FI=/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
T0=$(date +%s)
summary=()
part() {
  local name=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" "$@" > "$W/$name.log" 2>&1; local rc=$?
  summary+=("$name: rc=$rc in $(( $(date +%s) - t0 )) s")
}
pytest_part() {
  local name=$1 t=$2; shift 2
  part "$name" "$t" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --junitxml="$W/$name.xml" "$@"
}
device_facts() {
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
    git log -1 --format=%h; git status --short | grep -v '^ D' | head; } > "$W/gpu.txt" 2>&1
}
parts_summary() {
  printf '%s\n' "${summary[@]}"
}
