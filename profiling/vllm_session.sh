#!/bin/bash
# vLLM end to end on the device machine (issue 5). Run from the project root after the two parts of
# ../shared/tools/vllm_stage.sh are unpacked into /tmp/site (see profiling/README.md).
#
#   bash profiling/vllm_session.sh pytest        # tests/test_vllm_e2e.py (-m vllm_gpu)
#   bash profiling/vllm_session.sh correctness   # 4 plugin configs + vLLM's own mode, side by side
#   bash profiling/vllm_session.sh speed         # plugin vs vLLM's own mode, one after the other
#   bash profiling/vllm_session.sh speed_nopc    # the same without prefix caching
#   bash profiling/vllm_session.sh gpuprof       # torch.profiler of decode, plugin vs vLLM's own mode
#   bash profiling/vllm_session.sh qwen3_5       # tiny Qwen3.5 dense + MoE, plugin vs vLLM's own mode
#   bash profiling/vllm_session.sh tp2           # 80B-A3B layout, dummy weights, TP 2 (two GPUs)
#   bash profiling/vllm_session.sh capacity      # issue 16: logged capacity at one KV size
#   bash profiling/vllm_session.sh edge          # issue 16: the plugin at the largest
#                                                # max_model_len vLLM's own mode accepts
#   bash profiling/vllm_session.sh load          # issue 16: the load scenario, plugin vs own mode
#   TARGETS="pytest capacity" bash profiling/vllm_session.sh many   # targets at once (no timings)
#   bash profiling/vllm_session.sh layout80      # issues 13/16: the 80B-A3B layout with 8 layers
#                                                # (LAYERS80) on one GPU, random weights: capacity
#                                                # and reuse, plugin and own mode side by side
#   bash profiling/vllm_session.sh e2e80         # issue 13: the 80B-A3B layout (LAYERS80 layers,
#                                                # random weights), plugin then own mode (on its
#                                                # default FlashInfer prefill where staged): TTFT
#                                                # of 16k and 32k prompts cold/warm, decode tok/s,
#                                                # bursts of several prompts at once (BURST80);
#                                                # GPROF80=1: engine in-process, and the GPU kernel
#                                                # time of decode steps, kernel by kernel
#                                                # (torch.profiler) after the timed runs;
#                                                # SPY80=1: py-spy over each engine's processes
#                                                # (profiling/spy_report.py compares them)
#   bash profiling/vllm_session.sh spec          # issue 12: speculative decoding + prefix caching:
#                                                # fp32 plugin without spec / ngram_gpu k=3 / MTP k=2
#                                                # (both with async scheduling on) / EAGLE-3 k=3
#   bash profiling/vllm_session.sh spec_bf16     # bf16 plugin, then vLLM's own mode, per method
#                                                # (SPEC_BF16="ngram3 mtp2 eagle3_3")
#   bash profiling/vllm_session.sh spec_qwen3_5  # issue 12: tiny Qwen3.5 dense with MTP k=2
#
# Results: $OUT/vllm_<target>/*.json, logs, summary.json, packed into $OUT/vllm_<target>.tgz.
set -u
target=${1:-correctness}
OUT=${OUT:-/tmp/out}
D=$OUT/vllm_$target
mkdir -p "$D"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
# FlashInfer (../shared/tools/flashinfer_stage.sh's parts unpacked into /tmp/fisite): vLLM's own
# mode then runs its default GDN prefill on Hopper (FlashInfer); its CuTe-DSL package is found
# through a .pth file, which PYTHONPATH does not read
# (nvidia-cutlass-dsl 4.5 keeps it in python_packages, 4.6 in dsl_packages)
[ -d /tmp/fisite ] && export PYTHONPATH=$PYTHONPATH:/tmp/fisite:/tmp/fisite/nvidia_cutlass_dsl/python_packages:/tmp/fisite/nvidia_cutlass_dsl/dsl_packages
# a previous target's engine processes can outlive their parent (vllm_e2e.py skips vLLM's teardown)
# and hold the GPUs' memory (seen: TP 2 workers, then "Free memory on device ... less than desired")
# (PARALLEL=1: a sub-target of "many", which did this and the install once for all of them)
if [ -z "${PARALLEL:-}" ]; then
  nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | xargs -r kill -9 2>/dev/null
  sleep 2
  # the plugin is found through its entry point, so the package must be installed (no network: no deps)
  python3 -m pip install -q --no-deps --no-build-isolation -e . > "$D/pip.log" 2>&1 || cat "$D/pip.log"
fi
has_ep() { python3 -c "import importlib.metadata as m, sys; eps=[e.value for e in m.entry_points(group='vllm.general_plugins')]; print('plugins:', eps); sys.exit('gdn_graphs.vllm:register' not in eps)"; }
if ! has_ep; then
  # seen once: the editable install's metadata was not found through PYTHONPATH. Describe it,
  # then put the distribution's metadata first on the path (what an install writes).
  python3 -m pip show -f gdn-graphs 2>&1 | head -20; python3 -c "import sys; print(sys.path)"
  di=/tmp/site/gdn_graphs-0.1.0.dist-info; mkdir -p $di
  printf 'Metadata-Version: 2.1\nName: gdn-graphs\nVersion: 0.1.0\n' > $di/METADATA
  printf '[vllm.general_plugins]\ngdn_graphs = gdn_graphs.vllm:register\n' > $di/entry_points.txt
  has_ep || echo "the plugin entry point is still not visible"
fi
M32=/tmp/tiny_qwen3_next_fp32 M16=/tmp/tiny_qwen3_next_bf16
[ -d $M32 ] || python3 -m tools.tiny_model $M32 --dtype float32 > /dev/null 2>&1
[ -d $M16 ] || python3 -m tools.tiny_model $M16 --dtype bfloat16 > /dev/null 2>&1
T=${E2E_TIMEOUT:-480}

e2e() {  # e2e NAME MODEL args...
  local name=$1 model=$2; shift 2
  # a fresh Triton cache per engine: vllm_e2e.py lists the kernels compiled after start-up
  rm -rf "/tmp/tc_$name"
  # (E2E_WRAP: a command the engine runs under, e.g. py-spy record ... --)
  TRITON_CACHE_DIR=/tmp/tc_$name timeout "$T" ${E2E_WRAP:-} python3 profiling/vllm_e2e.py --model "$model" \
    --out "$D/$name.json" "$@" > "$D/$name.log" 2>&1
  echo "$name: rc $? ($(grep -c 'Capturing CUDA graphs' "$D/$name.log") capture lines)"
}

gpu_idle() {  # between engines run one after the other: the next must find the GPU's memory free
  # (vllm_e2e.py skips vLLM's teardown; a third engine in one call once found the first two's
  # memory still held, 2026-12-03). Never between engines that run side by side.
  # (memory.used, not the process list: a container may not see the processes)
  local i used
  for i in $(seq 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | sort -n | tail -1)
    [ -n "$used" ] && [ "$used" -lt 2048 ] && return
    [ "$i" = 20 ] && nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
    sleep 1
  done
  echo "GPU memory still held after 60 s: ${used:-?} MiB"
}

case $target in
  many)  # TARGETS="pytest capacity edge" at once, each in its own process group and folder (for
    # correctness and capacity runs only: timings of engines sharing the GPU mean nothing)
    pids=()
    for t in ${TARGETS:-pytest capacity edge layout80}; do
      PARALLEL=1 bash "$0" "$t" > "$OUT/many_$t.txt" 2>&1 & pids+=($!)
    done
    for p in "${pids[@]}"; do wait $p; done
    for t in ${TARGETS:-pytest capacity edge layout80}; do echo "=== $t"; tail -${MANY_TAIL:-12} "$OUT/many_$t.txt"; done
    # the device returns at most 8 files: one archive of everything, and the summaries
    tar czf /tmp/many.tgz -C "$OUT" --exclude='*.tgz' . && rm -rf "$OUT"/* && mv /tmp/many.tgz "$OUT/"
    exit 0 ;;
  pytest)  # tests/test_vllm_e2e.py: three float32 plugin engines and vllm_report's check
    timeout "$T" python3 -m pytest -m vllm_gpu -q -p no:cacheprovider -rA tests/test_vllm_e2e.py \
      > "$D/pytest.log" 2>&1; echo "pytest: rc $?"; tail -5 "$D/pytest.log" ;;
  correctness)
    # fp32: the plugin in four configurations (vLLM 0.26's own GDN prefill refuses fp32);
    # bf16: the plugin next to vLLM's own "align" mode. Engines side by side: fixed KV memory.
    kv="--kv-cache-gib 6 --decode-batch 48"  # 48 x 256 tokens: the 2nd step mixes decodes and prefills
    e2e fp32_plugin_pc_graphs   $M32 --dtype float32 --plugin on --prefix-caching on  --graphs on  $kv &
    e2e fp32_plugin_pc_eager    $M32 --dtype float32 --plugin on --prefix-caching on  --graphs off $kv &
    e2e fp32_plugin_nopc_graphs $M32 --dtype float32 --plugin on --prefix-caching off --graphs on  $kv &
    e2e fp32_plugin_nopc_eager  $M32 --dtype float32 --plugin on --prefix-caching off --graphs off $kv &
    e2e bf16_plugin_pc_graphs   $M16 --dtype bfloat16 --plugin on  --prefix-caching on --graphs on $kv &
    e2e bf16_vllm_pc_graphs     $M16 --dtype bfloat16 --plugin off --prefix-caching on --graphs on $kv &
    wait ;;
  speed|speed_nopc)  # prefix caching on (plugin "all" vs vLLM "align") or off (both "none")
    pc=on; [ $target = speed_nopc ] && pc=off
    for who in ${WHO:-plugin vllm}; do
      p=on; [ $who = vllm ] && p=off
      e2e ${target}_$who $M16 --dtype bfloat16 --plugin $p --prefix-caching $pc --graphs on \
          --kv-cache-gib 20 --scenarios ttft,shared,system,decode --decode-batch 64 --decode-tokens 512
    done
    # if the plugin decodes slower, profile the host side of both (engine in-process, cProfile)
    slower=$(python3 -c "
import json, sys
r = {w: json.load(open('$D/${target}_' + w + '.json'))['scenarios']['decode']['decode_tok_per_s'] for w in ('plugin', 'vllm')}
print(int(r['plugin'] < r['vllm']))" 2>/dev/null)
    if [ "${slower:-0}" = 1 ] && [ "${PROFILE_IF_SLOWER:-1}" = 1 ]; then
      for who in plugin vllm; do
        p=on; [ $who = vllm ] && p=off
        e2e ${target}_${who}_hostprof $M16 --dtype bfloat16 --plugin $p --prefix-caching $pc --graphs on \
            --kv-cache-gib 20 --scenarios decode --decode-batch 64 --decode-tokens 512 \
            --host-profile "$D/${target}_${who}_hostprof.txt"
      done
    fi ;;
  gpuprof)  # engine in-process, torch.profiler over a decode run: GPU kernel time vs wall per config
    for who in plugin vllm; do
      p=on; [ $who = vllm ] && p=off
      e2e gpuprof_$who $M16 --dtype bfloat16 --plugin $p --prefix-caching on --graphs on \
          --kv-cache-gib 20 --scenarios decode --decode-batch 64 --decode-tokens 256 \
          --gpu-profile "$D/gpuprof_${who}.txt"
    done ;;
  qwen3_5)  # tiny Qwen3.5 dense and MoE, random weights (config only), text model only
    for moe in dense moe; do
      MQ=/tmp/tiny_qwen3_5_$moe
      [ -d $MQ ] || python3 -m tools.tiny_model $MQ --qwen3-5 $moe > /dev/null 2>&1
      for who in plugin vllm; do
        p=on; [ $who = vllm ] && p=off
        e2e q35_${moe}_$who $MQ --dtype bfloat16 --load-format dummy --language-model-only \
            --plugin $p --prefix-caching on --graphs on --kv-cache-gib 6 --scenarios shared,system,decode &
      done
    done
    wait ;;
  tp2)  # the 80B-A3B layout, random weights, tensor parallel 2: run on kind nvidia-h200-x2
    M80=/tmp/qwen3_next_80b_dummy
    [ -d $M80 ] || python3 -m tools.tiny_model $M80 --full-size > /dev/null 2>&1
    for who in ${WHO:-plugin vllm}; do  # WHO=plugin / WHO=vllm: one engine per device call
      p=on; [ $who = vllm ] && p=off
      e2e tp2_$who $M80 --dtype bfloat16 --tp 2 --load-format dummy --plugin $p \
          --prefix-caching on --graphs on --gpu-mem 0.9 --scenarios shared,system
    done ;;
  capacity)  # issue 16, one engine after the other (tiny model, bf16): the same KV memory
    # (CAP_GIB): each engine logs 'GPU KV cache size' and 'Maximum concurrency' (vllm_report
    # reads them from the logs); a short system scenario runs too
    for who in plugin vllm; do
      p=on; [ $who = vllm ] && p=off
      e2e cap_$who $M16 --dtype bfloat16 --plugin $p --prefix-caching on --graphs on \
          --kv-cache-gib ${CAP_GIB:-41.3} --gpu-mem ${CAP_GPU_MEM:-0.9} --scenarios system
    done ;;
  edge)  # issue 16: vLLM's own mode auto-fits max_model_len (-1) to a small KV size; the plugin
    # must start at that length with the same KV size (and serve a prompt near it)
    # (EDGE_L: the length a previous call's own-mode engine fit, to run the plugin alone)
    kv="--kv-cache-gib ${EDGE_GIB:-0.008}"
    L=${EDGE_L:-}
    if [ -z "$L" ]; then
      e2e edge_vllm $M16 --dtype bfloat16 --plugin off --prefix-caching on --graphs on $kv \
          --max-model-len -1 --scenarios system
      L=$(python3 -c "import json; print(json.load(open('$D/edge_vllm.json'))['max_model_len'])")
    fi
    echo "vLLM's own mode auto-fit max_model_len: $L"
    e2e edge_plugin $M16 --dtype bfloat16 --plugin on --prefix-caching on --graphs on $kv \
        --max-model-len "$L" --scenarios system,ttft --ttft-len $((L - 200)) ;;
  layout80)  # the 80B-A3B layout (HV 32, HK 16, 128-dim heads, 512 experts) cut to LAYERS80 layers
    # (every 4th attention: vLLM still forms one attention and three GDN groups), dummy weights.
    # Both engines side by side at the same KV memory (fixed: capacity does not depend on timing).
    M80=/tmp/qwen3_next_80b_${LAYERS80:-8}l
    [ -d $M80 ] || python3 -m tools.tiny_model $M80 --full-size --layers ${LAYERS80:-8} > /dev/null 2>&1
    for who in plugin vllm; do
      p=on; [ $who = vllm ] && p=off
      e2e l80_$who $M80 --dtype bfloat16 --load-format dummy --plugin $p --prefix-caching on \
          --graphs on --gpu-mem ${GPU_MEM80:-0.3} --kv-cache-gib ${KV80_GIB:-24} --scenarios shared,system,ttft \
          --ttft-len 16000 &
    done
    wait ;;
  e2e80)  # issue 13: one engine after the other (timings); first use of each length untimed
    M80=/tmp/qwen3_next_80b_${LAYERS80:-8}l
    # utilisation, clocks and power every 200 ms: vllm_report reads them over each decode run
    nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu \
      --format=csv,noheader,nounits -lms 200 > "$D/gpu_monitor.csv" 2>/dev/null &
    mon=$!
    [ -d $M80 ] || python3 -m tools.tiny_model $M80 --full-size --layers ${LAYERS80:-8} > /dev/null 2>&1
    # (WHO="plugin_fi ...": the plugin with its FlashInfer prefill option, fp32 state pool;
    # "vllm_fp32": vLLM's own mode with that pool dtype, its fair comparison)
    # (a name given twice, e.g. WHO="plugin vllm plugin vllm", runs again as e80_plugin_2 ...)
    declare -A seen=()
    for who in ${WHO:-plugin vllm}; do
      seen[$who]=$(( ${seen[$who]:-0} + 1 )); tag=$who
      [ ${seen[$who]} -gt 1 ] && tag=${who}_${seen[$who]}
      p=on; fi=
      case $who in
        vllm) p=off ;;
        vllm_fp32) p=off; fi="--state-dtype float32" ;;
        plugin_fi) fi="--prefill flashinfer --state-dtype float32" ;;
      esac
      # SPY80=1: py-spy samples every process of the engine (its wheel carried in .whl; it
      # starts the engine, so it may read its children), raw stacks for profiling/spy_report.py.
      # It writes them only when the engine exits before E2E_TIMEOUT: at 200 Hz (2026-12-04)
      # each engine took ~4.5 minutes instead of ~2.5, py-spy fell behind, the timeout killed
      # it and nothing was written; so 50 Hz, one engine a call, E2E_TIMEOUT=480
      E2E_WRAP=${SPY80:+py-spy record --subprocesses --nonblocking -r ${SPY_RATE:-50} -f raw -o $D/spy_$tag.txt --} \
      e2e e80_$tag $M80 --dtype bfloat16 --load-format dummy --plugin $p --prefix-caching on $fi \
          --graphs on --gpu-mem ${GPU_MEM80:-0.3} --kv-cache-gib ${KV80_GIB:-24} --max-model-len 32768 \
          --scenarios ${SCEN80:-ttft,decode,burst} --ttft-len 16000,32000 --decode-batch 64 \
          --decode-tokens ${DEC80:-256} --decode-repeats ${DECREP80:-1} --burst ${BURST80:-16x2048,64x512} \
          ${GPROF80:+--gpu-profile "$D/gpuprof_$tag.txt"}
      gpu_idle
    done
    kill $mon 2>/dev/null ;;
  spec|spec_bf16)  # issue 12. spec: four float32 engines side by side (tokens and reuse only):
    # tiny Qwen3-Next with its MTP layer (tools/tiny_model.py --mtp; the main weights are M32's),
    # prefix caching on: the plugin without speculation (the token reference), with n-gram k=3
    # (ngram_gpu) and with MTP k=2, both with async scheduling on (the plugin's device-placed
    # spec rows), and with a tiny random EAGLE-3 head (tools/tiny_model.py --eagle3-for), k=3.
    # spec_bf16: the plugin, then vLLM's own "align" mode, with the same speculation (SPEC_BF16,
    # default n-gram k=3 then MTP k=2; eagle3_3: EAGLE-3 k=3), one engine after the other
    # (reuse, acceptance, decode tok/s)
    MM=/tmp/tiny_qwen3_next_fp32_mtp
    [ -d $MM ] || python3 -m tools.tiny_model $MM --dtype float32 --mtp > /dev/null 2>&1
    sc="--scenarios shared,system,chat,decode --shared-len 4000 --system-len 1500 --gen 64"
    sc="$sc --chat-len 1000 --chat-gen 400 --decode-batch 16 --decode-tokens 256"
    kv="--kv-cache-gib ${SPEC_GIB:-3} --max-model-len 8192 --prefix-caching on --graphs on $sc"
    if [ $target = spec ]; then
      E3=/tmp/tiny_eagle3_fp32  # an EAGLE-3 head for MM (tools/tiny_model.py --eagle3-for)
      [ -d $E3 ] || python3 -m tools.tiny_model $E3 --eagle3-for $MM > /dev/null 2>&1
      e2e fp32_plugin_nospec  $MM --dtype float32 --plugin on $kv &
      e2e fp32_plugin_eagle3  $MM --dtype float32 --plugin on --spec eagle3 --spec-k 3 \
          --spec-model $E3 $kv &
      # async scheduling on (the JSON's async_scheduling says what ran)
      e2e fp32_plugin_ngram3  $MM --dtype float32 --plugin on --spec ngram_gpu --spec-k 3 \
          --async-scheduling on $kv &
      e2e fp32_plugin_mtp2    $MM --dtype float32 --plugin on --spec mtp --spec-k 2 \
          --async-scheduling on $kv &
      wait
    else
      MB=/tmp/tiny_qwen3_next_bf16_mtp
      [ -d $MB ] || python3 -m tools.tiny_model $MB --dtype bfloat16 --mtp > /dev/null 2>&1
      for m in ${SPEC_BF16:-ngram3 mtp2}; do  # method + k (eagle3_3: method_k); one model
        meth=${m%%[0-9]*}; k=${m#$meth}; mod=$M16; [ $meth = mtp ] && mod=$MB
        extra=
        case $m in *_*) meth=${m%_*}; k=${m##*_} ;; esac
        if [ $meth = eagle3 ]; then
          EB=/tmp/tiny_eagle3_bf16
          [ -d $EB ] || python3 -m tools.tiny_model $EB --eagle3-for $M16 > /dev/null 2>&1
          extra="--spec-model $EB"
        fi
        for who in ${WHO:-plugin vllm}; do
          p=on; [ $who = vllm ] && p=off
          e2e bf16_${who}_$m $mod --dtype bfloat16 --plugin $p --spec $meth --spec-k $k $extra $kv
        done
      done
    fi ;;
  spec_qwen3_5)  # issue 12: tiny Qwen3.5 dense (config with one MTP layer, dummy weights), text
    # model only: fp32 plugin without / with MTP k=2 (tokens, reuse), bf16 plugin vs vLLM's own
    # mode with MTP k=2 (vLLM's own GDN prefill refuses fp32)
    MQ=/tmp/tiny_qwen3_5_dense_mtp
    [ -d $MQ ] || python3 -m tools.tiny_model $MQ --qwen3-5 dense --mtp > /dev/null 2>&1
    sc="--scenarios shared,system,chat,decode --shared-len 4000 --system-len 1500 --gen 64"
    sc="$sc --chat-len 1000 --chat-gen 400 --decode-batch 16 --decode-tokens 256"
    kv="--kv-cache-gib ${SPEC_GIB:-3} --max-model-len 8192 --prefix-caching on --graphs on $sc"
    q35="--load-format dummy --language-model-only"
    e2e fp32_q35_plugin_nospec $MQ $q35 --dtype float32 --plugin on $kv &
    e2e fp32_q35_plugin_mtp2   $MQ $q35 --dtype float32 --plugin on --spec mtp --spec-k 2 $kv &
    e2e bf16_q35_plugin_mtp2   $MQ $q35 --dtype bfloat16 --plugin on --spec mtp --spec-k 2 $kv &
    e2e bf16_q35_vllm_mtp2     $MQ $q35 --dtype bfloat16 --plugin off --spec mtp --spec-k 2 $kv &
    wait ;;
  load)  # issue 16: requests over time into KV memory for ~8 concurrent 16k requests
    # (LOAD_REPEATS=2: plugin, own mode, plugin, own mode: one run each did not rank them, the
    # same engine's TTFT p50 moved 12x between two runs; later runs are load_<who>_2, ...)
    # (LOAD80=1: the 80B-A3B layout cut to LAYERS80 layers, random weights, instead of the tiny
    # model; the KV memory is sized from its config the same way)
    ML=$M16 mla=; tag=load
    if [ -n "${LOAD80:-}" ]; then
      ML=/tmp/qwen3_next_80b_${LAYERS80:-8}l mla="--load-format dummy --gpu-mem ${GPU_MEM80:-0.3}"
      tag=load80
      [ -d $ML ] || python3 -m tools.tiny_model $ML --full-size --layers ${LAYERS80:-8} > /dev/null 2>&1
    fi
    for r in $(seq 1 ${LOAD_REPEATS:-1}); do
      for who in ${WHO:-plugin vllm}; do
        p=on; [ $who = vllm ] && p=off; sfx=; [ $r -gt 1 ] && sfx=_$r
        e2e ${tag}_$who$sfx $ML --dtype bfloat16 --plugin $p --prefix-caching on --graphs on \
            --scenarios load --max-model-len 20480 --max-batched 8192 $mla ${LOAD_ARGS:-}
      done
    done ;;
esac
for f in "$D"/*.log; do
  echo "== $(basename "$f"): $(grep -m2 -E 'GDN layers run on|Traceback|Error:' "$f" | cut -c1-160 | tr '\n' '|')"
  grep -E "Capturing CUDA graphs|cudagraph_mode|CUDAGraphMode" "$f" | head -3 | cut -c1-200
  grep -E "GPU KV cache size|Maximum concurrency|Setting attention block size" "$f" | head -3 | cut -c1-200
  tail -3 "$f" | tr '\r' '\n' | tail -3 | cut -c1-240  # where an engine that timed out stood
done
python3 profiling/vllm_report.py "$D" --json "$D/summary.json" --check
tar czf "$OUT/vllm_$target.tgz" -C "$OUT" "vllm_$target"
cp "$D/summary.json" "$OUT/vllm_${target}_summary.json" 2>/dev/null || true
