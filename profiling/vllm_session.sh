#!/bin/bash
# vLLM end to end on the device machine (issue 5). Run from the project root after the two parts of
# ../shared/tools/vllm_stage.sh are unpacked into /tmp/site (see profiling/README.md).
#
#   bash profiling/vllm_session.sh correctness   # 4 plugin configs + vLLM's own mode, side by side
#   bash profiling/vllm_session.sh speed         # plugin vs vLLM's own mode, one after the other
#
# Results: $OUT/vllm_<target>/*.json, logs, summary.json, packed into $OUT/vllm_<target>.tgz.
set -u
target=${1:-correctness}
OUT=${OUT:-/tmp/out}
D=$OUT/vllm_$target
mkdir -p "$D"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
# the plugin is found through its entry point, so the package must be installed (no network: no deps)
pip install -q --no-deps --no-build-isolation -e . > "$D/pip.log" 2>&1 || cat "$D/pip.log"
MODEL=/tmp/tiny_qwen3_next_fp32
[ -d $MODEL ] || python3 -m gdn_graphs.vllm.tiny_model $MODEL --dtype float32 > /dev/null
T=${E2E_TIMEOUT:-480}

e2e() {  # e2e NAME args...
  local name=$1; shift
  timeout "$T" python3 profiling/vllm_e2e.py --model $MODEL --out "$D/$name.json" "$@" \
    > "$D/$name.log" 2>&1
  echo "$name: rc $? ($(grep -c 'Capturing CUDA graphs' "$D/$name.log") capture lines)"
}

case $target in
  correctness)
    e2e plugin_pc_graphs  --plugin on  --prefix-caching on  --graphs on  &
    e2e plugin_pc_eager   --plugin on  --prefix-caching on  --graphs off &
    e2e plugin_nopc_graphs --plugin on --prefix-caching off --graphs on  &
    e2e plugin_nopc_eager --plugin on  --prefix-caching off --graphs off &
    e2e vllm_pc_graphs    --plugin off --prefix-caching on  --graphs on  &
    wait ;;
  speed)
    e2e speed_plugin --plugin on  --prefix-caching on --graphs on --gpu-mem 0.5 \
        --scenarios ttft,decode --decode-batch 64 --decode-tokens 512
    e2e speed_vllm   --plugin off --prefix-caching on --graphs on --gpu-mem 0.5 \
        --scenarios ttft,decode --decode-batch 64 --decode-tokens 512 ;;
esac
for f in "$D"/*.log; do
  echo "== $(basename "$f"): $(grep -m3 -E 'gdn_graphs|Traceback|Error' "$f" | cut -c1-200 | tr '\n' '|')"
  grep -E "Capturing CUDA graphs|cudagraph_mode|CUDAGraphMode" "$f" | head -3 | cut -c1-200
done
python3 profiling/vllm_report.py "$D" --json "$D/summary.json"
tar czf "$OUT/vllm_$target.tgz" -C "$OUT" "vllm_$target"
cp "$D/summary.json" "$OUT/vllm_${target}_summary.json" 2>/dev/null || true
