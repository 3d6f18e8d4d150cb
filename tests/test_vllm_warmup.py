"""The vLLM warm-up compiles every kernel variant an engine's steps launch (no vLLM needed).

Triton compiles a kernel once per *specialisation key*: each constexpr, each integer being 1 or a
multiple of 16 (unless the kernel says do_not_specialize), each pointer's 16-byte alignment, and
the launch options. On an H200 the plugin's engines logged Triton compiles during inference of
kernels their warm-up had already compiled (profiling/results/2026-11-30/SUMMARY.md): the warm-up
had used other strides and limits. Here both sides run on the CPU under the interpreter, every
launch is recorded, and its key is computed with Triton's own specialisation function; the keys of
an engine's steps (vLLM page layout, the engine's planner, Qwen3-Next- and Qwen3.5-style inputs,
decode batches of several sizes, prefills with checkpoints) must all be among the warm-up's.
"""

import inspect

import numpy as np
import pytest
import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

import fi_standin
from gdn_graphs.ops import chunk, conv, decode, fi_kernels
from gdn_graphs.ops import workspace as chunk_workspace
from gdn_graphs.ops.chunk import ChunkWorkspace
from gdn_graphs.ops.fi_prefill import FiWorkspace
from gdn_graphs.runtime.core import GDNPools, GDNWeights, run_gdn_core
from gdn_graphs.vllm.slots import DeviceTablePlanner
from gdn_graphs.vllm.v0_26.pages import cache_views
from gdn_graphs.vllm.warmup import warm_up_kernels

HK, HV, K, V, W = 2, 4, 32, 32, 4
C = 2 * HK * K + HV * V
KERNELS = [(chunk, "_chunk_intra_kernel"), (chunk, "_chunk_seq_kernel"),
           (conv, "_conv_decode_kernel"), (conv, "_conv_prefill_kernel"),
           (decode, "_gdn_decode_kernel")]
FI_KERNELS = [(fi_kernels, "_fi_prep_kernel"), (fi_kernels, "_fi_gather_kernel"),
              (fi_kernels, "_fi_scatter_kernel"), (fi_kernels, "_fi_out_kernel")]
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def compile_key(kernel, args, kwargs):
    """What Triton keys a compiled kernel on, for one launch (as in triton.runtime.jit)."""
    heuristics = getattr(kernel, "values", {})            # @triton.heuristics
    inner = kernel.fn if heuristics else kernel
    dns = (getattr(inner, "kwargs", None) or {}).get("do_not_specialize")  # interpreter
    dns = set(dns if dns is not None else getattr(inner, "do_not_specialize", ()))
    params = inspect.signature(inner.fn).parameters
    bound = dict(zip(params, args))
    bound.update({k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS})
    for name, rule in heuristics.items():
        bound[name] = rule(bound)
    key = []
    for name, p in params.items():
        v = bound[name]
        if "constexpr" in str(p.annotation) or v is None:
            key.append((name, repr(v)))
        else:
            key.append((name, native_specialize_impl(BaseBackend, v, False, name not in dns, True)))
    return tuple(key) + tuple((k, kwargs[k]) for k in LAUNCH_OPTIONS if k in kwargs)


class Recorder:
    """Stands in for a kernel: records each launch's compile key, then launches it (run=False:
    only records, for a kernel the CPU cannot run)."""

    def __init__(self, name, kernel, log, run=True):
        self.name, self.kernel, self.log, self.run = name, kernel, log, run

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append((self.name, compile_key(self.kernel, args, kwargs)))
            return self.kernel[grid](*args, **kwargs) if self.run else None
        return launch


@pytest.fixture
def launches(monkeypatch):
    log = []
    for mod, name in KERNELS + FI_KERNELS:
        monkeypatch.setattr(mod, name, Recorder(name, getattr(mod, name), log))
    yield log


def engine_inputs(T, style, dtype):
    """mixed_qkv, a, b as vLLM's layer hands them over: Qwen3-Next concatenates q, k, v
    (contiguous); Qwen3.5 splits them off its packed [q, k, v, z] projection (row stride C + z)."""
    if style == "qwen3_next":
        x = torch.randn(T, C).to(dtype)
    else:
        x = torch.randn(T, C + HV * V).to(dtype)[:, :C]
    return x, torch.randn(T, HV).to(dtype), torch.randn(T, HV).to(dtype)


@pytest.mark.parametrize("style,fi", [("qwen3_next", False), ("qwen3_5", False),
                                      ("qwen3_next", True), ("qwen3_5", True)])
def test_engine_steps_need_no_compile_the_warm_up_did_not_do(launches, style, fi, monkeypatch):
    """fi: the workspace carries a FiWorkspace (FlashInfer's prefill path, the torch stand-in in
    FlashInfer's place): steps whose prefill starts are 64-aligned run its kernels. Steps of
    more than 16 (prefill row, value head) pairs launch other knobs (chunk_config); at these small
    dims bv 64 would be clipped to V = 32 and up to four rows of HV 4 heads already take a V tile
    of 16, so a V tile of 16 with two stages stands in for it and makes the keys differ."""
    monkeypatch.setattr(chunk_workspace, "MANY_SEQS_CONFIG", chunk_workspace.ChunkConfig(bv=16, stages=2))
    dtype, state_dtype, B = torch.bfloat16, torch.float32, 128
    torch.manual_seed(0)
    page = (W - 1) * C * 2 + HV * V * K * 4 + 4096   # padded to a larger attention page
    w = torch.randn(C, W).to(dtype) * 0.5
    A_log, dt_bias = torch.rand(HV), torch.randn(HV).to(dtype)
    max_reqs, max_tokens = 24, 500  # limits that are not multiples of 16, as an engine may have
    ws = ChunkWorkspace(max_tokens, HV, K, V, dtype, "cpu", HK=HK)
    if fi:
        ws.fi = FiWorkspace(max_tokens, 7, HK, HV, K, V, dtype, "cpu", max_checkpoints=max_tokens // 64,
                            fn=fi_standin.chunk_gated_delta_rule)

    # the engine: its pages, its planner and block table, a sequence of steps
    table = torch.arange(1, 1 + max_reqs * 12, dtype=torch.int32).view(max_reqs, 12)
    _, conv_p, ssm_p = cache_views(int(table.max()) + 1, C, W, HV, V, K, dtype, state_dtype,
                                   page_bytes=page)
    weights, pools = GDNWeights(w, None, A_log, dt_bias), GDNPools(conv_p, ssm_p)
    planner = DeviceTablePlanner(max_reqs, max_tokens, B, table.stride(0), table.shape[1])
    steps = [  # (scheduled tokens per request, tokens computed before)
        ([300], [0]),                              # cold prefill with checkpoints
        ([1, 1, 70], [300, 127, 37]),              # two decodes (one crossing a block) + prefill
        ([1, 1, 1, 10], [301, 128, 107, 5]),
        ([1] * 3, [302, 129, 108]),                # pure decode, small and large batches
        ([1] * 16, list(range(100, 116))),
        ([1] * 20, list(range(200, 220))),
        ([5], [250]),                              # a short warm prefill
        ([1, 90, 40], [303, 0, 20]),               # a decode and two prefills (V tile 16)
        ([1] + [20] * 5, [304] + [30] * 5),        # five prefills: 20 pairs (other knobs)
    ]
    if fi:  # prefills from block and 64-aligned starts, after decode rows (FlashInfer path)
        steps += [([1, 200], [303, 128]), ([1, 1, 64], [304, 130, 192]), ([70, 64], [0, 256]),
                  ([30] * 9, [0] * 9)]  # more rows than the FiWorkspace's 7: two groups
    T_max = max(sum(q) for q, _ in steps) + 8
    x_all, a_all, b_all = engine_inputs(T_max, style, dtype)
    for q, n in steps:
        T = sum(q) + 8  # vLLM pads the batch
        qsl = np.concatenate([[0], np.cumsum(q)])
        step = planner.plan(qsl, np.array(n), table[:len(q)], pad_decodes_to=len(q))
        out = torch.zeros(T, HV, V, dtype=dtype)
        run_gdn_core(x_all[:T], a_all[:T], b_all[:T], weights, pools, step, out, ws)
    engine = set(launches)
    launches.clear()

    # the warm-up, given what vLLM's profile run gives the layer
    one_page = GDNPools(*cache_views(1, C, W, HV, V, K, dtype, state_dtype, page_bytes=page)[1:])
    assert warm_up_kernels(HK, HV, K, V, w, A_log, dt_bias, dtype, state_dtype, ws,
                           like=(x_all, a_all, b_all), pools=one_page, max_decode_rows=max_reqs)
    warm = set(launches)
    missing = engine - warm
    assert not missing, "kernels the engine would compile during inference:\n" + "\n".join(
        f"{name}: {dict(key)}" for name, key in sorted(missing, key=str))
    assert {name for name, _ in engine} == {name for _, name in KERNELS + (FI_KERNELS if fi else [])}


def test_a_warm_up_on_other_layouts_misses_engine_variants(launches):
    """The check above can fail: a warm-up on unpadded stand-in pools (what it did before) misses
    the keys of an engine whose page stride is not a multiple of 16 elements."""
    dtype, state_dtype = torch.bfloat16, torch.float32
    page = (W - 1) * C * 2 + HV * V * K * 4 + 24
    w = torch.randn(C, W).to(dtype)
    A_log, dt_bias = torch.rand(HV), torch.randn(HV).to(dtype)
    x, a, b = engine_inputs(200, "qwen3_5", dtype)
    _, conv_p, ssm_p = cache_views(17, C, W, HV, V, K, dtype, state_dtype, page_bytes=page)
    planner = DeviceTablePlanner(4, 256, 128, 4, 4)
    table = torch.arange(1, 17, dtype=torch.int32).view(4, 4)
    step = planner.plan(np.array([0, 1, 150]), np.array([10, 0]), table[:2])
    run_gdn_core(x[:160], a[:160], b[:160], GDNWeights(w, None, A_log, dt_bias),
                 GDNPools(conv_p, ssm_p), step, torch.zeros(160, HV, V, dtype=dtype))
    engine = set(launches)
    launches.clear()
    warm_up_kernels(HK, HV, K, V, w, A_log, dt_bias, dtype, state_dtype)  # no layouts given
    missed = {name for name, _ in engine - set(launches)}
    assert "_chunk_seq_kernel" in missed, missed  # it specialises on the slot stride
    launches.clear()
    one_page = GDNPools(*cache_views(1, C, W, HV, V, K, dtype, state_dtype, page_bytes=page)[1:])
    warm_up_kernels(HK, HV, K, V, w, A_log, dt_bias, dtype, state_dtype, like=(x, a, b),
                    pools=one_page, max_decode_rows=4)
    assert not engine - set(launches)


def _engine_keys_and_warm_up_keys(launches, name, steps, style):
    """Run ``steps`` ((scheduled, computed) token counts per row) through an engine's planner and
    core on a vLLM page layout, keep the compile keys of kernel ``name``'s launches, then run the
    warm-up on one page: (the engine's keys, every key the warm-up launched, the names of every
    kernel the engine launched)."""
    dtype, state_dtype, B = torch.bfloat16, torch.float32, 128
    page = (W - 1) * C * 2 + HV * V * K * 4 + 4096
    w = torch.randn(C, W).to(dtype) * 0.5
    A_log, dt_bias = torch.rand(HV), torch.randn(HV).to(dtype)
    max_reqs, max_tokens = 24, 500
    ws = ChunkWorkspace(max_tokens, HV, K, V, dtype, "cpu", HK=HK)
    table = torch.arange(1, 1 + max_reqs * 12, dtype=torch.int32).view(max_reqs, 12)
    _, conv_p, ssm_p = cache_views(int(table.max()) + 1, C, W, HV, V, K, dtype, state_dtype, page_bytes=page)
    weights, pools = GDNWeights(w, None, A_log, dt_bias), GDNPools(conv_p, ssm_p)
    planner = DeviceTablePlanner(max_reqs, max_tokens, B, table.stride(0), table.shape[1])
    x_all, a_all, b_all = engine_inputs(max(sum(q) for q, _ in steps) + 8, style, dtype)
    for q, n in steps:
        T = sum(q) + 8
        qsl = np.concatenate([[0], np.cumsum(q)])
        step = planner.plan(qsl, np.array(n), table[:len(q)], pad_decodes_to=len(q))
        run_gdn_core(x_all[:T], a_all[:T], b_all[:T], weights, pools, step,
                     torch.zeros(T, HV, V, dtype=dtype), ws)
    engine = {key for key in launches if key[0] == name}
    names = {key[0] for key in launches}
    launches.clear()
    one_page = GDNPools(*cache_views(1, C, W, HV, V, K, dtype, state_dtype, page_bytes=page)[1:])
    assert warm_up_kernels(HK, HV, K, V, w, A_log, dt_bias, dtype, state_dtype, ws,
                           like=(x_all, a_all, b_all), pools=one_page, max_decode_rows=max_reqs)
    return engine, set(launches), names


def test_gluon_route_needs_no_compile_the_warm_up_did_not_do(launches, monkeypatch):
    """Where the Gluon sequential kernel can run (Hopper, K = V = 128), steps of enough prefill
    rows launch it instead of the Triton one (chunk_config). The CPU cannot run it, so here the
    route is forced open at these small dims (GLUON_MIN_PAIRS 8, after FEW_PAIRS_MAX 16: five
    rows of 4 heads) and its
    launches only recorded: the engine's keys (steps of other token counts, pool sizes and
    checkpoint tables) must be among the warm-up's, which must have launched it."""
    from gdn_graphs.ops import chunk_gluon
    from gdn_graphs.runtime import core
    from gdn_graphs.vllm import warmup
    for mod in (chunk, core, warmup):
        monkeypatch.setattr(mod, "gluon_seq_supported", lambda v, K: True)
    monkeypatch.setattr(chunk_workspace, "GLUON_MIN_PAIRS", 8)
    monkeypatch.setattr(warmup, "GLUON_MIN_PAIRS", 8)
    monkeypatch.setattr(chunk_gluon, "_seq_gluon_kernel",
                        Recorder("_seq_gluon_kernel", chunk_gluon._seq_gluon_kernel, launches, run=False))
    steps = [([1, 90, 40], [303, 0, 20]), ([70, 64, 3], [0, 256, 5]), ([30] * 9, [0] * 9),
             ([1, 1, 17, 200], [40, 41, 128, 0])]
    engine, warm, _ = _engine_keys_and_warm_up_keys(launches, "_seq_gluon_kernel", steps, "qwen3_next")
    assert engine, "no step took the Gluon route"
    assert not engine - warm, f"Gluon launches the warm-up did not compile: {engine - warm}"


def test_gluon_intra_needs_no_compile_the_warm_up_did_not_do(launches, monkeypatch):
    """Where the Gluon chunk-parallel kernel can run (Hopper, bf16 inputs, K = V = 128) every
    prefill step launches it instead of the Triton one. Forced open here at small dims and only
    recorded (the CPU cannot run it): the engine's keys must be among the warm-up's."""
    from gdn_graphs.ops import chunk_intra_gluon
    monkeypatch.setattr(chunk, "gluon_intra_supported", lambda q, V: True)
    monkeypatch.setattr(chunk_intra_gluon, "_intra_gluon_kernel",
                        Recorder("_intra_gluon_kernel", chunk_intra_gluon._intra_gluon_kernel, launches,
                                 run=False))
    steps = [([1, 90, 40], [303, 0, 20]), ([70, 64, 3], [0, 256, 5]), ([1, 1, 17, 200], [40, 41, 128, 0])]
    engine, warm, names = _engine_keys_and_warm_up_keys(launches, "_intra_gluon_kernel", steps, "qwen3_5")
    assert engine, "no step took the Gluon intra route"
    assert "_chunk_intra_kernel" not in names, "a step took Triton's intra kernel"
    assert not engine - warm, f"Gluon intra launches the warm-up did not compile: {engine - warm}"
