"""Host time of vLLM 0.26's scheduler with speculative decoding, the plugin's GDN page managers
against vLLM's own "align" mode, on vLLM's CPU build (issue 12: with n-gram k = 3 the plugin
decoded 4% slower than vLLM's own mode on an H200; profiling/bench_builder_host.py measures the
other host part, the metadata builders).

    PYTHONPATH=.:profiling python profiling/bench_scheduler_host.py [--rows 16] [--steps 300]

One scheduler per mode over the same KV-cache layout (one attention group and three GDN groups,
blocks of 192, the tiny Qwen3-Next's GDN state shapes; pages float32 so that one page size fits
both modes' states), the engine config of bench_builder_host.py. ``--rows`` requests of 256-token
prompts run to ``--gen`` tokens; each step the stand-in model accepts a random number of the
drafts, and every running request then gets k drafts (``spec``: every step, the FULL-graph
batch) or, with probability 1/16, k drafts and otherwise none (``mixed``: what n-gram on the
random tiny model mostly schedules). Reported per step, median over the measured steps:
``schedule()`` and ``update_from_output()`` + ``update_draft_token_ids()`` (us), and the share
of them spent in the GDN groups' managers (their calls timed one by one; the plugin's are ours,
own mode's are vLLM's MambaManager). The tensors are CPU tensors and this is not the GPU host:
compare the columns with each other, not with the H200's step time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import numpy as np
import torch

import bench_builder_host
from bench_builder_host import BLOCK, engine_config, vllm_on_cpu

K_SPEC = bench_builder_host.K_SPEC  # 0 with --no-spec (both modules): plain decode steps

PAGE = BLOCK * 2 * 2 * 64 * 4  # the float32 attention page both modes' GDN pages are padded to
MANAGER_CALLS = ("get_num_blocks_to_allocate", "allocate_new_blocks", "cache_blocks",
                 "remove_skipped_blocks", "new_step_starts", "free")


def make_scheduler(path: str, own: bool, num_blocks: int):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            MambaSpec)
    from vllm.v1.structured_output import StructuredOutputManager

    from gdn_graphs.vllm.v0_26.state_pages import state_spec

    cfg = engine_config(path, own)
    cc = cfg.cache_config
    cc.block_size = cc.mamba_block_size = BLOCK  # the same blocks in both modes
    cc.num_gpu_blocks = num_blocks
    gdn = MambaSpec(shapes=((3 + K_SPEC, 1024), (8, 64, 64)), dtypes=(torch.float32,) * 2,
                    block_size=BLOCK, page_size_padded=PAGE,
                    mamba_cache_mode="align" if own else "all",
                    num_speculative_blocks=K_SPEC)
    if not own:
        gdn = state_spec(gdn, cfg)  # GDNSpecStateSpec: the lookahead layout's pages
    attn = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["model.layers.3.self_attn.attn"], attn)] + [
        KVCacheGroupSpec([f"model.layers.{i}.linear_attn"], gdn) for i in range(3)]
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return Scheduler(cfg, kvc, StructuredOutputManager(cfg), block_size=BLOCK, log_stats=True)


def time_managers(sched, acc: Counter) -> None:
    """Wrap the GDN groups' manager calls (instance attributes) to add their time to ``acc``."""
    for m in sched.kv_cache_manager.coordinator.single_type_managers[1:]:
        for name in MANAGER_CALLS:
            f = getattr(m, name)

            def timed(*a, _f=f, **kw):
                t = time.perf_counter()
                try:
                    return _f(*a, **kw)
                finally:
                    acc["managers"] += time.perf_counter() - t
            setattr(m, name, timed)


def run(path: str, own: bool, kind: str, rows: int, gen: int, steps: int, seed: int) -> dict:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request

    init_none_hash(sha256)
    sched = make_scheduler(path, own, num_blocks=rows * 40)
    rng = np.random.default_rng(seed)
    for i in range(rows):
        sched.add_request(Request(f"r{i}", rng.integers(10, 4000, 256).tolist(),
                                  SamplingParams(max_tokens=gen, ignore_eos=True), None,
                                  block_hasher=get_request_block_hasher(BLOCK, sha256)))
    acc, per = Counter(), {"schedule": [], "update": [], "managers": [], "spec_rows": []}
    time_managers(sched, acc)
    for step in range(steps + 20):
        acc.clear()
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        if not out.num_scheduled_tokens:
            break
        ids = list(out.num_scheduled_tokens)
        computed = {nr.req_id: nr.num_computed_tokens for nr in out.scheduled_new_reqs}
        cd = out.scheduled_cached_reqs
        computed.update(zip(cd.req_ids, cd.num_computed_tokens))
        sampled = []
        for rid in ids:
            req = sched.requests[rid]
            if computed[rid] + out.num_scheduled_tokens[rid] < req.num_prompt_tokens:
                sampled.append([])
                continue
            d = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            sampled.append(rng.integers(10, 4000, int(rng.integers(0, d + 1)) + 1).tolist())
        t2 = time.perf_counter()
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled))
        live = [r for r in ids if r in sched.requests]
        if K_SPEC:
            give = [r for r in live if kind == "spec" or rng.random() < 1 / 16]
            sched.update_draft_token_ids(DraftTokenIds(
                give, [rng.integers(10, 4000, K_SPEC).tolist() for _ in give]))
        t3 = time.perf_counter()
        if step >= 20 and len(ids) == rows:  # warm, every request running
            per["schedule"].append(t1 - t0)
            per["update"].append(t3 - t2)
            per["managers"].append(acc["managers"])
            per["spec_rows"].append(len(out.scheduled_spec_decode_tokens))
    managers = sorted({type(m).__name__ for m in sched.kv_cache_manager.coordinator.single_type_managers})
    res = {k: round(statistics.median(v) * 1e6, 1) if v else None for k, v in per.items()
           if k != "spec_rows"}
    return res | {"steps": len(per["schedule"]), "managers_used": managers,
                  "spec_rows": statistics.median(per["spec_rows"]) if per["spec_rows"] else 0}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--gen", type=int, default=2000)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--kinds", default="spec,mixed")
    p.add_argument("--no-spec", action="store_true",
                   help="engines without speculative decoding: plain decode steps")
    a = p.parse_args(argv)
    global K_SPEC
    if a.no_spec:
        K_SPEC = bench_builder_host.K_SPEC = 0
        a.kinds = "decode"
    path = vllm_on_cpu()
    print(f"{'kind':<6} {'rows':>4} | {'mode':<6} {'schedule':>9} {'update':>8} {'GDN managers':>13} "
          f"{'steps':>6}  (us per step, median)")
    for kind in a.kinds.split(","):
        for own in (False, True):
            r = run(path, own, kind, a.rows, a.gen, a.steps, seed=1)
            print(f"{kind:<6} {a.rows:>4} | {'own' if own else 'plugin':<6} {r['schedule']:>9} "
                  f"{r['update']:>8} {r['managers']:>13} {r['steps']:>6}")


if __name__ == "__main__":
    main()
