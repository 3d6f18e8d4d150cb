"""The embedded engine on a tiny float32 model: prefix caching changes nothing but the work done.

CPU tier: eager mode (kernels under the Triton interpreter), the custom op under torch.compile.
GPU tier (marker ``gpu``): all three modes, FULL-graph replay vs eager, the 36-layer speedup.
"""


import numpy as np
import pytest
import torch

from gdn_graphs.engine import Engine, EngineConfig, Request
from gdn_graphs.engine.model import HybridGDNModel, preset
from gdn_graphs.runtime.core import StepContext, step_context
from gdn_graphs.runtime.step import GDNStep
from helpers import RerunBackend, prompt_of

B = 64


@pytest.fixture(scope="module")
def tiny():
    return HybridGDNModel(preset("tiny"))


def engine(model, **kw):
    kw.setdefault("num_slots", 24)
    kw.setdefault("max_tokens", 128)
    kw.setdefault("max_model_len", 512)
    return Engine(model, EngineConfig(**kw))


def test_caching_on_off_same_tokens_and_hits(tiny):
    # 250 tokens with a 128-token budget: cold steps [0,128) [128,250); the warm run resumes at
    # 192 (3 whole blocks), in the middle of the cold run's second step.
    prompt = prompt_of(250, 1)
    on = engine(tiny, enable_prefix_caching=True)
    runs = [on.generate([prompt], 5)[0] for _ in range(3)]
    off = engine(tiny, enable_prefix_caching=False)
    ref = off.generate([prompt], 5)[0]
    assert ref.metrics.hit_tokens == 0
    assert [r.metrics.hit_tokens for r in runs] == [0, 192, 192]
    assert all(r.metrics.queried_tokens == 250 for r in runs)
    for r in runs:
        assert r.output == ref.output, (r.output, ref.output)
    assert len(set(ref.output)) > 1, "greedy collapsed onto one token: weights badly scaled"
    on.cache.check_invariants()
    off.cache.check_invariants()
    assert on.cache.num_available == on.cfg.num_slots and off.cache.pool.num_free == off.cfg.num_slots


def test_full_prompt_hit_and_one_token_tail(tiny):
    eng = engine(tiny)
    full = prompt_of(128, 2)                    # cached in full: the last block is recomputed
    a = [eng.generate([full], 3)[0] for _ in range(2)]
    assert [r.metrics.hit_tokens for r in a] == [0, 64]
    assert a[0].output == a[1].output
    odd = prompt_of(129, 3)                     # last chunk of one token: a step of its own
    b = [eng.generate([odd], 3)[0] for _ in range(2)]
    assert [r.metrics.hit_tokens for r in b] == [0, 128]
    assert b[0].output == b[1].output


def test_shared_system_prompt_hits(tiny):
    eng = engine(tiny)
    system = prompt_of(150, 4)
    qs = [prompt_of(20 + 7 * i, 10 + i) for i in range(3)]
    first = eng.generate([system + qs[0]], 3)[0]
    assert first.metrics.hit_tokens == 0
    # later questions share the system prompt: hits are its whole blocks (150 -> 128)
    later = eng.generate([system + q for q in qs[1:]], 3)
    assert [r.metrics.hit_tokens for r in later] == [128, 128]
    # and the same answers as without caching (two requests batched together here)
    off = engine(tiny, enable_prefix_caching=False)
    ref = off.generate([system + q for q in qs[1:]], 3)
    assert [r.output for r in later] == [r.output for r in ref]


def test_warm_core_outputs_bit_identical(tiny):
    prompt = prompt_of(250, 5)
    eng = engine(tiny, debug_record=True)
    cold = eng.generate([prompt], 4)[0]
    warm = eng.generate([prompt], 4)[0]
    assert warm.metrics.hit_tokens == 192
    L = tiny.cfg.num_layers
    for layer in range(L):
        c, w = cold.core_outputs(layer), warm.core_outputs(layer)
        assert sorted(w) == list(range(192, 250 + 3)), "warm computes the suffix and the decodes"
        for pos, row in w.items():
            assert torch.equal(row, c[pos]), f"layer {layer} position {pos} differs"
    assert warm.output == cold.output


def test_batching_and_abort(tiny):
    eng = engine(tiny, max_seqs=3, num_slots=12)
    prompts = [prompt_of(70 + 20 * i, 20 + i) for i in range(4)]
    reqs = [eng.add_request(p, 3) for p in prompts]
    eng.step()
    eng.abort(reqs[1])
    while eng.has_unfinished():
        eng.step()
    assert reqs[1].status == "aborted" and all(r.status == "finished" for i, r in enumerate(reqs)
                                               if i != 1)
    eng.cache.check_invariants()
    assert eng.cache.num_available == 12
    # batched results equal one-at-a-time results
    solo = engine(tiny, enable_prefix_caching=False)
    for i in (0, 3):
        assert reqs[i].output == solo.generate([prompts[i]], 3)[0].output


def test_out_of_slots_is_the_askers_error(tiny):
    eng = engine(tiny, num_slots=4, max_model_len=1024)
    from gdn_graphs.engine.prefix_cache import OutOfSlots
    with pytest.raises(OutOfSlots):
        eng.add_request(prompt_of(600, 6), 2)    # 10 blocks can never fit in 4 slots
    assert not eng.has_unfinished()


@pytest.mark.parametrize("prompt, new, err, match", [
    ([1, 2, 3.7], 2, TypeError, r"prompt\[2\] must be an int, got float 3.7"),
    ([1, "5"], 2, TypeError, r"prompt\[1\] must be an int, got str"),
    ([1, True], 2, TypeError, r"prompt\[1\] must be an int, got bool"),
    ("abc", 2, TypeError, "prompt must be a sequence of int token ids, got str"),
    (5, 2, TypeError, "prompt must be a sequence"),
    ([], 2, ValueError, "empty prompt"),
    ([1, 256], 2, ValueError, r"prompt\[1\] = 256 is not a token id.*\[0, 256\)"),
    ([-1, 2], 2, ValueError, r"prompt\[0\] = -1"),
    ([1, 2], 2.5, TypeError, "max_new_tokens must be an int, got float 2.5"),
    ([1, 2], "3", TypeError, "max_new_tokens must be an int, got str"),
    ([1, 2], True, TypeError, "max_new_tokens must be an int, got bool"),
    ([1, 2], 0, ValueError, "max_new_tokens must be >= 1, got 0"),
    ([1] * 500, 20, ValueError, "519 tokens .* > max_model_len=512"),
])
def test_add_request_refuses_bad_input_at_once(tiny, prompt, new, err, match):
    eng = engine(tiny)
    with pytest.raises(err, match=match):
        eng.add_request(prompt, new)
    assert not eng.has_unfinished() and not eng.finished


def test_add_request_takes_numpy_integers(tiny):
    eng = engine(tiny)
    req = eng.add_request(np.array([3, 4, 5], dtype=np.int32), np.int64(2))
    assert req.prompt == [3, 4, 5] and all(type(t) is int for t in req.prompt)
    assert type(req.max_new_tokens) is int
    req2 = eng.add_request([np.int16(7), 8], 1)
    assert req2.prompt == [7, 8]


def test_generate_refusal_queues_nothing(tiny):
    eng = engine(tiny)
    with pytest.raises(TypeError, match=r"prompt\[1\]"):
        eng.generate([[1, 2, 3], [4, 5.0]], 2)
    assert not eng.has_unfinished() and eng.cache.num_available == eng.cfg.num_slots


def test_abort_of_another_engines_request_changes_nothing(tiny):
    e1, e2 = engine(tiny), engine(HybridGDNModel(preset("tiny")))
    a, b = e1.add_request([1, 2, 3], 2), e2.add_request([1, 2, 3], 2)  # equal fields
    with pytest.raises(ValueError, match="not queued by this engine"):
        e1.abort(b)
    with pytest.raises(ValueError, match="not queued by this engine"):
        e1.abort(Request(0, [1, 2, 3], 2))
    assert a.status == b.status == "waiting" and e1.waiting == [a] and e2.waiting == [b]
    e1.abort(a)
    e1.abort(a)                                       # aborting a done request is a no-op
    assert a.status == "aborted" and e1.finished == [a] and e2.waiting == [b]


def test_a_second_engine_on_the_same_model_retires_the_first(tiny):
    """The state pools live on the model: two live engines on one model would write the same
    slots (seen in the GPU soak, 4,350 of 4,902 requests different). The newer engine owns the
    (fresh) pools; the older one refuses every call, before touching them."""
    prompt = prompt_of(150, 3)
    ref = engine(HybridGDNModel(preset("tiny"))).generate([prompt], 4)[0].output
    e1 = engine(tiny)
    e1.add_request(prompt, 4)
    e1.step()
    e2 = engine(tiny)
    for call in (lambda: e1.step(), lambda: e1.add_request([1, 2], 2)):
        with pytest.raises(RuntimeError, match="another Engine was built on this engine's model"):
            call()
    assert all(float(p.abs().max()) == 0 for p in e2._pool_tensors())  # fresh pools, nothing written
    assert e2.generate([prompt], 4)[0].output == ref


def _fail_once(monkeypatch, obj, name, after: bool):
    """Make obj.name raise once: before it runs, or after it ran (its kernels wrote the pools)."""
    real, calls = getattr(obj, name), []

    def flaky(*a, **k):
        calls.append(1)
        out = real(*a, **k) if after else None
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        return out if after else real(*a, **k)
    monkeypatch.setattr(obj, name, flaky)


def test_failed_step_fails_its_requests_alone(tiny, monkeypatch):
    eng = engine(tiny, max_seqs=2, num_slots=12, max_tokens=256)
    prompts = [prompt_of(n, 60 + i) for i, n in enumerate((70, 20, 25))]
    failing = [eng.add_request(p, 2) for p in prompts[:2]]
    queued = eng.add_request(prompts[2], 2)           # max_seqs=2: waits during the fault
    eng.step()                                        # the two prefills
    assert all(len(r.output) == 1 for r in failing)
    # the decode step raises after its kernels updated the two requests' slots in place
    _fail_once(monkeypatch, eng, "_forward", after=True)
    with pytest.raises(RuntimeError, match="injected fault"):
        eng.step()
    for r in failing:
        assert r.status == "error" and "injected fault" in r.error and r.rid not in eng.cache
    eng.cache.check_invariants()
    assert queued.status == "waiting"
    later = eng.add_request(prompts[0], 2)            # hits the failed request's committed block
    while eng.has_unfinished():
        eng.step()
    eng.cache.check_invariants()
    assert eng.cache.num_available == 12 and later.metrics.hit_tokens == 64
    fresh = engine(tiny).generate([prompts[2], prompts[0]], 2)
    assert [queued.output, later.output] == [r.output for r in fresh]
    assert queued.status == later.status == "finished"


def test_generate_whose_step_fails_leaves_nothing_behind(tiny, monkeypatch):
    eng = engine(tiny, max_seqs=1)
    _fail_once(monkeypatch, eng.planner, "plan", after=False)
    with pytest.raises(RuntimeError, match="injected fault"):
        eng.generate([prompt_of(10, 1), prompt_of(12, 2)], 2)
    assert [r.status for r in eng.finished] == ["error", "aborted"]
    assert not eng.has_unfinished() and eng.cache.num_available == eng.cfg.num_slots
    eng.cache.check_invariants()


def test_kernel_error_flag_fails_the_step(tiny, monkeypatch):
    """A slot that got past plan() (here: written into the decode buffer behind its back, as a
    bug would) is masked by the kernels and reported through the error flag: the step raises and
    its requests fail alone; no state outside the pool is touched."""
    eng = engine(tiny, max_seqs=2, num_slots=12)
    r = eng.add_request(prompt_of(40, 3), 3)
    eng.step()                                        # prefill
    real = eng.planner.plan

    def corrupting(*a, **k):
        step = real(*a, **k)
        eng.planner.decode_write[0] = 10 ** 6         # outside the pool
        return step
    monkeypatch.setattr(eng.planner, "plan", corrupting)
    with pytest.raises(RuntimeError, match="slot out of range"):
        eng.step()
    assert r.status == "error" and "error code 1" in r.error
    eng.cache.check_invariants()
    monkeypatch.setattr(eng.planner, "plan", real)
    ok = eng.add_request(prompt_of(40, 4), 2)
    while eng.has_unfinished():
        eng.step()
    assert ok.status == "finished" and ok.output == engine(tiny).generate([prompt_of(40, 4)], 2)[0].output


def test_non_finite_logits_fail_their_request_alone():
    """A request whose logits hold a NaN (here: a token whose embedding is NaN, in its prompt
    only) fails alone, with the reason, at the step that samples it; the requests batched with it
    get the tokens they get without it, and every slot goes back."""
    model = HybridGDNModel(preset("tiny"))  # its own copy: one embedding row is poisoned
    POISON = 7
    with torch.no_grad():
        model.embed.weight[POISON] = float("nan")
    clean = [[t for t in prompt_of(n, 80 + n) if t != POISON] for n in (70, 40)]
    bad = [t for t in prompt_of(50, 90) if t != POISON] + [POISON] + prompt_of(20, 91)
    eng = engine(model, max_seqs=3)
    reqs = [eng.add_request(p, 4) for p in (clean[0], bad, clean[1])]
    while eng.has_unfinished():
        eng.step()
    assert reqs[1].status == "error" and "non-finite logits" in reqs[1].error, reqs[1].error
    assert reqs[1].output == []
    alone = engine(model).generate(clean, 4)
    assert [reqs[0].output, reqs[2].output] == [r.output for r in alone]
    assert reqs[0].status == reqs[2].status == "finished"
    eng.cache.check_invariants()
    assert eng.cache.num_available == eng.cfg.num_slots


def test_piecewise_engine_no_recompile_per_step(tiny):
    # aot_eager: the same Dynamo graph capture and fake-tensor tracing of gdn_core as Inductor,
    # without the C++ compile (that path is exercised by the demo and the GPU tier)
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    prompt = prompt_of(150, 11)
    ref = engine(tiny).generate([prompt], 4)[0]
    eng = engine(tiny, mode="piecewise", compile_backend="aot_eager", max_tokens=256)
    out = eng.generate([prompt, prompt_of(90, 12)], 4)
    assert out[0].output == ref.output
    assert eng.step_count >= 4
    # token counts 240 (first step: two prefills), then 2 and 1 (decodes): three buckets, but the
    # token dim is marked dynamic and the batch layout lives in the StepContext: ONE graph
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_full_mode_logic_with_rerun_backend(tiny):
    be = RerunBackend()
    eng = engine(tiny, mode="full", graph_backend=be, compile_backend="aot_eager",
                 decode_buckets=(1, 2, 4), max_seqs=4, progress=False)
    be.manager, be.fn = eng._graphs, eng._decode_graph_fn
    prompts = [prompt_of(80 + 20 * i, 40 + i) for i in range(3)]
    out = eng.generate(prompts, 5)
    assert be.replays >= 4, "pure decode steps must go through the graph manager"
    assert eng._graphs.stats.replays_by_key, "no graph replayed"
    ref = engine(tiny, enable_prefix_caching=False).generate(prompts, 5)
    assert [r.output for r in out] == [r.output for r in ref]
    eng.cache.check_invariants()


def _op_inputs(T, nd, device="cpu"):
    cfg = preset("tiny")
    HV, V, K, C = cfg.num_v_heads, cfg.head_v_dim, cfg.head_k_dim, cfg.conv_dim
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device)
    from gdn_graphs.ops.meta import chunk_meta
    meta = chunk_meta([T - nd], [0], [-1], [3], [[]], B, device=device)
    ctx = StepContext(GDNStep(num_decodes=nd, num_prefill_tokens=T - nd,
                              decode_read=torch.tensor([0] * nd, dtype=torch.int32, device=device),
                              decode_write=torch.tensor([1] * nd, dtype=torch.int32, device=device),
                              prefill=meta))
    args = (r(T, C), r(T, HV), r(T, HV), r(C, 4), None, r(HV).abs(), r(HV),
            torch.zeros(4, C, 3, device=device), torch.zeros(4, HV, V, K, device=device), 0)
    return ctx, args


def test_custom_op_opcheck_and_compile():
    ctx, args = _op_inputs(T=9, nd=1)
    with step_context(ctx):
        torch.library.opcheck(torch.ops.gdn_graphs.gdn_core.default, args,
                              test_utils=("test_schema", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))
        eager = torch.ops.gdn_graphs.gdn_core(*args)

        def f(x, *rest):
            return torch.ops.gdn_graphs.gdn_core(x * 1.0, *rest).sum(-1)

        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        out = compiled(*args)
    assert torch.allclose(out, eager.sum(-1), rtol=1e-5, atol=1e-6)
    assert torch.isfinite(eager).all()
    assert torch.ops.gdn_graphs.gdn_core.default.tags.count(torch._C.Tag.cudagraph_unsafe) == 1


def test_custom_op_outside_context_is_a_clear_error():
    _, args = _op_inputs(T=3, nd=1)
    with pytest.raises(RuntimeError, match="step_context"):
        torch.ops.gdn_graphs.gdn_core(*args)


# ---------------------------------------------------------------------------- GPU tier

def _gpu_model(gpu, **kw):
    cfg = preset("tiny", hidden_size=128, num_layers=3, num_k_heads=2, num_v_heads=4,
                 head_k_dim=32, head_v_dim=32, vocab_size=512, **kw)
    return HybridGDNModel(cfg, device=gpu)


@pytest.mark.gpu
def test_gpu_modes_identical(gpu):
    model = _gpu_model(gpu)
    prompt = prompt_of(700, 7)
    outs, hits = {}, {}
    for mode in ("eager", "piecewise", "full"):
        for caching in (True, False):
            eng = Engine(model, EngineConfig(mode=mode, enable_prefix_caching=caching,
                                             num_slots=48, max_tokens=256, max_model_len=1024,
                                             decode_buckets=(1, 2, 4, 8), progress=False))
            runs = [eng.generate([prompt], 16)[0] for _ in range(3)]
            outs[mode, caching] = [r.output for r in runs]
            hits[mode, caching] = [r.metrics.hit_tokens for r in runs]
            if mode == "full":
                assert eng._graphs.stats.replays > 0, "full mode never replayed a graph"
    first = outs["eager", False][0]
    print("tokens", first)
    for key, o in outs.items():
        assert all(x == first for x in o), f"{key} differs: {o} vs {first}"
    for mode in ("eager", "piecewise", "full"):
        assert hits[mode, True] == [0, 640, 640]
        assert hits[mode, False] == [0, 0, 0]


@pytest.mark.gpu
def test_gpu_full_decode_replay_equals_eager(gpu):
    """Capture once, then for many steps: re-plan, run the same decode step eagerly and from the
    graph on the same starting pools; tokens and every pool are bit-identical."""
    model = _gpu_model(gpu)
    eng = Engine(model, EngineConfig(mode="full", num_slots=32, max_tokens=512, max_seqs=4,
                                     decode_buckets=(1, 2, 4), debug_ptrs=True, progress=False))
    reqs = [eng.add_request(prompt_of(100 + 30 * i, 30 + i), 40 + 3 * i) for i in range(4)]
    while any(r.num_computed < len(r.prompt) for r in reqs):
        eng.step()
    pools = [t for blk in model.layers for t in (blk.gdn.ssm_pool, blk.gdn.conv_pool)]
    checked = 0
    while eng.has_unfinished():
        rows = list(eng.running)
        nd = len(rows)
        pad = eng._graphs.padded_size("decode", nd)
        eng.planner.plan([r.num_computed for r in rows], [1] * nd,
                         [eng.cache.block_table(r.rid) for r in rows], pad_decodes_to=pad)
        eng._ids_buf[:nd].copy_(torch.tensor([r.tokens[r.num_computed] for r in rows]))
        before = [t.clone() for t in pools]
        with torch.no_grad():
            eager = eng._decode_graph_fn(pad)[:nd].clone()
        after_eager = [t.clone() for t in pools]
        for t, b in zip(pools, before):
            t.copy_(b)
        out, size = eng._graphs.run("decode", nd, eng._decode_graph_fn)
        assert size == pad
        assert torch.equal(out[:nd], eager)
        for t, e in zip(pools, after_eager):
            assert torch.equal(t, e), "pool states after graph replay differ from eager"
        for t, b in zip(pools, before):  # let the engine's own step redo it
            t.copy_(b)
        eng.step()
        checked += 1
    assert checked >= 30 and eng._graphs.stats.replays >= 2 * checked
    assert len({len(r.output) for r in reqs}) > 1  # batches shrank: several buckets replayed


@pytest.mark.gpu
def test_gpu_full_graphs_survive_piecewise_captures_bf16(gpu):
    """The 2026-12-01 fault: FULL decode graphs replayed after piecewise prefill steps (Inductor's
    cudagraph trees capture, and clear cuBLAS workspaces, around them), bf16 qwen3-next shapes at
    36 layers, two requests sharing a 2048-token prompt. It failed in 9 of 12 such runs before the
    capture made its own cuBLAS workspace (profiling/results/2026-12-01/SUMMARY.md); three
    rounds here, each with a fresh engine."""
    import random as rnd

    model = HybridGDNModel(preset("qwen3-next", dtype=torch.bfloat16), device=gpu)
    for round_ in range(3):
        eng = Engine(model, EngineConfig(mode="full", block_size=256, num_slots=34, max_seqs=4,
                                         max_tokens=2048, max_model_len=2640,
                                         decode_buckets=(1, 2, 4), progress=False))
        rng = rnd.Random(round_)
        prompt = [rng.randrange(model.cfg.vocab_size) for _ in range(2048)]
        eng.generate([[rng.randrange(model.cfg.vocab_size) for _ in range(2048)]], 3)
        a = eng.add_request(prompt, 12)
        while a.num_computed < len(a.prompt):
            eng.step()
        b = eng.add_request(prompt, 8)
        while eng.has_unfinished():
            eng.step()
        torch.cuda.synchronize()
        assert a.status == b.status == "finished" and b.metrics.hit_tokens > 0
        assert eng._graphs.stats.replays > 0


@pytest.mark.gpu
def test_gpu_qwen3_next_decode_speedup(gpu):
    cfg = preset("qwen3-next", dtype=torch.bfloat16)
    model = HybridGDNModel(cfg, device=gpu)
    eng = Engine(model, EngineConfig(mode="full", enable_prefix_caching=False, num_slots=2,
                                     max_seqs=1, max_tokens=256, decode_buckets=(1,),
                                     progress=False))
    req = eng.add_request(prompt_of(100, 8), 8)
    while req.num_computed < len(req.prompt):
        eng.step()
    # plan one decode step and time it eagerly vs replayed (same persistent buffers)
    eng.planner.plan([req.num_computed], [1], [eng.cache.block_table(req.rid)], pad_decodes_to=1)
    eng._ids_buf[:1] = req.tokens[-1]

    def timed(fn, iters=30):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / iters

    with torch.no_grad():
        t_eager = timed(lambda: eng._decode_graph_fn(1))
        t_full = timed(lambda: eng._graphs.run("decode", 1, eng._decode_graph_fn))
    speedup = t_eager / t_full
    print(f"qwen3-next 36-layer decode step, batch 1, bf16: eager {t_eager:.3f} ms, "
          f"full graph {t_full:.3f} ms, speedup {speedup:.1f}x")
    assert speedup >= 5.0
