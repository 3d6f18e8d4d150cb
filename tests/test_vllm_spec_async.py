"""Speculative decoding under vLLM 0.26's async scheduling (its AsyncScheduler, CPU build) with
the plugin's GDN pages and builder: the host's counts are optimistic, the device's true; every
slot read holds the state after the TRUE tokens, every state lands where the next step looks for
it, and no rejected draft changes a page the prefix cache holds (``spec_vllm_async_world``)."""

import numpy as np
import pytest

from spec_vllm_async_world import AsyncSpecWorld
from test_vllm_plugin import vllm_cpu  # noqa: F401
from test_vllm_state_pages import B


def _shared_prompts(w, rng, n=6):
    system = rng.integers(10, 4000, 3 * B + 30).tolist()
    pending = [(f"r{i}", (system if i % 2 == 0 else []) +
                rng.integers(10, 4000, int(rng.integers(50, 500))).tolist()) for i in range(n)]
    while pending or w.sched.has_unfinished_requests() or w.in_flight is not None:
        if pending and w.steps % 4 == 0:
            rid, prompt = pending.pop(0)
            w.add(rid, prompt, max_tokens=int(rng.integers(150, 300)))
        w.step()
        assert w.steps < 4000


@pytest.mark.vllm
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("num_blocks", [48, 400])
def test_async_shared_prompts_with_random_acceptance(vllm_cpu, k, num_blocks):
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    w = AsyncSpecWorld(vllm_cpu, num_blocks, k, seed=k)
    _shared_prompts(w, np.random.default_rng(1))
    assert {a for d, a in w.accepted if d == k} == set(range(k + 1))
    assert max(w.behind) == k and 0 in w.behind, "host counts were optimistic by 0 .. k"
    assert len(w.cached) > 0, "the oracle checked cached pages"
    for rid, req in w.reqs.items():  # each request ends with its true tokens
        assert list(req.output_token_ids) == w.truth[rid][:len(req.output_token_ids)]
    print(f"k={k} blocks={num_blocks}: {w.steps} steps, {w.preempted} preemptions, "
          f"{len(w.accepted)} verified rows, {w.dead_rows} rows after a finish, hits {w.hits}")
    if num_blocks == 400:
        assert [w.hits[f"r{i}"] for i in (2, 4)] == [3 * B, 3 * B]


@pytest.mark.vllm
def test_async_preemption_under_a_tight_pool(vllm_cpu):
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    w = AsyncSpecWorld(vllm_cpu, 48, 3, seed=3)
    rng = np.random.default_rng(5)
    reqs = [w.add(f"p{i}", rng.integers(10, 4000, 300).tolist(), max_tokens=700)
            for i in range(4)]
    w.run()
    assert w.preempted > 0
    for r in reqs:
        assert list(r.output_token_ids) == w.truth[r.request_id][:700]


@pytest.mark.vllm
def test_optimistic_counts_are_caught(vllm_cpu):
    """The deliberate bug: the builder placing the spec rows from the host's optimistic counts
    reads a state that is not the request's true one (or overwrites a cached page)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    w = AsyncSpecWorld(vllm_cpu, 400, 3, seed=3, optimistic=True)
    with pytest.raises(AssertionError, match="does not hold the state|lost its block's state"):
        _shared_prompts(w, np.random.default_rng(1))
