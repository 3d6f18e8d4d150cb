"""vLLM end to end with speculative decoding on a GPU (issue 12; marker ``vllm_gpu``): five
engines on a tiny random float32 Qwen3-Next with one MTP layer (``tools/tiny_model.py --mtp``),
prefix caching and CUDA graphs on, side by side through profiling/vllm_e2e.py: without
speculation, n-gram k=3 (vLLM's CPU drafter: async scheduling off), MTP k=2 as vLLM sets it
(async on, the spec rows placed from the device's token counts) and MTP k=2 with async scheduling
off (the host's counts are true), and a tiny random EAGLE-3 head k=3
(``tools/tiny_model.py --eagle3-for``). profiling/vllm_report.py's check: exact whole-block reuse
(shared prefix, system prompt, every turn of a three-turn chat), the same greedy tokens as the
engine without speculation, drafts reported, FULL decode graphs captured, no gdn_graphs kernel
compiled after start-up. Run where vLLM is staged:
``python3 -m pytest -m vllm_gpu tests/test_vllm_spec_e2e.py`` (a few minutes)."""

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_vllm_engines

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"fp32_plugin_nospec": [], "fp32_plugin_ngram3": ["--spec", "ngram", "--spec-k", "3"],
           "fp32_plugin_mtp2": ["--spec", "mtp", "--spec-k", "2"],
           "fp32_plugin_mtp2_sync": ["--spec", "mtp", "--spec-k", "2", "--async-scheduling", "off"],
           # (the head's directory is appended in the test)
           "fp32_plugin_eagle3": ["--spec", "eagle3", "--spec-k", "3", "--spec-model"]}


@pytest.mark.vllm_gpu
def test_speculative_engines_reuse_whole_blocks_and_agree(gpu, tmp_path):
    model = tmp_path / "tiny_fp32_mtp"
    subprocess.run([sys.executable, "-m", "tools.tiny_model", str(model), "--dtype", "float32",
                    "--mtp"], check=True, capture_output=True, timeout=300, cwd=ROOT)
    head = tmp_path / "tiny_eagle3"
    subprocess.run([sys.executable, "-m", "tools.tiny_model", str(head), "--eagle3-for",
                    str(model)], check=True, capture_output=True, timeout=300, cwd=ROOT)
    configs = {n: [*spec, str(head)] if "eagle3" in n else spec for n, spec in CONFIGS.items()}
    common = ["--dtype", "float32", "--plugin", "on", "--prefix-caching", "on", "--graphs", "on",
              "--kv-cache-gib", "3", "--max-model-len", "8192", "--scenarios", "shared,system,chat",
              "--shared-len", "4000", "--system-len", "1000", "--gen", "32", "--chat-len", "800",
              "--chat-gen", "300"]
    res, report = run_vllm_engines(tmp_path, model,
                                   {name: [*common, *spec] for name, spec in configs.items()})
    assert set(res) == set(CONFIGS)
    # a token difference where the top-2 logits are within vllm_report.NEAR_TIE is reported,
    # not failed (issue 12: "any difference reported with its position and the top-2 logit
    # margin there"): verification sums attention over 1 + k queries in another order than plain
    # decode. Seen on an H200: chat run 0, position 110, margins 4e-5 / 6e-5. Anything else fails.
    near_ties = []
    assert report.check(res, near_ties) == []
    for line in near_ties:
        print("near-tie token difference (not a failure):", line)
    # unset, vLLM turns async scheduling on for MTP on a GPU, with the plugin as without it
    assert res["fp32_plugin_mtp2"]["async_scheduling"] is True
    assert res["fp32_plugin_mtp2_sync"]["async_scheduling"] is False
    for name in CONFIGS:
        chat = res[name]["scenarios"]["chat"]
        print(name, "chat reuse", [r["num_cached_tokens"] for r in chat["runs"]], "of",
              chat["expected_reuse_per_turn"], "spec", res[name].get("spec_stats_after"))
