"""The end-to-end check of profiling/vllm_report.py on recorded H200 runs (no GPU or vLLM needed):
the recorded runs pass, and each kind of failure it exists to catch is caught."""

import copy
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "profiling" / "results"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("vllm_report", ROOT / "profiling" / "vllm_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def correctness(report):
    # four float32 plugin engines (prefix caching x graphs) and two bf16 ones, 2026-11-29
    return report.load(RESULTS / "2026-11-29" / "vllm_correctness")


def test_our_kernel_names(report):
    names = report.our_kernel_names()
    assert {"_gdn_decode_kernel", "_chunk_intra_kernel", "_conv_prefill_kernel"} <= names


@pytest.mark.parametrize("run", ["2026-11-29/vllm_correctness", "2026-11-30/s4_vllm_qwen3_5",
                                 "2026-11-30/s4_vllm_tp2", "2026-11-30/s4_vllm_speed"])
def test_recorded_runs_pass(report, run):
    res = report.load(RESULTS / run)
    assert res and report.check(res) == []


def test_wrong_reuse_is_caught(report, correctness):
    res = copy.deepcopy(correctness)
    res["fp32_plugin_pc_graphs"]["scenarios"]["shared"]["runs"][1]["num_cached_tokens"] -= 192
    assert report.check(res) == ["fp32_plugin_pc_graphs: shared reused [19392], expected 19584 each"]


def test_fp32_token_difference_is_caught_bf16_is_not(report, correctness):
    res = copy.deepcopy(correctness)
    res["fp32_plugin_pc_eager"]["scenarios"]["repeat"]["runs"][2]["tokens"][5] += 1
    res["bf16_plugin_pc_graphs"]["scenarios"]["repeat"]["runs"][2]["tokens"][5] += 1
    [msg] = report.check(res)
    assert msg.startswith("fp32_plugin_pc_eager: float32 tokens of 'repeat' run 2 differ from "
                          "fp32_plugin_nopc_eager at position 5 (top-2 margin there: ")


def test_late_compile_of_our_kernel_is_caught(report, correctness):
    res = copy.deepcopy(correctness)
    res["bf16_plugin_pc_graphs"]["triton_compiles_after_start"] = [
        [1.0, "fused_moe_kernel"], [2.0, "_chunk_intra_kernel"]]
    res["bf16_vllm_pc_graphs"]["triton_compiles_after_start"] = [[1.0, "_chunk_intra_kernel"]]
    assert report.check(res) == ["bf16_plugin_pc_graphs: gdn_graphs kernels compiled after "
                                 "start-up: ['_chunk_intra_kernel']"]


def test_plugin_not_in_all_mode_is_caught(report, correctness):
    res = copy.deepcopy(correctness)
    res["fp32_plugin_pc_eager"]["mamba_cache_mode"] = "align"
    assert report.check(res)[0] == "fp32_plugin_pc_eager: mamba cache mode 'align', not 'all'"


def test_abort_scenario_failures_are_caught(report, correctness):
    res = copy.deepcopy(correctness)
    good = {"steps": 9, "aborted": {"abort_prefill": {"step": 1, "tokens_out": 0},
                                    "abort_decode": {"step": 5, "tokens_out": 3}},
            "alone": {"keep_long": [1, 2], "keep_short": [3]},
            "together": {"keep_long": [1, 2], "keep_short": [3]}, "survivors_equal": True}
    res["fp32_plugin_pc_graphs"]["scenarios"]["abort"] = good
    assert report.check(res) == []
    bad = copy.deepcopy(good)
    bad["together"]["keep_short"] = [4]
    bad["survivors_equal"] = False
    del bad["aborted"]["abort_decode"]
    res["fp32_plugin_pc_graphs"]["scenarios"]["abort"] = bad
    assert report.check(res) == [
        "fp32_plugin_pc_graphs: abort scenario aborted ['abort_prefill']",
        "fp32_plugin_pc_graphs: abort scenario: the requests that ran on did not generate what "
        "they generate alone"]


def _spec_engine(res, name="fp32_plugin_pc_graphs", method="ngram"):
    """A recorded engine dressed as one with speculation: chat turns with exact reuse, drafts
    reported, FULL decode graphs captured (what a passing issue-12 run shows)."""
    r = res[name]
    r["config"] = dict(r["config"], spec=method, spec_k=3)
    B = r["block_size"]
    runs = [{"tokens": [1, 2], "num_cached_tokens": c, "prompt_len": p, "top2_margins": [1, 1]}
            for c, p in ((0, 1000), (5 * B, 1462), (7 * B, 1924))]
    r["scenarios"]["chat"] = {"runs": runs, "expected_reuse_per_turn": [None, 5 * B, 7 * B]}
    r["spec_stats_after"] = {"decode": {"spec_decode_num_drafts": 40,
                                        "spec_decode_num_draft_tokens": 120,
                                        "spec_decode_num_accepted_tokens": 30}}
    r["captures"] = [("decode", "FULL"), ("mixed prefill-decode", "PIECEWISE")]
    return r


def test_speculative_engine_checks(report, correctness):
    res = copy.deepcopy(correctness)
    r = _spec_engine(res)
    assert report.check(res) == []
    r["scenarios"]["chat"]["runs"][2]["num_cached_tokens"] -= r["block_size"]
    r["spec_stats_after"]["decode"]["spec_decode_num_drafts"] = 0
    r["captures"] = [("mixed prefill-decode", "PIECEWISE")]
    probs = report.check(res)
    assert [p.split(":")[1].strip()[:24] for p in probs] == [
        "chat turns 2, 3 reused [", "vLLM reports no speculat", "no FULL decode CUDA grap"], probs


def test_float32_tokens_are_compared_with_the_engine_without_speculation(report, correctness):
    res = copy.deepcopy(correctness)
    _spec_engine(res, "fp32_plugin_nopc_eager")  # sorts first: no longer the reference
    res["fp32_plugin_nopc_eager"]["scenarios"]["repeat"]["runs"][1]["tokens"][3] += 1
    [msg] = report.check(res)
    assert msg.startswith("fp32_plugin_nopc_eager: float32 tokens of 'repeat' run 1 differ from "
                          "fp32_plugin_nopc_graphs at position 3"), msg


def test_near_tie_differences_are_reported_apart_and_later_chat_turns_skipped(report, correctness):
    res = copy.deepcopy(correctness)
    for name in ("fp32_plugin_nopc_eager", "fp32_plugin_pc_eager"):
        _spec_engine(res, name)
    ref = "fp32_plugin_nopc_graphs"  # the first float32 engine without speculation
    _spec_engine(res, ref, method="none")
    for name, margin in (("fp32_plugin_nopc_eager", 4e-5), ("fp32_plugin_pc_eager", 0.5)):
        chat = res[name]["scenarios"]["chat"]["runs"]
        chat[1]["tokens"][1] += 1          # turn 2 differs at position 1 ...
        chat[1]["top2_margins"][1] = margin
        chat[2]["tokens"][0] += 1          # ... so turn 3's prompt differs: not compared
    ties = []
    probs = report.check(res, ties)
    assert [t.split(":")[0] for t in ties] == ["fp32_plugin_nopc_eager"], ties
    assert probs == [f"fp32_plugin_pc_eager: float32 tokens of 'chat' run 1 differ from {ref} at "
                     f"position 1 (top-2 margin there: 0.5 / 1)"], probs
    assert len(report.check(res)) == 2  # without a list for them, near-ties are failures too


def test_capture_lines_are_read_from_the_log(report, tmp_path):
    import json
    (tmp_path / "x.json").write_text(json.dumps({"config": {}, "scenarios": {}}))
    (tmp_path / "x.log").write_text("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%\n"
                                    "Capturing CUDA graphs (decode, FULL): 100%|###| 7/7\n")
    assert report.load(tmp_path)["x"]["captures"] == [("decode", "FULL"),
                                                      ("mixed prefill-decode", "PIECEWISE")]


def test_further_ttft_lengths_are_compared_and_tabled(report, correctness, tmp_path, capsys):
    """--ttft-len 16000,32000 keeps the lengths after the first in "ttft_more": their float32
    tokens are compared like the first's, and the table prints their cold/warm times."""
    import json

    res = copy.deepcopy(correctness)
    for r in res.values():
        r["scenarios"]["ttft_more"] = {"32000": copy.deepcopy(r["scenarios"]["ttft"])}
    assert report.check(res) == []
    res["fp32_plugin_pc_eager"]["scenarios"]["ttft_more"]["32000"]["cold"]["tokens"][0] += 1
    [msg] = report.check(res)
    assert msg.startswith("fp32_plugin_pc_eager: float32 tokens of 'ttft_32000' run 0 differ")
    for name, r in res.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    report.main([str(tmp_path), "--json", str(tmp_path / "summary.out")])
    row = json.load(open(tmp_path / "summary.out"))["configs"]["bf16_vllm_pc_graphs"]
    assert row["ttft_32000"] == row["ttft"]
    assert capsys.readouterr().out.count("/") > 0


def test_non_triton_compiles_while_serving_are_flagged(report, capsys):
    """vLLM's JIT monitor lines are read from each engine's log: the recorded H200 load run on
    the 80B-A3B layout, where own mode compiled FlashInfer's CuTe-DSL prefill inside the timed
    load, is flagged; the plugin's engine, which compiled only Triton kernels, is not."""
    res = report.load(RESULTS / "2026-12-01" / "s10_load80")
    assert ["19:58:36", "CuTeDSL", "_FullyFusedDeltaRuleSm90"] in res["load80_vllm"]["jit_during_inference"]
    assert {k for _, k, _ in res["load80_plugin"]["jit_during_inference"]} == {"Triton"}
    summary = {"configs": {n: {} for n in res}}
    report.print_jit(res, summary)
    out = capsys.readouterr().out
    assert "load80_vllm: compiled while serving (not Triton): _FullyFusedDeltaRuleSm90" in out
    assert "load80_plugin" not in out


def test_compiles_are_placed_in_timed_or_untimed_windows(report, capsys):
    """With the engine's clock recorded, a CuTe-DSL compile inside a warm-up (the untimed first
    use of a TTFT length, the decode and load warm-ups) is told apart from one inside a timed
    window; a line whose second straddles a boundary names both windows."""
    marks = {"ttft": 0.0, "ttft_16000_first_use": 0.0, "ttft_16000_timed": 3.5, "decode": 5.6,
             "decode_timed": 9.0, "end": 11.5}
    r = {"engine_up_clock": "23:59:58.30", "scenario_start_s": marks}
    assert report.jit_window(r, "23:59:59") == ["ttft_16000_first_use"]
    assert report.jit_window(r, "00:00:02") == ["ttft_16000_timed"]  # past midnight
    assert report.jit_window(r, "00:00:03") == ["ttft_16000_timed", "decode"]
    assert report.jit_window(r, "00:00:04") == ["decode"]
    assert report.jit_window(r, "00:00:08") == ["decode_timed"]
    assert report.jit_window({"scenario_start_s": marks}, "00:00:04") == []
    res = {"warm": dict(r, jit_during_inference=[["00:00:04", "CuTeDSL", "_FullyFusedDeltaRuleSm90"]]),
           "hot": dict(r, jit_during_inference=[["00:00:03", "CuTeDSL", "_FullyFusedDeltaRuleSm90"],
                                                ["00:00:08", "Triton", "fused_moe_kernel"]])}
    summary = {"configs": {n: {} for n in res}}
    report.print_jit(res, summary)
    out = capsys.readouterr().out
    assert "warm: compiled while serving (not Triton): _FullyFusedDeltaRuleSm90 (CuTeDSL, 00:00:04), " \
           "in untimed warm-up decode" in out
    assert "hot: compiled while serving (not Triton): _FullyFusedDeltaRuleSm90 (CuTeDSL, 00:00:03), " \
           "in timed ttft_16000_timed: not a clean timing" in out
    assert [p["timed"] for p in summary["configs"]["hot"]["jit_placed"]] == [True]
    assert summary["configs"]["warm"]["jit_placed"][0]["windows"] == ["decode"]


def test_gpu_monitor_means_over_each_decode_run(report, tmp_path, capsys):
    """vllm_session.sh's nvidia-smi log, read over each decode run's wall window: a run that
    kept the GPU busy and one that left it half idle are told apart; lines it cannot read (a
    header, a cut last line) are skipped."""
    import time

    t0 = time.mktime(time.strptime("2026/12/04 12:00:00", "%Y/%m/%d %H:%M:%S"))
    lines = ["timestamp, utilization.gpu [%], clocks.sm [MHz], clocks.mem [MHz], power.draw [W], "
             "temperature.gpu"]
    for i in range(20):  # 100% for the first two seconds, 50% for the next two
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t0 + i * 0.2))
        lines.append(f"{stamp}.{int(i * 200 % 1000):03d}, {100 if i < 10 else 50}, 1980, 3201, "
                     f"{600 if i < 10 else 300}.0, 50")
    lines.append("2026/12/04 12:00:0")
    (tmp_path / "gpu_monitor.csv").write_text("\n".join(lines))
    rows = report.read_gpu_monitor(tmp_path / "gpu_monitor.csv")
    assert len(rows) == 20
    busy = report.monitor_over(rows, [t0 - 0.05, t0 + 1.9])
    half = report.monitor_over(rows, [t0 + 2.0, t0 + 4.0])
    assert busy == {"samples": 10, "util_pct": 100.0, "sm_mhz": 1980.0, "power_w": 600.0}
    assert half["util_pct"] == 50.0 and half["power_w"] == 300.0
    assert report.monitor_over(rows, [t0 + 10, t0 + 11]) is None
    runs = [{"tok_per_s": 1.0, "median_tpot_ms": 6.0, "wall": [t0 - 0.05, t0 + 1.9]},
            {"tok_per_s": 0.5, "median_tpot_ms": 9.0, "wall": [t0 + 2.0, t0 + 4.0]}]
    res = {"e80_plugin": {"scenarios": {"decode": {"engine_decode_runs": runs}}}}
    summary = {"configs": {"e80_plugin": {}}}
    report.print_decode_runs(res, summary, rows)
    assert [g["util_pct"] for g in summary["configs"]["e80_plugin"]["decode_gpu"]] == [100.0, 50.0]
    assert "(100.0, 1980.0, 600.0), (50.0, 1980.0, 300.0)" in capsys.readouterr().out
