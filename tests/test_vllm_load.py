"""profiling/vllm_load.py (the load scenario) on a stand-in engine, and vllm_report's reading of
it (no GPU or vLLM needed)."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(name):
    sys.path.insert(0, str(ROOT / "profiling"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "profiling" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def load():
    return _module("vllm_load")


def args(load, *extra):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    load.add_args(ap)
    return ap.parse_args(["--load-requests", "12", "--load-prompt-len", "600", "--load-system-len",
                          "300", "--load-gen", "4", "--load-rate", "200", "--load-turn-every", "2",
                          "--load-turn-len", "20", "--load-think-s", "0", *extra])


class FakeEngine:
    """add_request / step / has_unfinished_requests: one token per request per step, a prefix hit
    of the longest whole-64 prefix any earlier prompt shares."""

    def __init__(self):
        self.live, self.seen = {}, []

    def add_request(self, rid, prompt, params):
        p = prompt["prompt_token_ids"]
        hit = max([self._common(p, q) for q in self.seen] or [0]) // 64 * 64
        self.seen.append(p)
        self.live[rid] = {"n": 0, "max": params.max_tokens, "hit": hit}

    @staticmethod
    def _common(a, b):
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        outs = []
        for rid, r in list(self.live.items()):
            r["n"] += 1
            done = r["n"] == r["max"]
            outs.append(NS(request_id=rid, finished=done, num_cached_tokens=r["hit"],
                           outputs=[NS(token_ids=list(range(r["n"])))],
                           metrics=NS(first_token_ts=0.0, last_token_ts=0.01 * (r["n"] - 1))))
            if done:
                del self.live[rid]
        return outs


class FakeLLM:
    def __init__(self):
        self.llm_engine = FakeEngine()
        self.preempted = 0
        self.generated = []  # prompts of generate() calls (the warm-up)

    def generate(self, prompts, params, use_tqdm=False):
        eng, done = self.llm_engine, {}
        names = [f"g{len(self.generated) + i}" for i in range(len(prompts))]
        for name, p in zip(names, prompts):
            eng.add_request(name, p, params)
        self.generated += [p["prompt_token_ids"] for p in prompts]
        while eng.has_unfinished_requests():
            done.update({o.request_id: o for o in eng.step() if o.finished})
        return [done[n] for n in names]

    def get_metrics(self):
        self.preempted += 3
        return [NS(name="vllm:num_preemptions", value=self.preempted),
                NS(name="vllm:prefix_cache_hits", value=0)]


def test_workload_half_shares_the_system_prompt(load):
    a = args(load)
    reqs = load.workload(np.random.default_rng(0), a, 4096)
    assert len(reqs) == 12 and [t for t, *_ in reqs] == sorted(t for t, *_ in reqs)
    shared = [p for _, _, p, k in reqs if k == "shared"]
    assert len(shared) == 6 and all(p[:300] == shared[0][:300] and len(p) == 600 for p in shared)
    assert len({tuple(p[:300]) for _, _, p, k in reqs if k == "own"}) == 6


def test_run_load_on_a_stand_in_engine(load, tmp_path, monkeypatch):
    pages = tmp_path / "pages.json"
    pages.write_text(json.dumps({"held": 0, "peak_held": 9, "evictable": 4, "in_place": 1}))
    monkeypatch.setenv("GDN_GRAPHS_PAGE_STATS", str(pages))
    a = args(load)
    res = load.run_load(FakeLLM(), np.random.default_rng(0), 4096, a, NS(max_tokens=4), 64)
    # 12 first turns + second turns of shared requests 0, 2, 4 (every 2nd of 6) -> s0, s4, s8
    assert res["requests"] == 15 and res["finished"] == 15 and not res["timed_out"]
    assert res["all_generated"] and res["output_tokens"] == 60 and res["preemptions"] == 3
    assert res["system_expected"] == 256 and res["shared_hit_fraction"] == 1.0
    assert res["reused_mean"]["turn2"] >= 576 and res["gdn_pages"]["peak_held"] == 9
    assert set(res["ttft_s"]) == {50, 90, 99} and res["tpot_ms"][50] == pytest.approx(10.0)
    r = {"scenarios": {"load": res}}
    assert load.check("x", r, plugin_on=True) == []
    res["gdn_pages"]["held"] = 2
    res["shared_hit_fraction"] = 0.2
    assert len(load.check("x", r, plugin_on=True)) == 2


def test_warm_up_runs_the_load_shapes_first_and_changes_no_result(load):
    """--load-warmup: that many prompts of the load's length (every other one with a system
    prompt of its own) and a second turn run before the clock starts; the load's prompts, hits
    and counters are those of a run without warm-up."""
    runs = {}
    for n in (0, 4):
        llm = FakeLLM()
        runs[n] = load.run_load(llm, np.random.default_rng(0), 4096, args(load, "--load-warmup", str(n)),
                                NS(max_tokens=4), 64)
        if n:
            warm = llm.generated
            assert len(warm) == 5 and all(len(p) == 600 for p in warm[:4])
            assert warm[0][:300] == warm[2][:300] and warm[0][:300] != warm[1][:300]
            assert warm[4][:600] == warm[0] and len(warm[4]) == 600 + 4 + 20  # its second turn
            load_prompts = llm.llm_engine.seen[5:]
            assert not any(p[:64] == w[:64] for p in load_prompts for w in warm)
    assert runs[0]["warmup_requests"] == 0 and runs[4]["warmup_requests"] == 5
    # how long the warm-up took: vllm_e2e marks the load's clock start (load_timed) with it
    assert runs[0]["warmup_s"] == 0 and runs[4]["warmup_s"] >= 0
    for key in ("requests", "finished", "output_tokens", "reused_tokens", "reused_mean",
                "preemptions", "shared_hit_fraction"):
        assert runs[4][key] == runs[0][key], key


def test_timeout_is_reported(load):
    a = args(load, "--load-timeout-s", "0")
    res = load.run_load(FakeLLM(), np.random.default_rng(0), 4096, a, NS(max_tokens=4), 64)
    assert res["timed_out"] and load.check("x", {"scenarios": {"load": res}}, False)


@pytest.mark.vllm  # tools.tiny_model needs transformers, which the vLLM tier installs
def test_kv_bytes_from_the_tiny_checkpoint(load, tmp_path):
    from tools.tiny_model import tiny_config

    tiny_config().save_pretrained(tmp_path)
    a = args(load, "--load-concurrency", "8")
    # one full-attention layer, 2 KV heads of 64, bf16: 512 bytes a token; three GDN layers of
    # 8 value heads of 64 x 64 and a conv window of 3 x (2 * 4 * 64 + 8 * 64) channels, bf16,
    # two states a request
    gdn = 3 * (8 * 64 * 64 + 3 * (2 * 4 * 64 + 8 * 64)) * 2
    assert load.load_kv_bytes(str(tmp_path), a) == int(8 * ((600 + 4 + 20) * 512 * 1.05 + 2 * gdn))


def test_report_reads_the_logged_capacity(tmp_path):
    report = _module("vllm_report")
    run = {"config": {"plugin": "on", "prefix_caching": "off"}, "scenarios": {},
           "mamba_cache_mode": "none", "block_size": 192, "engine_start_s": 1.0}
    (tmp_path / "cap_plugin.json").write_text(json.dumps(run))
    (tmp_path / "cap_plugin.log").write_text(
        "INFO [kv_cache_utils.py:2177] GPU KV cache size: 84,171,049 tokens\n"
        "INFO [kv_cache_utils.py:2178] Maximum concurrency for 32,768 tokens per request: 2568.7x\n")
    res = report.load(tmp_path)
    assert res["cap_plugin"]["capacity"] == {"tokens": 84171049, "per_request_tokens": 32768,
                                             "concurrency": 2568.7}
