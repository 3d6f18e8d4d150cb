"""Speculative decoding in the embedded engine (tiny float32 model).

CPU tier: the n-gram drafter and the verification rule; eager engines with drafts that are
right, partly right and wrong (an oracle drafter that knows the tokens of a run without
speculation and spoils one draft at random) generate exactly the tokens of that run, blocks
completed during speculative steps are committed and give later requests hits that change
nothing; the real n-gram drafter changes no token either; full mode's logic (GraphManager kinds
"decode" and "spec") with a CPU stand-in for CUDA graphs.
GPU tier (marker gpu): every mode with and without speculation gives the same tokens, and a spec
step replayed from a FULL graph equals the same step run eagerly, bit for bit, over >= 100 steps.
"""

from __future__ import annotations

import random

import pytest
import torch

from gdn_graphs.engine import Engine, EngineConfig
from gdn_graphs.engine.model import HybridGDNModel, preset
from gdn_graphs.engine.spec import NgramDrafter, accept_count
from helpers import RerunBackend, prompt_of

B = 64


@pytest.fixture(scope="module")
def tiny():
    return HybridGDNModel(preset("tiny"))


def engine(model, spec=None, k=3, **kw):
    kw.setdefault("num_slots", 48)
    kw.setdefault("max_tokens", 128)
    kw.setdefault("max_model_len", 512)
    kw.setdefault("max_seqs", 4)
    return Engine(model, EngineConfig(spec=spec, num_spec_tokens=k, **kw))


class OracleDrafter:
    """Drafts from the tokens of a run without speculation, one of them spoilt at random (or
    none): every acceptance count 1 .. k + 1 occurs."""

    def __init__(self, seqs, k, seed=0):
        self.seqs, self.k, self.rng = seqs, k, random.Random(seed)

    def propose(self, tokens):
        tokens = list(tokens)
        cont = []
        for s in self.seqs:
            if s[:len(tokens)] == tokens:
                cont = s[len(tokens):len(tokens) + self.k]
                break
        cont = cont + [0] * (self.k - len(cont))
        j = self.rng.randint(0, self.k)
        if j < self.k:
            cont[j] = (cont[j] + 1) % 256
        return cont


def test_ngram_drafter_and_accept_count():
    d = NgramDrafter(3, n_max=2)
    assert d.propose([1, 2, 3, 4, 9, 2, 3]) == [4, 9, 2]        # bigram (2, 3) seen before
    assert d.propose([5, 6, 7, 6]) == [7, 6, 6]                 # unigram 6, padded with the last
    assert d.propose([1, 2, 3]) == [3, 3, 3]                    # no match: the last token
    assert d.propose([7]) == [7, 7, 7]
    assert accept_count([4, 9, 2], [4, 9, 2, 8]) == 4
    assert accept_count([4, 9, 2], [4, 1, 2, 8]) == 2
    assert accept_count([4, 9, 2], [0, 9, 2, 8]) == 1


def test_spec_config_is_checked():
    with pytest.raises(ValueError, match="spec"):
        EngineConfig(spec="eagle")
    with pytest.raises(ValueError, match="num_spec_tokens"):
        EngineConfig(spec="ngram", num_spec_tokens=64, block_size=64)
    with pytest.raises(ValueError, match="leaves none"):
        EngineConfig(spec="ngram", num_slots=20, max_seqs=4)
    with pytest.raises(ValueError, match="max_tokens"):
        EngineConfig(spec="ngram", num_spec_tokens=40, max_seqs=8, max_tokens=128, block_size=64,
                     num_slots=600)


def test_spec_engine_tokens_commits_and_hits(tiny):
    """Prompts of 60 and 100 tokens and 14 new ones: spec spans cross the 64 and 128 boundaries.
    Then a request whose prompt is the first one's 60 + 10 generated tokens hits block 0, which
    was completed (and committed) by speculative steps, and generates what a cold engine does."""
    k = 3
    prompts = [prompt_of(60, 1), prompt_of(100, 2)]
    ref = engine(tiny, enable_prefix_caching=False).generate(prompts, 14)
    eng = engine(tiny, spec="ngram", k=k)
    eng.drafter = OracleDrafter([p + r.output for p, r in zip(prompts, ref)], k, seed=3)
    out = eng.generate(prompts, 14)
    assert [r.output for r in out] == [r.output for r in ref]
    st = eng.spec_stats
    assert st.rows > 0 and 1 < st.tokens_per_row < k + 1, st.as_dict()
    assert eng.step_count < 2 + 14 + 1, "speculation saved no step"
    follow = prompts[0] + ref[0].output[:10]
    warm = eng.generate([follow], 6)[0]
    assert warm.metrics.hit_tokens == 64
    cold = engine(tiny, enable_prefix_caching=False).generate([follow], 6)[0]
    assert warm.output == cold.output
    eng.cache.check_invariants()
    assert eng.cache.num_available == eng.cache.num_slots and not eng.rings._held


def test_spec_engine_ngram_drafts_change_no_token(tiny):
    prompts = [prompt_of(40, 5) * 2, prompt_of(70, 6)]
    ref = engine(tiny).generate(prompts, 8)
    eng = engine(tiny, spec="ngram", k=2)
    out = eng.generate(prompts, 8)
    assert [r.output for r in out] == [r.output for r in ref]
    assert eng.spec_stats.rows > 0


def test_spec_full_mode_logic_with_rerun_backend(tiny):
    be = RerunBackend()
    k = 2
    prompts = [prompt_of(70 + 20 * i, 40 + i) for i in range(3)]
    ref = engine(tiny, enable_prefix_caching=False).generate(prompts, 5)
    eng = engine(tiny, spec="ngram", k=k, mode="full", graph_backend=be,
                 compile_backend="aot_eager", decode_buckets=(1, 2, 4), progress=False)
    be.manager, be.fn = eng._graphs, {"decode": eng._decode_graph_fn, "spec": eng._spec_graph_fn}
    eng.drafter = OracleDrafter([p + r.output for p, r in zip(prompts, ref)], k, seed=1)
    out = eng.generate(prompts, 5)
    assert [r.output for r in out] == [r.output for r in ref]
    kinds = {key.kind for key in eng._graphs.stats.replays_by_key}
    assert "spec" in kinds, eng._graphs.stats
    eng.cache.check_invariants()


# --------------------------------------------------------------------------------------------
# GPU tier
# --------------------------------------------------------------------------------------------

def _gpu_model(gpu, dtype=torch.float32):
    return HybridGDNModel(preset("tiny", dtype=dtype), device=gpu)


@pytest.mark.gpu
def test_gpu_spec_modes_identical(gpu):
    model = _gpu_model(gpu)
    prompts = [prompt_of(150 + 40 * i, 60 + i) for i in range(3)]
    ref = engine(model, mode="eager", num_slots=64).generate(prompts, 24)
    seqs = [p + r.output for p, r in zip(prompts, ref)]
    configs = [(mode, caching, "oracle") for mode in ("eager", "piecewise", "full")
               for caching in (True, False)] + [("full", True, "ngram")]
    for mode, caching, drafter in configs:
        eng = engine(model, spec="ngram", k=3, mode=mode, num_slots=64,
                     enable_prefix_caching=caching, progress=False)
        if drafter == "oracle":
            eng.drafter = OracleDrafter(seqs, 3, seed=2)
        for _ in range(2):  # cold, then warm (hits)
            out = eng.generate(prompts, 24)
            assert [r.output for r in out] == [r.output for r in ref], (mode, caching)
        if drafter == "oracle":
            assert eng.spec_stats.tokens_per_row > 1.5
        if mode == "full":
            assert any(k.kind == "spec" for k in eng._graphs.stats.replays_by_key)


@pytest.mark.gpu
def test_gpu_spec_full_replay_equals_eager(gpu):
    """For every spec step of a run: plan it, run it eagerly and from the FULL graph on the same
    starting pools; greedy tokens and every pool are bit-identical (>= 100 steps, re-planned each
    time, acceptance counts from an oracle drafter)."""
    model = _gpu_model(gpu)
    k = 3
    prompts = [prompt_of(90 + 30 * i, 30 + i) for i in range(4)]
    ref = engine(model, enable_prefix_caching=False, num_slots=64).generate(prompts, 300)
    eng = engine(model, spec="ngram", k=k, mode="full", num_slots=64, max_model_len=1024,
                 debug_ptrs=True, progress=False)
    eng.drafter = OracleDrafter([p + r.output for p, r in zip(prompts, ref)], k, seed=4)
    reqs = [eng.add_request(p, 300) for p in prompts]
    while any(r.num_computed < len(r.prompt) for r in reqs):
        eng.step()
    pools = [t for blk in model.layers for t in (blk.gdn.ssm_pool, blk.gdn.conv_pool)]
    L, checked = k + 1, 0
    while eng.has_unfinished():
        rows = list(eng.running)
        n = len(rows)
        pad = eng._graphs.padded_size("spec", n)
        eng.planner.plan([r.num_computed for r in rows], [L] * n,
                         [eng.cache.block_table(r.rid) for r in rows], spec=[True] * n,
                         rings=[eng.rings.ring(r.rid) for r in rows],
                         accepted=[r.accepted for r in rows], pad_spec_to=pad)
        ids = [t for r in rows for t in [r.tokens[r.num_computed], *eng.drafter.propose(r.tokens)]]
        eng._spec_ids_buf[:n * L].copy_(torch.tensor(ids))
        before = [t.clone() for t in pools]
        with torch.no_grad():
            eager = eng._spec_graph_fn(pad)[:n * L].clone()
        after_eager = [t.clone() for t in pools]
        for t, b in zip(pools, before):
            t.copy_(b)
        out, size = eng._graphs.run("spec", n, eng._spec_graph_fn)
        assert size == pad and torch.equal(out[:n * L], eager)
        for t, e in zip(pools, after_eager):
            assert torch.equal(t, e), "pools after the spec graph's replay differ from eager"
        for t, b in zip(pools, before):  # the engine's own step redoes it
            t.copy_(b)
        eng.step()
        checked += 1
    assert [r.output for r in reqs] == [r.output for r in ref]
    assert checked >= 100 and eng._graphs.stats.replays >= 2 * checked
