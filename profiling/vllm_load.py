"""The load scenario of profiling/vllm_e2e.py (issue 16): requests arriving over time into a KV
cache that holds a few of them.

--load-requests requests (64) of about --load-prompt-len tokens (16k) arrive as a Poisson
process at --load-rate per second; every other one starts with one shared --load-system-len
system prompt (6k); every --load-turn-every-th shared request (4th) is followed, once it has
finished, by a second turn: its prompt + its output + --load-turn-len new tokens. Each request
generates --load-gen tokens (greedy, ignore_eos). The engine is driven through its own
add_request / step loop, so arrivals interleave with steps; the loop stops at --load-timeout-s.

Before the clock starts, --load-warmup requests of the same shapes run (``warm_up``). Recorded:
wall time, output and prompt throughput, vLLM's preemption count and prefix-cache
counters, TTFT and TPOT percentiles (this loop's clock: arrival to the step that returned the
first token; TPOT from the engine's token timestamps), reused tokens per kind of request, and
with the plugin the GDN page stats (peak held, evictable, in place) from GDN_GRAPHS_PAGE_STATS.
``load_kv_bytes`` sizes the KV cache for --load-concurrency such requests (the engine's
attention bytes per token), the same for both modes.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np


def add_args(ap) -> None:
    g = ap.add_argument_group("load scenario")
    g.add_argument("--load-requests", type=int, default=64)
    g.add_argument("--load-prompt-len", type=int, default=16000)
    g.add_argument("--load-system-len", type=int, default=6000)
    g.add_argument("--load-gen", type=int, default=128)
    g.add_argument("--load-rate", type=float, default=4.0, help="arrivals per second")
    g.add_argument("--load-turn-every", type=int, default=4)
    g.add_argument("--load-turn-len", type=int, default=300)
    g.add_argument("--load-think-s", type=float, default=0.5, help="second turn after the first")
    g.add_argument("--load-concurrency", type=float, default=8.0,
                   help="KV memory for this many concurrent prompt+gen requests (--kv-cache-gib "
                        "overrides)")
    g.add_argument("--load-timeout-s", type=float, default=150.0)
    g.add_argument("--load-warmup", type=int, default=4,
                   help="requests of the load's shapes run before the clock starts (0: none)")


def load_kv_bytes(model_path: str, a) -> int:
    """KV bytes for --load-concurrency requests of prompt + gen (+ a second turn's growth), from
    the checkpoint's full-attention layers (K and V per token), plus 5%, plus two GDN states per
    request (SSM state and conv window of every GDN layer, in the model's dtype: a running page
    and a cached one; with the 80B-A3B layout a state is 1 MiB a layer, so the 5% alone would
    leave a few pages; for the tiny model the term is about 4% more memory than before
    2026-12-01's fifth session, whose load runs had the 5% only)."""
    cfg = json.load(open(os.path.join(model_path, "config.json")))
    text = cfg.get("text_config", cfg)
    kinds = text.get("layer_types") or []
    n_attn = sum(k == "full_attention" for k in kinds) or max(
        1, text["num_hidden_layers"] // text.get("full_attention_interval", 4))
    n_gdn = sum(k == "linear_attention" for k in kinds) or text["num_hidden_layers"] - n_attn
    size = 4 if a.dtype == "float32" else 2
    per_token = n_attn * 2 * text["num_key_value_heads"] * text["head_dim"] * size
    tokens = a.load_prompt_len + a.load_gen + a.load_turn_len
    hk, hv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dk, dv = text["linear_key_head_dim"], text["linear_value_head_dim"]
    conv = (2 * hk * dk + hv * dv) * (text["linear_conv_kernel_dim"] - 1)
    gdn_state = n_gdn * (hv * dk * dv + conv) * size
    return int(a.load_concurrency * (tokens * per_token * 1.05 + 2 * gdn_state))


def workload(rng, a, vocab):
    """[(arrival_s, name, prompt, kind)] for the first turns; kind "shared" / "own"."""
    system = rng.integers(10, vocab - 10, a.load_system_len).tolist()
    t, reqs = 0.0, []
    for i in range(a.load_requests):
        t += rng.exponential(1.0 / a.load_rate)
        if i % 2 == 0:
            p = system + rng.integers(10, vocab - 10, a.load_prompt_len - a.load_system_len).tolist()
            reqs.append((t, f"s{i}", p, "shared"))
        else:
            reqs.append((t, f"o{i}", rng.integers(10, vocab - 10, a.load_prompt_len).tolist(), "own"))
    return reqs


def pct(xs, q):
    return round(float(np.percentile(xs, q)), 4) if xs else None


def metric_values(llm) -> dict:
    try:
        return {m.name: getattr(m, "value", None) for m in llm.get_metrics()
                if m.name in ("vllm:num_preemptions", "vllm:prefix_cache_hits",
                              "vllm:prefix_cache_queries")}
    except Exception as e:  # stats logging off: say so in the results
        return {"error": repr(e)}


def warm_up(llm, a, vocab, params) -> int:
    """The load's shapes once before the clock starts, so kernels compiled on first use (vLLM's
    MoE per token count; in vLLM's own mode FlashInfer's CuTe-DSL GDN prefill, seen compiling
    inside a timed load on 2026-12-01) are out of the timings: --load-warmup prompts of
    --load-prompt-len tokens at once, every other one sharing a system prompt of its own, then a
    second turn of the first. Their tokens come from their own generator: the load's prompts are
    the same as without warm-up and never hit them (they stay in the cache as evictable blocks,
    the same for both modes). Returns the number of requests run."""
    if a.load_warmup < 1:
        return 0
    rng = np.random.default_rng(getattr(a, "seed", 0) + 2)
    system = rng.integers(10, vocab - 10, a.load_system_len).tolist()
    ps = []
    for i in range(a.load_warmup):
        head = system if i % 2 == 0 else []
        ps.append(head + rng.integers(10, vocab - 10, a.load_prompt_len - len(head)).tolist())
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)
    turn = (ps[0] + list(outs[0].outputs[0].token_ids)
            + rng.integers(10, vocab - 10, a.load_turn_len).tolist())
    llm.generate([{"prompt_token_ids": turn}], params, use_tqdm=False)
    return len(ps) + 1


def run_load(llm, rng, vocab, a, params, block):
    eng = llm.llm_engine
    t_w = time.perf_counter()
    warmed = warm_up(llm, a, vocab, params)
    warmup_s = time.perf_counter() - t_w
    first = workload(rng, a, vocab)
    pending = sorted(first)            # (arrival, name, prompt, kind)
    info, latest, shared_turns = {}, {}, 0
    before = metric_values(llm)
    t0 = time.perf_counter()
    while (pending or eng.has_unfinished_requests()) and time.perf_counter() - t0 < a.load_timeout_s:
        now = time.perf_counter() - t0
        while pending and pending[0][0] <= now:
            arr, name, prompt, kind = pending.pop(0)
            eng.add_request(name, {"prompt_token_ids": prompt}, params)
            info[name] = {"kind": kind, "arrival": arr, "prompt_len": len(prompt), "prompt": prompt}
        if not eng.has_unfinished_requests():
            time.sleep(min(0.01, max(pending[0][0] - now, 0)) if pending else 0)
            continue
        for out in eng.step():
            r = info[out.request_id]
            if "first" not in r and out.outputs and out.outputs[0].token_ids:
                r["first"] = time.perf_counter() - t0
            latest[out.request_id] = out
            if out.finished:
                r["done"] = time.perf_counter() - t0
                kind = r["kind"]
                if kind == "shared" and (int(out.request_id[1:]) // 2) % a.load_turn_every == 0:
                    follow = r["prompt"] + list(out.outputs[0].token_ids) + rng.integers(
                        10, vocab - 10, a.load_turn_len).tolist()
                    pending.append((r["done"] + a.load_think_s, out.request_id + "t2", follow, "turn2"))
                    pending.sort(key=lambda x: x[0])
                    shared_turns += 1
    wall = time.perf_counter() - t0
    res = summarise(info, latest, wall, before, metric_values(llm), a, block, first)
    res["warmup_requests"] = warmed  # (the plugin's GDN page counters include them)
    res["warmup_s"] = round(warmup_s, 3)  # (the clock starts after it: vllm_e2e's load_timed)
    return res


def summarise(info, latest, wall, before, after, a, block, first):
    done = {k: v for k, v in info.items() if "done" in v}
    outs = {k: latest[k] for k in done}
    ttft = sorted(v["first"] - v["arrival"] for v in done.values() if "first" in v)
    tpot = []
    for o in outs.values():
        m, n = o.metrics, len(o.outputs[0].token_ids)
        if m is not None and n > 1 and m.last_token_ts > m.first_token_ts:
            tpot.append((m.last_token_ts - m.first_token_ts) / (n - 1))
    gen = sum(len(o.outputs[0].token_ids) for o in outs.values())
    prompt = sum(v["prompt_len"] for v in done.values())
    reused = {}
    for k, o in outs.items():
        reused.setdefault(info[k]["kind"], []).append(o.num_cached_tokens or 0)
    system_blocks = (a.load_system_len // block) * block
    shared = reused.get("shared", [])[1:]
    delta = {k: (after.get(k) or 0) - (before.get(k) or 0) for k in after if k != "error"}
    res = {"requests": len(info), "finished": len(done), "first_turns": len(first),
           "timed_out": len(done) < len(info) or any(k not in info for _, k, _, _ in first),
           "wall_s": round(wall, 3), "output_tok_per_s": round(gen / wall, 1),
           "prompt_tok_per_s": round(prompt / wall, 1), "output_tokens": gen,
           "ttft_s": {q: pct(ttft, q) for q in (50, 90, 99)},
           "tpot_ms": {q: (pct(tpot, q) or 0) * 1e3 for q in (50, 90, 99)},
           "preemptions": delta.get("vllm:num_preemptions"),
           "prefix_cache_hits": delta.get("vllm:prefix_cache_hits"),
           "prefix_cache_queries": delta.get("vllm:prefix_cache_queries"),
           "metrics_error": after.get("error"),
           "reused_tokens": {k: sum(v) for k, v in reused.items()},
           "reused_mean": {k: round(float(np.mean(v)), 1) for k, v in reused.items() if v},
           "system_expected": system_blocks,
           "shared_hit_fraction": round(sum(x >= system_blocks for x in shared) / len(shared), 3)
           if shared else None,
           "all_generated": all(len(o.outputs[0].token_ids) == a.load_gen for o in outs.values())}
    path = os.environ.get("GDN_GRAPHS_PAGE_STATS")
    if path and os.path.exists(path):
        res["gdn_pages"] = json.load(open(path))
    return res


def check(name: str, r: dict, plugin_on: bool) -> list:
    """The load run's failures (empty: fine): every request finished with all its tokens inside
    the time limit; later shared-prompt requests mostly reused the system prompt; with the plugin,
    GDN page stats were written and no running request holds a page at the end."""
    L = r["scenarios"].get("load")
    if L is None:
        return []
    bad = []
    if L["timed_out"] or not L["all_generated"]:
        bad.append(f"{name}: load: {L['finished']} of {L['requests']} finished "
                   f"(all tokens: {L['all_generated']})")
    if (L["shared_hit_fraction"] or 0) < 0.5:
        bad.append(f"{name}: load: only {L['shared_hit_fraction']} of the shared-prompt requests "
                   f"reused the system prompt ({L['system_expected']} tokens)")
    if plugin_on:
        g = L.get("gdn_pages")
        if g is None:
            bad.append(f"{name}: load: no GDN page stats (GDN_GRAPHS_PAGE_STATS)")
        elif g["held"] != 0:
            bad.append(f"{name}: load: {g['held']} GDN pages still held when idle")
    return bad
