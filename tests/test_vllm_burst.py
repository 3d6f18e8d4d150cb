"""profiling/vllm_e2e.py's burst scenario (several fresh prompts at once, then again) on a stand-in
engine, and vllm_report's check of its reuse (no GPU or vLLM needed)."""

import argparse
import json
import time
from types import SimpleNamespace as NS

import numpy as np
import pytest

from test_vllm_load import _module

B = 64


class FakeLLM:
    """generate(): one token per prompt; a prompt seen before reuses its whole blocks except the
    last token's (as vLLM: at most len - 1 tokens are cacheable), unless ``forget``."""

    def __init__(self, forget=False):
        self.seen, self.forget, self.calls = set(), forget, []

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(len(prompts))
        time.sleep(0.01)  # a measurable wall time
        out = []
        for i, p in enumerate(prompts):
            ids = tuple(p["prompt_token_ids"])
            hit = (len(ids) - 1) // B * B if ids in self.seen and not self.forget else 0
            self.seen.add(ids)
            out.append(NS(outputs=[NS(token_ids=[ids[-1] % 7])], num_cached_tokens=hit,
                          metrics=NS(first_token_latency=0.01 * (i + 1))))
        return out


def _run(e2e, llm, shapes, repeats=1):
    def whole_blocks(n_shared, prompt_len):
        return min(n_shared // B, (prompt_len - 1) // B) * B

    marks = {}
    res = e2e.burst_scenario(llm, np.random.default_rng(0), 1000, shapes, lambda n: None,
                             whole_blocks, marks, 0.0, 1234, repeats)
    return res, marks


def test_burst_runs_each_shape_first_use_cold_then_warm():
    e2e = _module("vllm_e2e")
    llm = FakeLLM()
    res, marks = _run(e2e, llm, [(4, 300), (3, 100)], repeats=3)
    assert llm.calls == [4] * 6 + [3] * 6  # first use twice, three cold, warm per shape
    assert set(res) == {"4x300", "3x100"}
    e = res["4x300"]
    assert e["cold"]["num_cached_tokens"] == [0] * 4  # fresh prompts, not the first-use ones
    assert e["warm"]["num_cached_tokens"] == [256] * 4 == [e["expected_warm_reuse"]] * 4
    assert e["cold"]["tokens"] == e["warm"]["tokens"]
    assert len(e["first_use_wall_s"]) == 2
    assert len(e["cold_walls_s"]) == 3 and e["cold_median_wall_s"] == sorted(e["cold_walls_s"])[1]
    assert e["cold"]["wall_s"] in e["cold_walls_s"]
    assert e["cold"]["ttft_s_min_median_max"] == [0.01, 0.03, 0.04]
    assert e["cold"]["prefill_tok_per_s"] == pytest.approx(1200 / e["cold"]["wall_s"], rel=0.02)
    assert list(marks) == ["burst_4x300_first_use", "burst_4x300_timed", "burst_3x100_first_use",
                           "burst_3x100_timed"]


def test_burst_shapes_parse_and_refuse():
    e2e = _module("vllm_e2e")
    assert e2e._bursts("16x2048,64x512") == [(16, 2048), (64, 512)]
    for bad in ("16", "16x", "0x512", "4x2x3", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            e2e._bursts(bad)


def test_report_fails_a_burst_that_did_not_reuse(tmp_path):
    e2e, report = _module("vllm_e2e"), _module("vllm_report")
    for name, llm in (("bf16_good", FakeLLM()), ("bf16_bad", FakeLLM(forget=True))):
        res, marks = _run(e2e, llm, [(2, 200)])
        run = {"config": {"plugin": "on", "prefix_caching": "on", "dtype": "bfloat16"},
               "scenarios": {"burst": res}, "mamba_cache_mode": "all", "block_size": B,
               "engine_start_s": 1.0}
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    problems = report.check(report.load(tmp_path))
    assert problems == ["bf16_bad: burst 2x200 warm reused [0, 0], expected 192 each"]


def test_decode_rate_from_engine_timestamps():
    """decode_rate: the span from the last first token to the last token, every row decoding;
    tokens/s over it; the median request's time per output token; no metrics, no rate."""
    e2e = _module("vllm_e2e")
    outs = [NS(metrics=NS(first_token_ts=f, last_token_ts=l))
            for f, l in ((1.0, 3.0), (1.5, 3.5), (2.0, 4.5))] + [NS(metrics=None)]
    r = e2e.decode_rate(outs, 11)
    assert r["span_s"] == pytest.approx(2.5)  # 4.5 - 2.0
    assert r["tok_per_s"] == pytest.approx(3 * 10 / 2.5, abs=0.05)
    assert r["median_tpot_ms"] == pytest.approx(200.0)  # (2.0, 2.0, 2.5) s over 10 tokens
    assert e2e.decode_rate([NS(metrics=None)], 11) == {"span_s": 0, "tok_per_s": None,
                                                       "median_tpot_ms": None}


def test_report_lists_decode_runs_and_burst_medians(capsys):
    report = _module("vllm_report")
    runs = [{"span_s": 1.0, "tok_per_s": t, "median_tpot_ms": 6.0} for t in (900.0, 1000.0, 950.0)]
    cold = {"wall_s": 0.3, "prefill_tok_per_s": 10.0, "ttft_s_min_median_max": [0.1, 0.2, 0.3]}
    res = {"x": {"scenarios": {
        "decode": {"engine_decode_runs": runs},
        "burst": {"2x200": {"cold": cold, "warm": {"wall_s": 0.1, "num_cached_tokens": [192] * 2},
                            "cold_walls_s": [0.1, 0.2, 0.3], "cold_median_wall_s": 0.2,
                            "expected_warm_reuse": 192}}}},
           "one": {"scenarios": {"decode": {"engine_decode_runs": runs[:1]}}}}
    summary = {"configs": {"x": {}, "one": {}}}
    report.print_bursts(res, summary)
    report.print_decode_runs(res, summary)
    out = capsys.readouterr().out
    assert "x: burst 2x200: cold median 0.200 s" in out
    assert summary["configs"]["x"]["burst"]["2x200"]["cold_median_wall_s"] == 0.2
    assert "x: decode runs, engine tok/s [900.0, 1000.0, 950.0]" in out
    assert summary["configs"]["x"]["decode_runs"] == runs
    assert "decode_runs" not in summary["configs"]["one"]  # a single run: nothing more to list


@pytest.mark.parametrize("flag", ["--burst-repeats", "--decode-repeats"])
def test_repeats_below_one_are_refused(flag, capsys):
    e2e = _module("vllm_e2e")
    with pytest.raises(SystemExit):
        e2e.main(["--model", "m", "--out", "x.json", flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err


def test_gpu_profile_keeps_the_decode_steps_difference(monkeypatch, tmp_path):
    """gpu_profile: the decode steps' kernels are the with-decode profile less the prefill-only
    one, kernel by kernel, per step (a stand-in profiler: no GPU needed)."""
    e2e = _module("vllm_e2e")
    runs = iter([
        (1.0, {"moe": (16, 800.0), "prefill_gdn": (6, 300.0)}, 1000.0),
        (3.0, {"moe": (56, 2000.0), "prefill_gdn": (6, 300.0), "gdn_decode": (60, 120.0)}, 2600.0),
    ])
    monkeypatch.setattr(e2e, "_kernel_profile", lambda fn: (fn(), next(runs))[1])
    calls = []
    res = e2e.gpu_profile(lambda: calls.append("p"), lambda: calls.append("d"), 10,
                          str(tmp_path / "prof.txt"))
    assert calls == ["p", "d"]
    assert res["wall_ms_per_step"] == 200.0             # (3.0 - 1.0) s over 10 steps
    assert res["gpu_busy_ms_per_step"] == 0.16          # (2600 - 1000) us over 10 steps
    assert res["kernel_ms_per_step"] == 0.132           # (1200 + 120) us over 10 steps
    assert res["launches_per_step"] == 10.0             # (40 + 60) over 10 steps
    assert res["top_kernels_us_per_step"] == [["moe", 4.0, 120.0], ["gdn_decode", 6.0, 12.0]]
    assert "gdn_decode" in (tmp_path / "prof.txt").read_text()
