"""Speculative decoding through vLLM 0.26's own Scheduler (CPU build) with the plugin's GDN pages
and builder: every slot the kernels would read holds the state after the request's true computed
tokens, every state lands where the next step (after any acceptance 0..k) looks for it, no page
is written twice or read by one row while another writes it, and no rejected draft changes a
page the prefix cache holds (``spec_vllm_world``). Prefix hits with speculation reuse every whole
block, including blocks completed during speculative steps (a three-turn conversation)."""

import numpy as np
import pytest

from spec_vllm_world import SpecWorld
from test_vllm_plugin import vllm_cpu  # noqa: F401
from test_vllm_state_pages import B


@pytest.mark.vllm
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("num_blocks", [44, 400])
def test_shared_prompts_with_every_acceptance_count(vllm_cpu, k, num_blocks):
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    w = SpecWorld(vllm_cpu, num_blocks, k, seed=k)
    rng = np.random.default_rng(1)
    system = rng.integers(10, 4000, 3 * B + 30).tolist()
    pending = [(f"r{i}", (system if i % 2 == 0 else []) +
                rng.integers(10, 4000, int(rng.integers(50, 500))).tolist())
               for i in range(6)]
    while pending or w.sched.has_unfinished_requests():
        if pending and w.steps % 4 == 0:
            rid, prompt = pending.pop(0)
            w.add(rid, prompt, max_tokens=int(rng.integers(150, 300)))
        w.step()
        assert w.steps < 4000
    full = [a for d, a in w.accepted if d == k]
    assert set(full) == set(range(k + 1)), "every acceptance count 0..k was verified"
    assert k == 1 or any(d < k for d, _ in w.accepted), "rows with fewer drafts ran too"
    assert len(w.cached) > 0, "the oracle checked cached pages"
    print(f"k={k} blocks={num_blocks}: {w.steps} steps, {w.preempted} preemptions, "
          f"{len(w.accepted)} verified rows, hits {w.hits}")
    if num_blocks == 400:  # room: later requests on the system prompt reuse its whole blocks
        assert [w.hits[f"r{i}"] for i in (2, 4)] == [3 * B, 3 * B]


@pytest.mark.vllm
def test_three_turn_conversation_reuses_prompt_and_answer(vllm_cpu):
    """Each turn's prompt = previous prompt + its answer + a new question; the hit covers every
    whole block of the previous prompt and answer (blocks the answer completed during
    speculative steps included), as without speculation."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    k = 3
    w = SpecWorld(vllm_cpu, 400, k, seed=7)
    rng = np.random.default_rng(2)
    prompt = rng.integers(10, 4000, 300).tolist()
    for turn in range(3):
        req = w.add(f"t{turn}", prompt, max_tokens=250)
        w.run()
        answer = list(req.output_token_ids)
        assert answer == w.truth[f"t{turn}"][:250]  # what greedy decoding without drafts gives
        if turn:
            assert w.hits[f"t{turn}"] == (len(prev) - 1) // B * B, (turn, w.hits[f"t{turn}"])
        prev = prompt + answer
        prompt = prev + rng.integers(10, 4000, 40).tolist()
    assert {a for d, a in w.accepted if d == k} == set(range(k + 1))


@pytest.mark.vllm
def test_preemption_under_a_tight_pool(vllm_cpu):
    """Four long generations in a pool for about two: vLLM preempts and recomputes, and every
    read, write and cached page still checks out (a recomputed request starts from its prompt or
    a prefix hit); each request ends with its true tokens. At this size the checkpoint pages
    taken from the slack once left another GDN group short of its private pages (vLLM's
    "Cannot get 7 free blocks from the pool"): the slack now counts every group's."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    w = SpecWorld(vllm_cpu, 48, 3, seed=3)
    rng = np.random.default_rng(5)
    reqs = [w.add(f"p{i}", rng.integers(10, 4000, 300).tolist(), max_tokens=700)
            for i in range(4)]
    w.run()
    assert w.preempted > 0
    for r in reqs:
        assert list(r.output_token_ids) == w.truth[r.request_id][:700]
