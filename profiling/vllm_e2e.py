"""End to end through ``vllm.LLM`` (issue 5): prefix reuse, greedy tokens, TTFT and decode speed.

One engine configuration per process (an engine start is ~2 minutes; run several processes side
by side on one GPU with a small --gpu-mem each). Prompts are token ids (no tokenizer). Writes one
JSON file: per scenario the tokens generated, ``num_cached_tokens`` of each run, the expected
reuse (the shared prefix rounded down to whole blocks), timings, and the engine's block size.

    python profiling/vllm_e2e.py --model /tmp/tiny --plugin on --prefix-caching on --graphs on \
        --out run.json

Scenarios:
  repeat  a prompt of --prefix-len tokens + a 100-token tail, generated three times
  shared  prompt A = S + tail A, then prompt B = S + tail B (S = --shared-len tokens)
  system  a system prompt of --system-len tokens + three different 200-token questions, in turn
  chat    a three-turn conversation: turn 1 a --chat-len prompt, each later turn's prompt = the
          previous prompt + its answer (--chat-gen tokens) + a new 60-token question; expected
          reuse: every whole block of the previous prompt and answer
  ttft    a fresh --ttft-len prompt cold, then again warm: time to first token each (after a
          first-use pair of another prompt of that length, whose times are kept apart, so
          kernels compiled on a shape's first use are out of the measured ones; --ttft-len
          16000,32000: each length, the first in "ttft", the others in "ttft_more")
  decode  --decode-batch prompts of 256 tokens, --decode-tokens generated each: decode tokens/s
          (--decode-repeats timed runs of fresh prompts: the median reported, every run kept)
  burst   for each --burst NxL: N fresh prompts of L tokens submitted at once, one token each
          (several prefill sequences per step, where the GDN prefill kernels differ most), then
          the same N again (warm): wall time, prefill tokens/s, TTFT spread, reuse; after an
          untimed first-use burst of the same shape; --burst-repeats cold bursts of fresh prompts
          (median reported)
  abort   four requests at once through the engine's own loop: one aborted mid-prefill (a prompt
          longer than two steps' token budget, aborted after its first step), one aborted
          mid-decode (after 3 tokens), two that run on; the survivors' tokens must equal what
          each generates alone
  (--spec ngram|ngram_gpu|mtp|eagle3 --spec-k K [--spec-model DIR]: speculative decoding; the JSON then holds vLLM's spec-decode
  counters after each scenario, ``spec_stats_after``)
  load    requests arriving over time into a KV cache sized for a few of them, half sharing a
          system prompt, some with a second turn (profiling/vllm_load.py; --load-* flags):
          throughput, preemptions, TTFT/TPOT percentiles, reuse, GDN page stats
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_load  # noqa: E402


def ids(rng, n, vocab):
    return rng.integers(10, vocab - 10, size=n).tolist()


def _lengths(text):
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected token counts separated by commas, got {text!r}")
    return out


def _bursts(text):
    try:
        out = [tuple(int(x) for x in part.split("x")) for part in text.split(",")]
    except ValueError:
        out = []
    if not out or any(len(o) != 2 or min(o) < 1 for o in out):
        raise argparse.ArgumentTypeError(f"expected NxL[,NxL], got {text!r}")
    return out


def burst_scenario(llm, rng, vocab, shapes, greedy, whole_blocks, marks, t_up, seed, repeats=1):
    """N prompts of L tokens at once, cold then warm, per shape (module docstring); ``repeats``
    cold bursts of fresh prompts each (an engine's wall time varies by several % run to run)."""
    out = {}
    first_rng = np.random.default_rng(seed + 2)  # the first-use prompts (untimed)

    def batch(prompts):
        t = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(1), use_tqdm=False)
        wall = time.perf_counter() - t
        ttft = [getattr(o.metrics, "first_token_latency", None) for o in res if o.metrics is not None]
        ttft = sorted(x for x in ttft if x)
        return {"wall_s": round(wall, 4), "tokens": [list(o.outputs[0].token_ids) for o in res],
                "num_cached_tokens": [o.num_cached_tokens for o in res],
                "prefill_tok_per_s": round(sum(len(p) for p in prompts) / wall, 1),
                "ttft_s_min_median_max": [round(ttft[0], 4), round(ttft[len(ttft) // 2], 4),
                                          round(ttft[-1], 4)] if ttft else None}

    for n, length in shapes:
        key = f"{n}x{length}"
        marks[f"burst_{key}_first_use"] = round(time.time() - t_up, 2)
        # twice: the warm burst's shape (the tails past the reused blocks) compiles here too
        first = [ids(first_rng, length, vocab) for _ in range(n)]
        first = [batch(first), batch(first)]
        marks[f"burst_{key}_timed"] = round(time.time() - t_up, 2)
        more = [batch([ids(rng, length, vocab) for _ in range(n)]) for _ in range(repeats - 1)]
        prompts = [ids(rng, length, vocab) for _ in range(n)]
        cold, warm = batch(prompts), batch(prompts)
        walls = sorted([cold["wall_s"]] + [x["wall_s"] for x in more])
        out[key] = {"cold": cold, "warm": warm, "first_use_wall_s": [x["wall_s"] for x in first],
                    "cold_walls_s": walls, "cold_median_wall_s": walls[len(walls) // 2],
                    "expected_warm_reuse": whole_blocks(length, length)}
    return out


def decode_rate(outs, tokens):
    """A decode run's rate from the engine's own timestamps: from the moment every request has its
    first token to the last token, all rows decode (no prefill inside, no separate prefill run).
    Returns span_s, tok_per_s (None without metrics) and the requests' median time per output
    token."""
    ms = [o.metrics for o in outs if o.metrics is not None]
    span = max(m.last_token_ts for m in ms) - max(m.first_token_ts for m in ms) if ms else 0
    tpot = sorted((m.last_token_ts - m.first_token_ts) / max(tokens - 1, 1) for m in ms)
    return {"span_s": round(span, 4),
            "tok_per_s": round(len(ms) * (tokens - 1) / span, 1) if span > 0 else None,
            "median_tpot_ms": round(1e3 * tpot[len(tpot) // 2], 3) if tpot else None}


def write_profile(prof, path, title):
    """The functions with the most time, cumulative and own, as text."""
    import io
    import pstats
    buf = io.StringIO()
    buf.write(title + "\n")
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(45)
    with open(path, "w") as f:
        f.write(buf.getvalue())


def _kernel_profile(fn):
    """torch.profiler (CUDA activity) over fn(): wall seconds, and per kernel name
    [launches, summed us]; also the union of the kernels' intervals (GPU busy us), which summed
    times overcount where kernels overlap."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    kernels, spans = {}, []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != DeviceType.CUDA:
            continue
        name = e.name()[:140]
        n, us = kernels.get(name, (0, 0.0))
        kernels[name] = (n + 1, us + e.duration_ns() / 1e3)
        spans.append((e.start_ns(), e.start_ns() + e.duration_ns()))
    busy, end = 0, None
    for s0, s1 in sorted(spans):
        if end is None or s0 > end:
            busy += s1 - s0
            end = s1
        elif s1 > end:
            busy += s1 - end
            end = s1
    return wall, kernels, busy / 1e3


def gpu_profile(prefill_only, with_decode, decode_steps, path):
    """GPU kernel time of decode steps alone: torch.profiler over ``prefill_only()`` (fresh prompts,
    one token each) and over ``with_decode()`` (fresh prompts of the same shape, 1 + decode_steps
    tokens each); the difference, kernel by kernel, is what the decode steps ran. Writes a table to
    ``path`` (us per decode step: launches, GPU time, top kernels) and returns the figures."""
    w1, k1, b1 = _kernel_profile(prefill_only)
    w2, k2, b2 = _kernel_profile(with_decode)
    steps = max(decode_steps, 1)
    delta = {}
    for name in set(k1) | set(k2):
        n = k2.get(name, (0, 0.0))[0] - k1.get(name, (0, 0.0))[0]
        us = k2.get(name, (0, 0.0))[1] - k1.get(name, (0, 0.0))[1]
        if n or abs(us) > 1:
            delta[name] = (n, us)
    top = sorted(delta.items(), key=lambda kv: -kv[1][1])
    sum_us = sum(us for _, us in delta.values())
    res = {"decode_steps": decode_steps,
           "wall_ms_per_step": round((w2 - w1) * 1e3 / steps, 4),
           "gpu_busy_ms_per_step": round((b2 - b1) / 1e3 / steps, 4),
           "kernel_ms_per_step": round(sum_us / 1e3 / steps, 4),
           "launches_per_step": round(sum(n for n, _ in delta.values()) / steps, 2),
           "prefill_only": {"wall_s": round(w1, 4), "gpu_busy_s": round(b1 / 1e6, 4)},
           "with_decode": {"wall_s": round(w2, 4), "gpu_busy_s": round(b2 / 1e6, 4)},
           "top_kernels_us_per_step": [[name, round(n / steps, 3), round(us / steps, 2)]
                                       for name, (n, us) in top[:60]]}
    with open(path, "w") as f:
        f.write(f"decode steps {decode_steps}: wall {res['wall_ms_per_step']} ms a step, GPU busy "
                f"{res['gpu_busy_ms_per_step']} ms, kernels summed {res['kernel_ms_per_step']} ms, "
                f"{res['launches_per_step']} launches\n")
        f.write(f"{'us/step':>10} {'n/step':>8}  kernel\n")
        for name, n, us in res["top_kernels_us_per_step"]:
            f.write(f"{us:10.2f} {n:8.2f}  {name}\n")
    return res


def triton_compiles_since(t0):
    """Triton kernels compiled after wall time t0, from the metadata files in TRITON_CACHE_DIR
    (one ``<hash>/<kernel>.json`` per compile; the session gives each engine a fresh directory):
    [(seconds after t0, kernel name)], or None when the variable is not set."""
    root = os.environ.get("TRITON_CACHE_DIR")
    if not root or not os.path.isdir(root):
        return None
    found = []
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".json") and not f.startswith("__grp__"):
                mt = os.path.getmtime(os.path.join(d, f))
                if mt > t0:
                    found.append((round(mt - t0, 2), f[:-5]))
    return sorted(found)


SPEC_PREFIX = "vllm:spec_decode"


def spec_stats(llm) -> dict | None:
    """vLLM's speculative-decoding counters so far (drafts, draft tokens, accepted tokens, and
    accepted tokens per draft position), from ``LLM.get_metrics()``."""
    try:
        metrics = llm.get_metrics()
    except Exception as e:  # metrics off or another vLLM: say so in the results
        return {"error": repr(e)}
    out = {}
    for m in metrics:
        if m.name.startswith(SPEC_PREFIX):
            v = getattr(m, "values", None)
            out[m.name[len("vllm:"):]] = list(v) if v is not None else getattr(m, "value", None)
    return out


def speculative_config(method: str, k: int, model: str | None = None) -> dict | None:
    if method == "none":
        return None
    if method in ("ngram", "ngram_gpu"):  # ngram_gpu: the n-gram vLLM runs async scheduling with
        return {"method": method, "num_speculative_tokens": k, "prompt_lookup_max": 4,
                "prompt_lookup_min": 2}
    if method == "eagle3":  # a separate draft head (tools/tiny_model.py --eagle3-for)
        if not model:
            raise SystemExit("--spec eagle3 needs --spec-model (the draft head's directory)")
        return {"method": "eagle3", "model": model, "num_speculative_tokens": k}
    return {"method": "mtp", "num_speculative_tokens": k}


def chat_scenario(rng, vocab, a, run, whole_blocks):
    """Three turns; each later prompt = the previous prompt + its answer + a new question."""
    prompt, runs, expected = ids(rng, a.chat_len, vocab), [], []
    for turn in range(3):
        r = run(prompt, a.chat_gen)
        runs.append(r)
        prev = prompt + r["tokens"]
        prompt = prev + ids(rng, 60, vocab)
        # the last answer token is never fed back: prev - 1 tokens are cached at most
        expected.append(whole_blocks(len(prev) - 1, len(prompt)))
    return {"runs": runs, "expected_reuse_per_turn": [None] + expected[:2]}


def abort_scenario(llm, rng, vocab, max_batched, gen, greedy, run):
    """Aborts mid-prefill and mid-decode next to requests that run on (see the module docstring);
    the survivors are first run alone, so together they also hit the prefix cache."""
    prompts = {"abort_prefill": ids(rng, 2 * max_batched + 100, vocab),
               "abort_decode": ids(rng, 700, vocab),
               "keep_long": ids(rng, max_batched + 300, vocab),
               "keep_short": ids(rng, 400, vocab)}
    alone = {k: run(p, gen)["tokens"] for k, p in prompts.items() if k.startswith("keep")}
    eng = llm.llm_engine
    tag = f"abort-{time.time_ns()}-"
    for k, p in prompts.items():   # FIFO: the prefill victim takes the first step's budget
        eng.add_request(tag + k, {"prompt_token_ids": p}, greedy(gen))
    latest, aborted, steps = {}, {}, 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            latest[out.request_id[len(tag):]] = out
        steps += 1
        if steps == 1 and "abort_prefill" not in aborted:
            eng.abort_request([tag + "abort_prefill"])
            aborted["abort_prefill"] = {"step": steps, "tokens_out": 0}
        dec = latest.get("abort_decode")
        if "abort_decode" not in aborted and dec is not None and len(dec.outputs[0].token_ids) >= 3:
            eng.abort_request([tag + "abort_decode"])
            aborted["abort_decode"] = {"step": steps, "tokens_out": len(dec.outputs[0].token_ids)}
    together = {k: list(latest[k].outputs[0].token_ids) for k in alone if k in latest}
    return {"steps": steps, "aborted": aborted, "alone": alone, "together": together,
            "survivors_equal": all(together.get(k) == v for k, v in alone.items()),
            "aborted_finished": {k: (latest[k].finished if k in latest else None) for k in aborted}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--plugin", choices=("on", "off"), default="on")
    ap.add_argument("--prefix-caching", choices=("on", "off"), default="on")
    ap.add_argument("--graphs", choices=("on", "off"), default="on", help="off = enforce_eager")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--language-model-only", action="store_true",
                    help="vision-language checkpoints (Qwen3.5): build and run the text model only")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--max-batched", type=int, default=8192)
    ap.add_argument("--gpu-mem", type=float, default=0.15)
    ap.add_argument("--kv-cache-gib", type=float, default=None,
                    help="fixed KV-cache size (skips vLLM's memory profiling: engines side by side)")
    ap.add_argument("--prefix-len", type=int, default=24000)
    ap.add_argument("--shared-len", type=int, default=19700)
    ap.add_argument("--system-len", type=int, default=3000)
    ap.add_argument("--ttft-len", type=_lengths, default=[16000], metavar="16000[,32000]")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--chat-len", type=int, default=1000)
    ap.add_argument("--chat-gen", type=int, default=400)
    ap.add_argument("--spec", choices=("none", "ngram", "ngram_gpu", "mtp", "eagle3"),
                    default="none",
                    help="speculative decoding: n-gram (prompt lookup; ngram_gpu: on the device, "
                         "vLLM's n-gram for async scheduling), the checkpoint's MTP or an EAGLE-3 "
                         "head (--spec-model)")
    ap.add_argument("--spec-model", default=None, help="--spec eagle3: the draft head's directory")
    ap.add_argument("--spec-k", type=int, default=3, help="draft tokens per step")
    ap.add_argument("--async-scheduling", choices=("default", "on", "off"), default="default",
                    help="vLLM's async_scheduling; default: left unset (vLLM's choice, with the "
                         "plugin too)")
    ap.add_argument("--decode-batch", type=int, default=32)
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--decode-repeats", type=int, default=1,
                    help="timed decode runs of fresh prompts in the engine (the median by the "
                         "engine's rate is reported, every run under engine_decode_runs)")
    ap.add_argument("--burst", type=_bursts, default=[(16, 2048)], metavar="16x2048[,64x512]",
                    help="the burst scenario's shapes: N prompts of L tokens at once")
    ap.add_argument("--burst-repeats", type=int, default=3,
                    help="cold bursts of fresh prompts per shape (their median is reported)")
    ap.add_argument("--scenarios", default="repeat,shared,system,ttft,decode")
    ap.add_argument("--keep-states", default=None,
                    help="the plugin's keep_states option: all | ends | N (default: its own)")
    ap.add_argument("--prefill", choices=("ours", "flashinfer"), default=None,
                    help="the plugin's prefill option (default: its own, ours); flashinfer runs "
                         "where it can (SM90, FlashInfer staged, fp32 state pool: --state-dtype)")
    ap.add_argument("--state-dtype", default=None, choices=("auto", "float32", "bfloat16"),
                    help="vLLM's mamba_ssm_cache_dtype (default: vLLM's, the model's dtype)")
    vllm_load.add_args(ap)
    ap.add_argument("--gdn-prefill-backend", default="default",
                    choices=("default", "auto", "triton", "flashinfer"),
                    help="vLLM's GDN prefill when the plugin is off; default: vLLM's own 'auto' "
                         "where FlashInfer imports (staged), else 'triton'")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", required=True)
    ap.add_argument("--host-profile", default=None, metavar="TXT",
                    help="engine in this process (no engine-core subprocess) and cProfile of the timed "
                         "decode run, written to TXT: where the host time of a step goes")
    ap.add_argument("--gpu-profile", default=None, metavar="TXT",
                    help="engine in this process and torch.profiler over decode steps after the timed "
                         "runs: GPU kernel time per step against wall time, top kernels, to TXT")
    a = ap.parse_args(argv)
    if a.burst_repeats < 1:
        ap.error(f"--burst-repeats must be at least 1, got {a.burst_repeats}")
    if a.decode_repeats < 1:
        ap.error(f"--decode-repeats must be at least 1, got {a.decode_repeats}")
    if a.host_profile or a.gpu_profile:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine starts

    import importlib.metadata
    import importlib.util

    eps = [e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")]
    print("vllm.general_plugins:", eps, flush=True)
    if a.plugin == "on" and "gdn_graphs.vllm:register" not in eps:
        raise SystemExit("gdn_graphs is not installed as a vLLM plugin (pip install -e . first)")
    from vllm import LLM, SamplingParams

    backend = a.gdn_prefill_backend
    if backend == "default":  # vLLM's own choice ("auto": FlashInfer on Hopper) where it can run
        backend = "auto" if importlib.util.find_spec("flashinfer") else "triton"
    print(f"gdn_prefill_backend requested: {backend}", flush=True)
    extra = {"gdn_prefill_backend": backend, "gdn_graphs": a.plugin == "on"}
    options = {}
    if a.keep_states is not None:
        options["keep_states"] = int(a.keep_states) if a.keep_states.isdigit() else a.keep_states
    if a.prefill is not None:
        options["prefill"] = a.prefill
    if a.plugin == "on" and options:
        extra["gdn_graphs"] = options
    kv_bytes = int(a.kv_cache_gib * 2**30) if a.kv_cache_gib else None
    if kv_bytes is None and "load" in a.scenarios.split(","):
        kv_bytes = vllm_load.load_kv_bytes(a.model, a)
    if a.plugin == "on":  # the engine core writes its GDN page stats there (read by the load run)
        os.environ["GDN_GRAPHS_PAGE_STATS"] = os.path.abspath(a.out) + ".pages"
    t0 = time.perf_counter()
    llm = LLM(model=a.model, dtype=a.dtype, tensor_parallel_size=a.tp, load_format=a.load_format,
              enable_prefix_caching=a.prefix_caching == "on", enforce_eager=a.graphs == "off",
              max_model_len=a.max_model_len, max_num_batched_tokens=a.max_batched,
              max_num_seqs=64, gpu_memory_utilization=a.gpu_mem, skip_tokenizer_init=True,
              attention_backend="TRITON_ATTN", additional_config=extra, seed=0,
              disable_log_stats=False,
              kv_cache_memory_bytes=kv_bytes,
              compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]},
              speculative_config=speculative_config(a.spec, a.spec_k, a.spec_model),
              **({} if a.async_scheduling == "default" else
                 {"async_scheduling": a.async_scheduling == "on"}),
              **({"language_model_only": True} if a.language_model_only else {}),
              **({"mamba_ssm_cache_dtype": a.state_dtype} if a.state_dtype else {}))
    start_s = time.perf_counter() - t0
    t_up = time.time()  # wall clock, to compare with file times
    # the same clock as vLLM's log lines (local time, whole seconds): vllm_report places the JIT
    # monitor's compiles in the scenario windows below with it
    up_clock = time.strftime("%H:%M:%S", time.localtime(t_up)) + f".{int(t_up % 1 * 100):02d}"
    vcfg = llm.llm_engine.vllm_config
    cc = vcfg.cache_config
    B = cc.block_size
    vocab = vcfg.model_config.get_vocab_size()
    rng = np.random.default_rng(a.seed)
    res = {"config": vars(a), "engine_start_s": round(start_s, 1), "block_size": B,
           "kv_cache_bytes": kv_bytes, "gdn_prefill_backend": backend, "num_gpu_blocks": getattr(cc, "num_gpu_blocks", None),
           "max_model_len": vcfg.model_config.max_model_len,
           "mamba_block_size": cc.mamba_block_size, "mamba_cache_mode": cc.mamba_cache_mode,
           "cudagraph_mode": str(vcfg.compilation_config.cudagraph_mode), "scenarios": {},
           "async_scheduling": vcfg.scheduler_config.async_scheduling}
    spec_after = res["spec_stats_after"] = {} if a.spec != "none" else None
    print(f"engine up in {start_s:.0f} s: mode {cc.mamba_cache_mode}, block {B}", flush=True)
    if a.plugin == "on" and a.prefix_caching == "on" and cc.mamba_cache_mode != "all":
        raise SystemExit(f"the plugin did not take effect: mamba cache mode {cc.mamba_cache_mode}")

    def greedy(n):
        return SamplingParams(temperature=0.0, max_tokens=n, logprobs=2, ignore_eos=True,
                              detokenize=False)

    def run(prompt, n):
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": prompt}], greedy(n), use_tqdm=False)[0]
        wall = time.perf_counter() - t
        c = out.outputs[0]
        margins = top2_margins(c)
        m = out.metrics
        ttft = getattr(m, "first_token_latency", None) if m is not None else None
        return {"tokens": list(c.token_ids), "num_cached_tokens": out.num_cached_tokens,
                "prompt_len": len(prompt), "wall_s": round(wall, 4),
                "ttft_s": round(ttft, 4) if ttft else None, "top2_margins": margins}

    def top2_margins(c):
        margins = []
        for lp in c.logprobs or []:
            v = sorted((x.logprob for x in lp.values()), reverse=True)
            margins.append(v[0] - v[1] if len(v) > 1 else None)
        return margins

    # with an EAGLE / MTP drafter vLLM drops the last matched block of every hit (its
    # ``drop_eagle_block``: the drafter needs that block's hidden states), in its own mode too
    drop = 1 if a.spec in ("mtp", "eagle3") else 0

    def whole_blocks(n_shared, prompt_len):
        # vLLM never reuses the last prompt token: at most prompt_len - 1 tokens are cacheable
        return max(min(n_shared // B, (prompt_len - 1) // B) - drop, 0) * B

    want = set(a.scenarios.split(","))
    S = res["scenarios"]
    # seconds after engine start at which each scenario (and each untimed warm-up inside one:
    # NAME_first_use / NAME, then NAME_timed) began, to place compiles; "end" closes the last
    marks = res["scenario_start_s"] = {}
    res["engine_up_clock"] = up_clock
    if "repeat" in want:
        marks["repeat"] = round(time.time() - t_up, 2)
        p = ids(rng, a.prefix_len, vocab) + ids(rng, 100, vocab)
        runs = [run(p, a.gen) for _ in range(3)]
        S["repeat"] = {"runs": runs, "expected_reuse": whole_blocks(len(p), len(p))}
    if "shared" in want:
        marks["shared"] = round(time.time() - t_up, 2)
        s = ids(rng, a.shared_len, vocab)
        pa, pb = s + ids(rng, 300, vocab), s + ids(rng, 300, vocab)
        S["shared"] = {"runs": [run(pa, a.gen), run(pb, a.gen)],
                       "expected_reuse": whole_blocks(len(s), len(pb)), "shared_len": len(s)}
    if "system" in want:
        marks["system"] = round(time.time() - t_up, 2)
        s = ids(rng, a.system_len, vocab)
        qs = [s + ids(rng, 200, vocab) for _ in range(3)]
        S["system"] = {"runs": [run(q, a.gen) for q in qs],
                       "expected_reuse": whole_blocks(len(s), len(qs[1])), "shared_len": len(s)}
    if "chat" in want:
        marks["chat"] = round(time.time() - t_up, 2)
        S["chat"] = chat_scenario(rng, vocab, a, run, whole_blocks)
    if spec_after is not None:
        spec_after["reuse"] = spec_stats(llm)  # repeat, shared, system and chat
    if "ttft" in want:
        marks["ttft"] = round(time.time() - t_up, 2)
        first_rng = np.random.default_rng(a.seed + 1)  # (the measured prompts stay as before)
        for i, n in enumerate(a.ttft_len):
            # first use of this length (vLLM's MoE kernels per token count, FlashInfer's CuTe-DSL
            # prefill in vLLM's own mode): compiled here, not in the measured pair
            w = ids(first_rng, n, vocab)
            marks[f"ttft_{n}_first_use"] = round(time.time() - t_up, 2)
            first_use = [run(w, 1)["ttft_s"], run(w, 1)["ttft_s"]]
            marks[f"ttft_{n}_timed"] = round(time.time() - t_up, 2)
            p = ids(rng, n, vocab)
            entry = {"cold": run(p, 1), "warm": run(p, 1), "first_use_ttft_s": first_use}
            if i == 0:
                S["ttft"] = entry
            else:
                S.setdefault("ttft_more", {})[str(n)] = entry
    if "decode" in want:
        marks["decode"] = round(time.time() - t_up, 2)
        # warm-up: the same batch shape once, so every kernel variant the measured runs launch
        # (mixed prefill+decode steps included) is compiled before the clock starts
        ps = [{"prompt_token_ids": ids(rng, 256, vocab)} for _ in range(a.decode_batch)]
        llm.generate(ps, greedy(a.decode_tokens), use_tqdm=False)
        marks["decode_timed"] = round(time.time() - t_up, 2)
        ps2 = [{"prompt_token_ids": ids(rng, 256, vocab)} for _ in range(a.decode_batch)]
        t = time.perf_counter()
        llm.generate(ps2, greedy(1), use_tqdm=False)
        t_one = time.perf_counter() - t
        ps3 = [{"prompt_token_ids": ids(rng, 256, vocab)} for _ in range(a.decode_batch)]
        prof = None
        if a.host_profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t, w0 = time.perf_counter(), time.time()
        outs = llm.generate(ps3, greedy(a.decode_tokens), use_tqdm=False)
        t_all, w1 = time.perf_counter() - t, time.time()
        if prof is not None:
            prof.disable()
            write_profile(prof, a.host_profile, f"decode run: {t_all:.3f} s wall")
        # batched steps mix decode rows with prefill rows: compare these tokens across configs too
        toks = [(list(o.outputs[0].token_ids), top2_margins(o.outputs[0])) for o in outs]
        dec = a.decode_batch * (a.decode_tokens - 1) / max(t_all - t_one, 1e-9)
        # each run's wall-clock window (epoch s): vllm_report lines it up with a GPU monitor log
        rates = [dict(decode_rate(outs, a.decode_tokens), wall=[round(w0, 3), round(w1, 3)])]
        # --decode-repeats: more timed runs of fresh prompts in the same engine, so the spread
        # within one engine is told apart from the spread between engine starts
        for _ in range(a.decode_repeats - 1):
            ps = [{"prompt_token_ids": ids(rng, 256, vocab)} for _ in range(a.decode_batch)]
            w0 = time.time()
            outs_r = llm.generate(ps, greedy(a.decode_tokens), use_tqdm=False)
            rates.append(dict(decode_rate(outs_r, a.decode_tokens),
                              wall=[round(w0, 3), round(time.time(), 3)]))
        by_rate = sorted((r for r in rates if r["tok_per_s"]), key=lambda r: r["tok_per_s"])
        mid = by_rate[len(by_rate) // 2] if by_rate else rates[0]
        S["decode"] = {"batch": a.decode_batch, "tokens": a.decode_tokens, "t_prefill_s": t_one,
                       "t_total_s": t_all, "decode_tok_per_s": round(dec, 1),
                       "engine_decode_span_s": mid["span_s"],
                       "engine_decode_tok_per_s": mid["tok_per_s"],
                       "median_tpot_ms": mid["median_tpot_ms"],
                       "engine_decode_runs": rates,
                       "runs": [{"tokens": t, "top2_margins": m} for t, m in toks]}
        if a.gpu_profile:
            # the decode steps' GPU time alone: fresh prompts of the decode run's shape, once for
            # one token (prefill) and once for 1 + n; the difference is n decode steps
            n_dec = min(a.decode_tokens, 128)
            ps4, ps5 = ([{"prompt_token_ids": ids(rng, 256, vocab)} for _ in range(a.decode_batch)]
                        for _ in range(2))
            S["decode"]["gpu_profile"] = gpu_profile(
                lambda: llm.generate(ps4, greedy(1), use_tqdm=False),
                lambda: llm.generate(ps5, greedy(1 + n_dec), use_tqdm=False), n_dec, a.gpu_profile)
    if "burst" in want:
        marks["burst"] = round(time.time() - t_up, 2)
        S["burst"] = burst_scenario(llm, rng, vocab, a.burst, greedy, whole_blocks, marks, t_up,
                                      a.seed, a.burst_repeats)
    if spec_after is not None:
        spec_after["decode"] = spec_stats(llm)  # ttft, decode and burst too
    if "abort" in want:
        marks["abort"] = round(time.time() - t_up, 2)
        S["abort"] = abort_scenario(llm, rng, vocab, a.max_batched, a.gen, greedy, run)
    if "load" in want:
        marks["load"] = round(time.time() - t_up, 2)
        S["load"] = vllm_load.run_load(llm, rng, vocab, a, greedy(a.load_gen), B)
        marks["load_timed"] = round(marks["load"] + S["load"]["warmup_s"], 2)
    marks["end"] = round(time.time() - t_up, 2)
    res["triton_compiles_after_start"] = triton_compiles_since(t_up)
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(f"wrote {a.out}", flush=True)
    # Skip vLLM's slow teardown: the results are on disk.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
