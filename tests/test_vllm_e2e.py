"""vLLM end to end on a GPU (issue 5's GPU tier): three engines on a tiny random float32 Qwen3-Next,
side by side on one GPU, each in its own process through profiling/vllm_e2e.py:

  plugin, prefix caching on,  CUDA graphs on    (FULL decode + PIECEWISE mixed graphs)
  plugin, prefix caching on,  CUDA graphs off
  plugin, prefix caching off, CUDA graphs on

and profiling/vllm_report.py's check on their results: exact whole-block reuse for a repeated
prompt, a shared prefix and a system prompt; the same greedy tokens in all three; no gdn_graphs
kernel compiled after start-up. Run where vLLM is staged: ``python3 -m pytest -m vllm_gpu``
(``profiling/vllm_session.sh pytest``). Takes a few minutes (engine start-ups).
"""

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_vllm_engines

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"fp32_plugin_pc_graphs": ("on", "on"), "fp32_plugin_pc_eager": ("on", "off"),
           "fp32_plugin_nopc_graphs": ("off", "on")}


@pytest.mark.vllm_gpu
def test_vllm_engines_reuse_whole_blocks_and_agree(gpu, tmp_path):
    model = tmp_path / "tiny_fp32"
    subprocess.run([sys.executable, "-m", "tools.tiny_model", str(model), "--dtype",
                    "float32"], check=True, capture_output=True, timeout=300, cwd=ROOT)
    common = ["--dtype", "float32", "--plugin", "on", "--kv-cache-gib", "4", "--scenarios",
              "repeat,shared,system,abort", "--prefix-len", "6000", "--shared-len", "4000",
              "--system-len", "1000", "--gen", "16"]
    res, report = run_vllm_engines(
        tmp_path, model, {name: [*common, "--prefix-caching", pc, "--graphs", graphs]
                          for name, (pc, graphs) in CONFIGS.items()},
        full_graphs=[name for name, (_, graphs) in CONFIGS.items() if graphs == "on"])
    assert set(res) == set(CONFIGS)
    assert report.check(res) == []
    # the prefix-caching engines reused something (the check compares with the expected value)
    pc = res["fp32_plugin_pc_graphs"]["scenarios"]
    assert pc["shared"]["runs"][1]["num_cached_tokens"] > 0
    # aborts mid-prefill and mid-decode leave the other requests' tokens as they are alone
    for name in CONFIGS:
        ab = res[name]["scenarios"]["abort"]
        print(f"{name}: abort scenario {ab['steps']} steps, aborted {ab['aborted']}, "
              f"survivors equal: {ab['survivors_equal']}")
