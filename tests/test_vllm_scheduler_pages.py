"""GDNStateManager under vLLM 0.26's own Scheduler (CPU build): schedule -> model output ->
update_from_output, with the plugin's KV-cache config of the tiny Qwen3-Next and a pool that
holds a few requests. Every request finishes with all its tokens, nothing is held at the end,
the page accounting matches a recount after every step, and (where the pool holds a few of them)
later requests reuse the shared system prompt."""

import numpy as np
import pytest

from test_vllm_plugin import _engine_config, _final_block_size, vllm_cpu, vllm_dist  # noqa: F401
from test_vllm_state_pages import B, check_pool, gdn_managers, request, specs


def scheduler(path, num_blocks, async_scheduling, max_model_len=8192, max_num_batched_tokens=1024,
              gdn_first=False):
    """vLLM's Scheduler (AsyncScheduler) over our manager. ``gdn_first``: the KV-cache groups in
    the order vLLM's get_kv_cache_configs gives them (the model's layer order: the GDN groups,
    then attention), which is the order the coordinator allocates them in."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    cfg = _engine_config(path, enable_prefix_caching=True, block_size=16, max_num_seqs=8,
                         max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                         async_scheduling=async_scheduling)
    _final_block_size(cfg)
    assert cfg.cache_config.block_size == B
    cfg.cache_config.num_gpu_blocks = num_blocks
    attn, gdn = specs(step_tokens=cfg.max_in_flight_tokens)
    groups = [KVCacheGroupSpec(["model.layers.3.self_attn.attn"], attn)] + [
        KVCacheGroupSpec([f"model.layers.{i}.linear_attn"], gdn) for i in range(3)]
    if gdn_first:
        groups = groups[1:] + groups[:1]
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cls = AsyncScheduler if async_scheduling else Scheduler
    return cls(cfg, kvc, StructuredOutputManager(cfg), block_size=B, log_stats=True)


def model_output(out, sampling, rng):
    """A token for each request whose prompt is in after the step; none for partial prefills
    (what vLLM's model runner returns)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled = [[int(rng.integers(10, 4000))] if sampling[r] else [] for r in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def step_outputs(sched, out, in_flight, async_scheduling, rng, after=lambda: None):
    """Queue ``out`` and hand back model outputs as vLLM's engine core does: at once, or with one
    step still in flight under async scheduling (then also when a step scheduled nothing)."""
    in_flight.append((out, {r: sched.requests[r].num_computed_tokens >=
                            sched.requests[r].num_prompt_tokens for r in out.num_scheduled_tokens}))
    while len(in_flight) > (1 if async_scheduling else 0) or (in_flight and not out.num_scheduled_tokens):
        done, sampling = in_flight.pop(0)
        if done.num_scheduled_tokens:
            sched.update_from_output(done, model_output(done, sampling, rng))
        after()


@pytest.mark.vllm
@pytest.mark.parametrize("num_blocks", [30, 60, 200])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_vllms_scheduler_runs_shared_prompts_through_our_manager(vllm_cpu, num_blocks,
                                                                 async_scheduling):
    """With async scheduling a step is scheduled before the previous one's output is in (two
    in flight), as vLLM's engine core does with its batch queue."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    sched = scheduler(vllm_cpu, num_blocks, async_scheduling)
    kvm = sched.kv_cache_manager
    rng = np.random.default_rng(0)
    system = rng.integers(10, 4000, 6 * B + 30).tolist()
    reqs = []
    for i in range(10):
        own = rng.integers(10, 4000, int(rng.integers(100, 900))).tolist()
        reqs.append(request(f"r{i}", (system if i % 2 == 0 else []) + own, max_tokens=12))
    pending, steps, preempted, hits, in_flight = list(reqs), 0, 0, {}, []
    while pending or sched.has_unfinished_requests() or in_flight:
        if pending and steps % 3 == 0:
            sched.add_request(pending.pop(0))
        out = sched.schedule()
        preempted += len(out.preempted_req_ids or ())
        for new in out.scheduled_new_reqs:  # its prefix hit, at its first scheduling
            hits.setdefault(new.req_id, new.num_computed_tokens)
        check_pool(kvm)
        step_outputs(sched, out, in_flight, async_scheduling, rng, after=lambda: check_pool(kvm))
        steps += 1
        assert steps < 3000
    stats = gdn_managers(kvm)[0].stats
    assert all(len(r.output_token_ids) == 12 for r in reqs)
    assert stats.held == 0 and not any(m.req_to_blocks for m in kvm.coordinator.single_type_managers)
    shared = [hits[r.request_id] for r in reqs[2::2]]
    if num_blocks >= 60:  # 30 pages hold about one request: states are dropped, tokens not
        assert max(shared) >= 6 * B, shared
    print(f"\n{num_blocks} pages, async {async_scheduling}: {steps} steps, preempted {preempted}, shared-prompt reuse "
          f"{shared}, {stats}")


def _load_shape(path, mode, n=48, plen=16000, slen=6000, gen=64, conc=8):
    """The GPU load test's KV side on vLLM's AsyncScheduler: n requests of plen tokens arriving
    every other step, half on one slen-token system prompt, every 4th of those followed by a
    second turn (its prompt + output + 300 tokens), KV bytes for conc of them (float32: 1,024
    bytes a token), the same for the plugin and vLLM's "align" (blocks of 192 / 144)."""
    import torch
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            MambaSpec)
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from gdn_graphs.vllm.v0_26.state_pages import state_spec

    init_none_hash(sha256)
    cfg = _engine_config(path, enable_prefix_caching=True, block_size=16, max_num_seqs=64,
                         max_num_batched_tokens=8192, max_model_len=20480, async_scheduling=True,
                         additional_config={} if mode == "plugin" else {"gdn_graphs": False})
    cc = _final_block_size(cfg)
    bs = cc.block_size
    attn = FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=64, dtype=torch.float32)
    gdn = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=(torch.float32,) * 2, block_size=bs,
                    page_size_padded=cc.mamba_page_size_padded, mamba_cache_mode=cc.mamba_cache_mode)
    if mode == "plugin":
        gdn = state_spec(gdn, cfg)
    nb = cc.num_gpu_blocks = int(conc * (plen + gen) * 1024 * 1.05) // attn.page_size_bytes
    groups = [KVCacheGroupSpec(["a"], attn)] + [KVCacheGroupSpec([f"g{i}"], gdn) for i in range(3)]
    kvc = KVCacheConfig(num_blocks=nb, kv_cache_tensors=[], kv_cache_groups=groups)
    sched = AsyncScheduler(cfg, kvc, StructuredOutputManager(cfg), block_size=bs, log_stats=True)
    rng = np.random.default_rng(0)
    system = rng.integers(10, 4000, slen).tolist()
    def make(rid, toks):
        return Request(rid, toks, SamplingParams(max_tokens=gen), None,
                       block_hasher=get_request_block_hasher(bs, sha256))

    pending = [make(f"r{i}", (system if i % 2 == 0 else []) + rng.integers(
        10, 4000, plen - (slen if i % 2 == 0 else 0)).tolist()) for i in range(n)]
    follow = {r.request_id: r for r in pending[::8]}  # every 4th shared request: a second turn
    steps, preempted, tokens, hits, in_flight = 0, 0, 0, {}, []
    while pending or sched.has_unfinished_requests() or in_flight or follow:
        for rid, r in list(follow.items()):
            if r.is_finished():
                del follow[rid]
                pending.insert(0, make(rid + "t2", list(r.prompt_token_ids) + list(r.output_token_ids)
                                       + rng.integers(10, 4000, 300).tolist()))
        if pending and steps % 2 == 0:
            sched.add_request(pending.pop(0))
        out = sched.schedule()
        preempted += len(out.preempted_req_ids or ())
        tokens += out.total_num_scheduled_tokens
        for new in out.scheduled_new_reqs:
            hits.setdefault(new.req_id, new.num_computed_tokens)
        in_flight.append((out, {r: sched.requests[r].num_computed_tokens >=
                                sched.requests[r].num_prompt_tokens for r in out.num_scheduled_tokens}))
        while len(in_flight) > 1 or (in_flight and not out.num_scheduled_tokens):
            done, sampling = in_flight.pop(0)
            if done.num_scheduled_tokens:
                sched.update_from_output(done, model_output(done, sampling, rng))
        steps += 1
        assert steps < 20000
    shared = [hits[f"r{i}"] for i in range(2, n, 2)]
    turns = [hits[k] for k in hits if k.endswith("t2")]
    return {"second_turn_reuse_mean": float(np.mean(turns)), "second_turns": len(turns),"block": bs, "pages": nb, "steps": steps, "preempted": preempted,
            "scheduled_tokens": tokens, "shared_hit_fraction": float(np.mean(
                [h >= slen // bs * bs for h in shared])), "shared_reuse_mean": float(np.mean(shared))}


@pytest.mark.vllm
def test_load_shape_plugin_vs_align(vllm_cpu, capsys):
    """The load test's KV side, no model: with the same KV bytes the plugin computes no more
    tokens than vLLM's own mode, preempts no more, and every later shared-prompt request reuses
    the system prompt (the hit state is kept by the requests that hit it; without that, 35% did)."""
    ours, theirs = (_load_shape(vllm_cpu, m) for m in ("plugin", "align"))
    with capsys.disabled():
        print(f"\nload shape: plugin {ours}\n            align  {theirs}")
    assert ours["shared_hit_fraction"] == 1.0
    assert ours["preempted"] <= theirs["preempted"]
    assert ours["scheduled_tokens"] <= theirs["scheduled_tokens"] * 1.02


@pytest.mark.vllm
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prefill_chunks_end_on_multiples_of_64(vllm_cpu, async_scheduling):
    """With decodes taking part of each step's budget (1024 tokens), a long prompt's chunks end
    on multiples of 64 (our kernels' chunk grid: warm == cold) until its last token, and every
    request still finishes; vLLM's own mode "all" would end them wherever the budget ran out."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    from gdn_graphs.vllm.v0_26.schedule import chunk_aligned_split

    init_none_hash(sha256)
    sched = scheduler(vllm_cpu, 400, async_scheduling)
    assert sched.need_mamba_block_aligned_split
    assert sched._mamba_block_aligned_split is chunk_aligned_split
    rng = np.random.default_rng(1)
    short = [request(f"d{i}", rng.integers(10, 4000, 40 + i).tolist(), max_tokens=60)
             for i in range(3)]
    long = request("long", rng.integers(10, 4000, 5000).tolist(), max_tokens=4)
    for r in short:
        sched.add_request(r)
    ends, in_flight, steps = [], [], 0
    while sched.has_unfinished_requests() or in_flight:
        if steps == 2:
            sched.add_request(long)  # the short ones decode by now: 3 tokens of every budget
        out = sched.schedule()
        n = out.num_scheduled_tokens.get("long")
        if n:  # (schedule() has advanced num_computed_tokens past the chunk)
            ends.append(long.num_computed_tokens)
        step_outputs(sched, out, in_flight, async_scheduling, rng)
        steps += 1
        assert steps < 500
    prefill_ends = [e for e in ends if e < 5000]
    assert len(prefill_ends) >= 4 and all(e % 64 == 0 for e in prefill_ends), ends
    assert 5000 in ends and all(len(r.output_token_ids) == r.max_tokens for r in short + [long])


def _serve_one(path, num_blocks, max_model_len, prompt_len, steps=60):
    """vLLM's Scheduler on a pool of num_blocks pages: the steps one prompt of prompt_len tokens
    took to finish (chunks of 2,048), or None if it was still waiting after ``steps``."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    sched = scheduler(path, num_blocks, False, max_model_len=max_model_len,
                      max_num_batched_tokens=2048)
    rng = np.random.default_rng(5)
    r = request("edge", rng.integers(10, 4000, prompt_len).tolist(), max_tokens=2)
    sched.add_request(r)
    in_flight = []
    for n in range(steps):
        step_outputs(sched, sched.schedule(), in_flight, False, rng)
        if r.is_finished():
            return n + 1
    return None


@pytest.mark.vllm
def test_the_start_up_check_admits_a_request_of_max_model_len(vllm_cpu, vllm_dist):
    """At the largest max_model_len vLLM's start-up check accepts with the plugin, a prompt of
    max_model_len - 1 tokens is admitted (vLLM's full-sequence gate) into an empty pool of the
    pages that memory holds, and finishes. The check counts the pool's null block where a group
    is ours; without it, it accepts one block more, and that prompt waits forever."""
    from vllm.v1.core import kv_cache_utils

    from test_vllm_capacity import _largest_fit, gdn_spec, kv_config

    cfg, spec = gdn_spec(vllm_cpu, {}, max_model_len=8192)
    memory = 40 * spec.page_size_bytes + 1000          # 40 pages of 192 tokens (float32)
    edge = _largest_fit(cfg, spec, memory, hi=8192)
    cfg.model_config.max_model_len = edge
    blocks = kv_config(cfg, spec, memory).num_blocks
    assert blocks == 40 and edge == (40 - 1 - 3) * B   # null block, a page per GDN group
    assert _serve_one(vllm_cpu, blocks, edge, edge - 1) is not None
    counted = kv_cache_utils._max_memory_usage_bytes_from_groups
    kv_cache_utils._max_memory_usage_bytes_from_groups = counted.__wrapped__
    try:
        loose = _largest_fit(cfg, spec, memory, hi=8192)
    finally:
        kv_cache_utils._max_memory_usage_bytes_from_groups = counted
    assert loose == edge + B
    assert _serve_one(vllm_cpu, blocks, loose, loose - 1) is None


def _edge_scheduler(path, pages, async_scheduling, max_num_batched_tokens):
    """vLLM's Scheduler on the pool that KV memory of ``pages`` pages gives, at the largest
    max_model_len vLLM's start-up check accepts with the plugin there, its groups in vLLM's
    order (checked against get_kv_cache_configs): (scheduler, max_model_len)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from gdn_graphs.vllm.v0_26.state_pages import GDNStateSpec
    from test_vllm_capacity import _largest_fit, gdn_spec, kv_config

    cfg, spec = gdn_spec(path, {}, max_model_len=8192)
    memory = pages * spec.page_size_bytes + 1000
    edge = _largest_fit(cfg, spec, memory)
    cfg.model_config.max_model_len = edge
    kvc = kv_config(cfg, spec, memory)
    assert kvc.num_blocks == pages and edge == (pages - 1 - 3) * B  # null block, a page a group
    assert [type(g.kv_cache_spec) for g in kvc.kv_cache_groups] == [GDNStateSpec] * 3 + [
        FullAttentionSpec]
    return scheduler(path, kvc.num_blocks, async_scheduling, max_model_len=edge,
                     max_num_batched_tokens=max_num_batched_tokens, gdn_first=True), edge


def _serve_in_turn(sched, reqs, async_scheduling, rng, steps=120):
    """Each request in turn, the next once the one before has finished (its output in); the
    pool is recounted after every call (check_pool). {request id: (its prefix hit, steps it
    took, or None if unfinished after ``steps``)}, and the preemptions."""
    kvm, in_flight, got, preempted = sched.kv_cache_manager, [], {}, 0
    for r in reqs:
        sched.add_request(r)
        hit, took = None, None
        for n in range(steps):
            out = sched.schedule()
            preempted += len(out.preempted_req_ids or ())
            for new in out.scheduled_new_reqs:
                hit = new.num_computed_tokens if hit is None else hit
            check_pool(kvm)
            step_outputs(sched, out, in_flight, async_scheduling, rng,
                         after=lambda: check_pool(kvm))
            if r.is_finished() and not in_flight:
                took = n + 1
                break
        got[r.request_id] = (hit, took)
        if took is None:
            break
    return got, preempted


@pytest.mark.vllm
@pytest.mark.parametrize("max_num_batched_tokens", [8192, 4096, 2048])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_edge_prompt_after_system_prompts_finishes(vllm_cpu, vllm_dist, async_scheduling,
                                                      max_num_batched_tokens):
    """The GPU run that hung (tiny Qwen3-Next, KV memory of 87 pages, max_model_len at the edge:
    one request of it fits the pool, 1.01x): three questions on a 3,000-token system prompt,
    then a fresh prompt of max_model_len - 200 and the same prompt again, each finishes in a
    bounded number of steps. With vLLM's group order (GDN groups allocated before attention,
    so the first chunk of the long prompt keeps checkpoints from the slack) and async
    scheduling, its second chunk was allocated while the first, whose checkpoints it still
    held, was in flight: short of pages, vLLM preempted it, and its own cached states then made
    it need a page per group more than the pool holds at vLLM's full-sequence gate, so it waited
    for ever. Now the request gives back the pages it keeps (never the one an in-flight step
    reads), and takes no prefix hit it could not be admitted with; and (chunks of 4,096) a
    chunk moves its running page in place where the rest of the prompt could not get its pages
    while the page the chunk in flight reads is held (else: preempted and recomputed for ever)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    sched, edge = _edge_scheduler(vllm_cpu, 87, async_scheduling, max_num_batched_tokens)
    rng = np.random.default_rng(0)
    system = rng.integers(10, 4000, 3000).tolist()
    reqs = [request(f"s{i}", system + rng.integers(10, 4000, 200).tolist(), max_tokens=32)
            for i in range(3)]
    long = rng.integers(10, 4000, edge - 200).tolist()
    reqs += [request("cold", long, max_tokens=32), request("warm", long, max_tokens=32)]
    got, preempted = _serve_in_turn(sched, reqs, async_scheduling, rng)
    assert all(took is not None for _, took in got.values()), got
    assert [got[f"s{i}"][0] for i in range(3)] == [0, 2880, 2880]
    assert all(len(r.output_token_ids) == 32 for r in reqs) and preempted == 0
    stats = gdn_managers(sched.kv_cache_manager)[0].stats
    assert stats.held == 0


@pytest.mark.vllm
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_edge_prompt_whose_prefix_states_are_cached_is_admitted(vllm_cpu, vllm_dist,
                                                                   async_scheduling):
    """A prompt of max_model_len - 200 whose first 8,000 tokens were a prompt before (their
    states cached, the pool otherwise evictable): with a GDN hit it would hold the hit's page
    besides the one it writes in each group, which vLLM's full-sequence gate counts and the
    pool at the edge cannot give, so it waited for ever; it is admitted without the hit and
    finishes."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    sched, edge = _edge_scheduler(vllm_cpu, 87, async_scheduling, 8192)
    rng = np.random.default_rng(1)
    long = rng.integers(10, 4000, edge - 200).tolist()
    got, _ = _serve_in_turn(sched, [request("head", long[:8000], max_tokens=1),
                                    request("long", long, max_tokens=32)], async_scheduling, rng)
    assert got["long"][1] is not None, got
    assert gdn_managers(sched.kv_cache_manager)[0].stats.held == 0
