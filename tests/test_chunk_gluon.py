"""The Gluon sequential kernel (gdn_graphs.ops.chunk_gluon) against the Triton one, bit for bit.

Triton's interpreter cannot run Gluon, so the CPU tier checks where the kernel is chosen, that a
config asking for it where it cannot run is refused before any kernel runs, and that it compiles
for sm_90 without spills; the GPU tier checks that it gives the Triton kernel's outputs and stored
states exactly (so warm == cold holds across steps that chose differently), its repairs of bad
slots, and a CUDA-graph replay.
"""

from __future__ import annotations

import random

import pytest
import torch

from gdn_graphs.ops.chunk import ChunkConfig, ChunkWorkspace, gdn_chunk_prefill
from gdn_graphs.ops.chunk_gluon import gluon_seq_supported
from gdn_graphs.ops.common import ERR_SLOT
from gdn_graphs.ops.meta import chunk_meta, num_checkpoints
from gdn_graphs.ops.workspace import (FEW_PAIRS_CONFIG, GLUON_CONFIG, GLUON_MIN_PAIRS, MANY_SEQS_CONFIG,
                                     chunk_config)
from test_chunk import make_inputs, make_pool, plan, seed_states

GLUON_128 = ChunkConfig(seq_kernel="gluon", bv=128)


def test_chunk_config_picks_gluon_only_with_enough_pairs():
    bf16 = torch.bfloat16
    for bad in (dict(seq_kernel="cute"), dict(seq_kernel="gluon", bv=32), dict(bv=128)):
        with pytest.raises(ValueError):
            ChunkConfig(**bad)
    assert chunk_config(8, bf16, 32, gluon_ok=True) == GLUON_CONFIG            # 256 pairs
    assert chunk_config(8, bf16, 16, gluon_ok=True) == GLUON_CONFIG            # 128
    assert chunk_config(4, bf16, 16, gluon_ok=True) == GLUON_CONFIG            # 64
    assert chunk_config(2, bf16, 16, gluon_ok=True) == GLUON_CONFIG            # 32
    assert chunk_config(3, bf16, 8, gluon_ok=True) == MANY_SEQS_CONFIG         # 24: not timed
    assert chunk_config(2, bf16, 8, gluon_ok=True) == FEW_PAIRS_CONFIG         # 16: V tile 16
    assert chunk_config(8, bf16, 32, gluon_ok=False) == MANY_SEQS_CONFIG       # cannot run here
    assert chunk_config(1, bf16, 256, gluon_ok=True) == ChunkConfig()          # one sequence
    assert chunk_config(None, bf16, 32, gluon_ok=True) == ChunkConfig()        # graph template
    assert chunk_config(8, torch.float32, 32, gluon_ok=True) == ChunkConfig()  # fp32 inputs
    assert GLUON_MIN_PAIRS == 32


def test_gluon_refused_where_it_cannot_run(device):
    """On the CPU tier (and for shapes it does not take) the kernel is never chosen, and a config
    asking for it is a ValueError raised before any kernel runs: the pool is untouched."""
    HK, HV, K, V = 2, 4, 32, 32
    seqs = [(100, 0), (70, 37)]
    inputs = make_inputs(170, HK, HV, K, V, torch.bfloat16, device, seed=1)
    assert not gluon_seq_supported(inputs[2], K)  # V = 32 (and no sm_90 on the CPU tier)
    pool = make_pool(16, HV, V, K, torch.float32, device)
    pool.zero_()
    reads, writes, ckpts = plan(seqs, 64, 16, random.Random(0))
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, 64, device=device)
    with pytest.raises(ValueError, match="seq_kernel='gluon'"):
        gdn_chunk_prefill(*inputs, pool, meta, config=GLUON_CONFIG)
    assert torch.count_nonzero(pool) == 0


_COMPILE_SCRIPT = r"""
import itertools
from gdn_graphs.ops import chunk_gluon as G
from sm90_compile import compile_sm90, ptxas_report

ints = ("T", "max_ckpts", "num_slots", "block_size")
meta = {"cu_seqlens", "start_pos", "read_slot", "write_slot", "ckpt_offsets", "ckpt_slots", "error_flag"}
divisible = lambda name, ty: ty.startswith("*") or name.startswith("s_") or name == "block_size"  # the launcher's
# (P made by the kernel itself only at V tile 64, where gdn_chunk_prefill asks for it)
for (HK, HV), (bv, own_p), round_state, has_flag in itertools.product(
        ((16, 32), (8, 16)), ((128, False), (64, False), (64, True)), (False, True), (False, True)):
    consts = dict(HK=HK, HV=HV, K=128, V=128, BV=bv, BC=64, ROUND_STATE=round_state, OWN_P=own_p,
                  LW=G.LOADER_WARPS, LOAD_REGS=G.LOADER_REGS)
    special = dict(g_ws="*fp32", **({} if round_state else dict(ssm="*fp32")))
    ck = compile_sm90(G._seq_gluon_kernel, consts, special, meta, ints, has_flag, bv // 16, divisible,
                      **G.launch_regs(bv, own_p))
    name = f"HV {HV} bv {bv} round {round_state} flag {has_flag} own P {own_p}"
    regs, spills = ptxas_report(ck)
    print(name, "regs", regs, "spill stores", spills, "shared", ck.metadata.shared)
    assert ck.metadata.shared <= 227 * 1024, (name, ck.metadata.shared)
    if G.launch_regs(bv, own_p):  # two CTAs an SM (GLUON_CONFIG's point): 2 x (shared + 1 KB
        # reserved) <= 228 KB, 2 x 8 warps x 128 registers = the SM's 64 K
        assert ck.metadata.shared <= 113 * 1024, (name, ck.metadata.shared)
        assert regs == ["128"], (name, regs)
    # S k^T, S q^T (8 k-steps each), v_new, out, the state (4 each), Q K^T (8, own P)
    assert ck.asm["ptx"].count("wgmma.mma_async") == 28 + 8 * own_p, (name, "wgmma count")
    assert "cp.async" in ck.asm["ptx"], (name, "no cp.async ring")
    assert ("atom" in ck.asm["ptx"]) == has_flag, (name, "the flag's atomic")
    # nothing but, at V tile 64, a register or two of the loader partition at its 32 (setmaxnreg):
    # 4-8 bytes a chunk (SASS: the STL sits in the loader's loop; the chain has none)
    assert max(spills) <= 8 * (bv == 64), (name, "spills registers")
"""


def test_gluon_kernel_compiles_for_sm90_without_spills():
    """The Gluon kernel compiles for sm_90 at TP-1 and TP-2 heads, both V tiles, both pool dtypes,
    with and without the error flag: wgmma, the cp.async ring, no spills, shared memory within an
    H200's (at V tile 64: within half an SM's, two CTAs an SM). Needs no GPU (a subprocess
    without the interpreter, Triton's bundled ptxas)."""
    import os

    from sm90_compile import ptxas_path, run_script
    if not os.path.exists(ptxas_path()):
        pytest.skip("this triton has no bundled ptxas")
    res = run_script(_COMPILE_SCRIPT)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# GPU tier (an H100 / H200: sm_90)
# ---------------------------------------------------------------------------------------------

def _inputs(T, HK, HV, gpu, seed):
    """test_chunk's inputs with q, k, v contiguous (its packed rows of 2 HK K + HV V + 5 elements
    are not 16-byte aligned, which the Gluon kernel's copies need; real qkv layouts are)."""
    q, k, v, *rest = make_inputs(T, HK, HV, 128, 128, torch.bfloat16, gpu, seed=seed)
    return (q.contiguous(), k.contiguous(), v.contiguous(), *rest)


def _batch(gpu, seqs, HK, HV, B, pool_dtype, seed, num_slots=96, drop=()):
    inputs = _inputs(sum(L for L, _ in seqs) + 40, HK, HV, gpu, seed)
    pool0 = make_pool(num_slots, HV, 128, 128, pool_dtype, gpu)
    reads, writes, ckpts = plan(seqs, B, num_slots, random.Random(seed), drop=drop)
    seed_states(pool0, reads)
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B, device=gpu)
    return inputs, pool0, meta


def _nan_workspace(T, HK, HV, device):
    """A workspace whose every buffer holds NaN: a kernel that read an entry no kernel of this call
    wrote (a P the intra kernel skipped, a row outside a span) would put NaN in the outputs."""
    ws = ChunkWorkspace(T, HV, 128, 128, torch.bfloat16, device, HK=HK)
    for buf in (ws.t, ws.p, ws.g, ws.qs, ws.kn):
        buf.fill_(float("nan"))
    return ws


def _run(inputs, pool0, meta, config, flag=None):
    pool = pool0.clone()
    T, HK = inputs[0].shape[:2]
    HV = inputs[2].shape[1]
    out = torch.full((T, HV, 128), float("nan"), dtype=torch.bfloat16, device=pool.device)
    gdn_chunk_prefill(*inputs, pool, meta, out=out, config=config, error_flag=flag,
                      workspace=_nan_workspace(T, HK, HV, pool.device))
    torch.cuda.synchronize()
    return out, pool


def _same(a, b):
    return torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))


@pytest.mark.gpu
@pytest.mark.parametrize("HK,HV", [(16, 32), (8, 16)])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_gpu_gluon_gives_the_triton_bits(gpu, HK, HV, pool_dtype):
    """Outputs (padding rows included) and every slot, written or not, equal the Triton kernel's
    bit for bit, for both V tiles: starts mid-chunk and mid-block, read slots, a dropped
    checkpoint, spans of 1 to 2,049 tokens, a sequence of many blocks."""
    seqs = [(300, 0), (1000, 320), (64, 100), (2049, 512), (1, 7), (130, 256), (4096, 0), (77, 37)]
    inputs, pool0, meta = _batch(gpu, seqs, HK, HV, 256, pool_dtype, seed=11, drop={(3, 1)})
    assert gluon_seq_supported(inputs[2], 128)
    ref = _run(inputs, pool0, meta, MANY_SEQS_CONFIG)
    for cfg in (GLUON_CONFIG, GLUON_128):
        got = _run(inputs, pool0, meta, cfg)
        assert torch.equal(got[0], ref[0]), (cfg, "outputs differ")
        assert _same(got[1], ref[1]), (cfg, "pool differs")


@pytest.mark.gpu
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_gpu_warm_on_triton_equals_cold_on_gluon(gpu, pool_dtype):
    """A cold batch of eight prefills takes the Gluon kernel by default (8 x 32 pairs); one of its
    requests resumed alone from a block checkpoint takes the Triton kernel; the warm run's outputs
    and final state equal the cold run's bit for bit."""
    HK, HV, B = 16, 32, 256
    seqs = [(2048 + 37 * i, 0) for i in range(8)]
    inputs, pool0, meta = _batch(gpu, seqs, HK, HV, B, pool_dtype, seed=5, num_slots=128)
    v = inputs[2]
    assert chunk_config(8, torch.bfloat16, HV, gluon_seq_supported(v, 128)) == GLUON_CONFIG
    out_c, pool_c = _run(inputs, pool0, meta, None)
    i, cut = 3, 1024  # request 3, resumed at its fourth block boundary
    c0 = sum(L for L, _ in seqs[:i])
    L = seqs[i][0]
    e = cut // B - 1
    ck_slot = int(meta.ckpt_slots[int(meta.ckpt_offsets[i]) + e])
    w_slot = int(meta.write_slot[i])
    warm_in = tuple(t[c0 + cut:c0 + L] for t in inputs[:5]) + inputs[5:]
    pool_w = pool_c.clone()
    pool_w[w_slot] = float("nan")
    meta_w = chunk_meta([L - cut], [cut], [ck_slot], [w_slot], [[-1] * num_checkpoints(cut, L - cut, B)],
                        B, device=gpu)
    assert chunk_config(1, torch.bfloat16, HV, True) != GLUON_CONFIG
    out_w = gdn_chunk_prefill(*warm_in, pool_w, meta_w)
    torch.cuda.synchronize()
    assert torch.equal(out_w, out_c[c0 + cut:c0 + L])
    assert torch.equal(pool_w[w_slot], pool_c[w_slot])


@pytest.mark.gpu
def test_gpu_gluon_bad_slots_repaired_like_triton(gpu):
    """Slots outside [-1, num_slots) are neither read nor written and set ERR_SLOT, as in the
    Triton kernel: the same flag, outputs and pool."""
    HK, HV, B = 8, 16, 128
    seqs = [(500, 0), (300, 128), (200, 64), (640, 0)] * 2
    inputs, pool0, meta = _batch(gpu, seqs, HK, HV, B, torch.float32, seed=9, num_slots=64)
    meta.read_slot[1] = 10_000
    meta.write_slot[2] = -5
    meta.ckpt_slots[int(meta.ckpt_offsets[3])] = 64
    res = {}
    for cfg in (MANY_SEQS_CONFIG, GLUON_CONFIG):
        flag = torch.zeros(1, dtype=torch.int32, device=gpu)
        res[cfg] = (*_run(inputs, pool0, meta, cfg, flag), int(flag.item()))
    (o1, p1, f1), (o2, p2, f2) = res.values()
    assert f1 == f2 == ERR_SLOT
    assert torch.equal(o1, o2) and _same(p1, p2)


@pytest.mark.gpu
def test_gpu_gluon_graph_replay_matches_eager(gpu):
    """Captured once with the Gluon config at static bounds, replayed on two batches (new metadata
    copied into the persistent buffers): each replay gives the eager run's bits."""
    from gdn_graphs.ops.meta import host_chunk_meta, max_chunks_bound, max_ckpts_bound
    HK, HV, B, max_tokens, max_seqs, num_slots = 16, 32, 256, 32768, 16, 256
    maxima = dict(max_seqs=max_seqs, max_chunks=max_chunks_bound(max_tokens, max_seqs),
                  max_ckpts=max_ckpts_bound(max_tokens, max_seqs, B))
    inputs = _inputs(max_tokens, HK, HV, gpu, 30)
    static_in = [t.clone() for t in inputs[:5]]
    A_log, dt_bias = inputs[5], inputs[6]
    pool = make_pool(num_slots, HV, 128, 128, torch.float32, gpu)
    ws = ChunkWorkspace(max_tokens, HV, 128, 128, torch.bfloat16, gpu)
    out = torch.zeros(max_tokens, HV, 128, dtype=torch.bfloat16, device=gpu)
    meta = chunk_meta([64], [0], [-1], [0], [[]], B, device=gpu, **maxima)

    def load(seqs, rng):
        reads, writes, ckpts = plan(seqs, B, num_slots, rng)
        lst = host_chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B, **maxima)
        for name, vals in lst.items():
            getattr(meta, name).copy_(torch.tensor(vals, dtype=torch.int32))

    def call():
        gdn_chunk_prefill(*static_in, A_log, dt_bias, pool, meta, out=out, workspace=ws, config=GLUON_CONFIG)

    rng = random.Random(3)
    load([(2048, 0)] * 8, rng)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()  # compiles
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    gen = torch.Generator(device=gpu).manual_seed(0)
    for seqs in ([(2048, 0)] * 8, [(5000, 256), (1, 0), (3000, 1000), (700, 37)] * 3):
        for t in static_in:
            t.copy_(torch.randn(t.shape, generator=gen, device=gpu).to(t.dtype))
        pool0 = 0.1 * torch.randn(pool.shape, generator=gen, device=gpu)
        load(seqs, rng)
        pool.copy_(pool0)
        out.fill_(float("nan"))
        call()
        eager_out, eager_pool = out.clone(), pool.clone()
        pool.copy_(pool0)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out) and torch.equal(pool, eager_pool)
