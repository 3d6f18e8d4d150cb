"""GDNStateManager under vLLM 0.26's own Scheduler (CPU build): schedule -> model output ->
update_from_output, with the plugin's KV-cache config of the tiny Qwen3-Next and a pool that
holds a few requests. Every request finishes with all its tokens, nothing is held at the end,
the page accounting matches a recount after every step, and (where the pool holds a few of them)
later requests reuse the shared system prompt."""

import numpy as np
import pytest

from test_vllm_plugin import _engine_config, _final_block_size, vllm_cpu  # noqa: F401
from test_vllm_state_pages import B, check_pool, gdn_managers, request, specs


def scheduler(path, num_blocks, async_scheduling):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    cfg = _engine_config(path, enable_prefix_caching=True, block_size=16, max_num_seqs=8,
                         max_num_batched_tokens=1024, max_model_len=8192,
                         async_scheduling=async_scheduling)
    _final_block_size(cfg)
    assert cfg.cache_config.block_size == B
    cfg.cache_config.num_gpu_blocks = num_blocks
    attn, gdn = specs(step_tokens=cfg.max_in_flight_tokens)
    groups = [KVCacheGroupSpec(["model.layers.3.self_attn.attn"], attn)] + [
        KVCacheGroupSpec([f"model.layers.{i}.linear_attn"], gdn) for i in range(3)]
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
        in_flight.append((out, {r: sched.requests[r].num_computed_tokens >=
                                sched.requests[r].num_prompt_tokens for r in out.num_scheduled_tokens}))
        while len(in_flight) > (1 if async_scheduling else 0) or (in_flight and not out.num_scheduled_tokens):
            done, sampling = in_flight.pop(0)
            if done.num_scheduled_tokens:
                sched.update_from_output(done, model_output(done, sampling, rng))
            check_pool(kvm)
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
