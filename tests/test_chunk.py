"""gdn_chunk_prefill (chunked prefill with block checkpoints) against reference.gdn_recurrent_ref.

Tolerances are relative, ||x - ref|| / ||ref||, per sequence (outputs) and per stored state:
    fp32 inputs, fp32 pool:  1e-5 (the interpreter runs fp32 dots; measured <= 1e-6)
    bf16 inputs:             1.5e-2 on outputs and states (bf16 tensor-core operands with fp32
                             accumulation, emulated exactly on the CPU; measured ~4e-3)
    GPU tier, fp32 inputs ("tf32x3" dots): 1e-4
Every pool test checks the outputs of live tokens (padding tokens: exactly zero), every slot
written (final state and each checkpoint, against the reference state after that many tokens), and
that every other slot is bit-identical to before. Warm == cold and chunked steps == one step are
checked bit for bit (torch.equal).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.chunk import ChunkConfig, ChunkWorkspace, gdn_chunk_prefill
from gdn_graphs.ops.meta import chunk_meta, num_checkpoints, num_chunks
from gdn_graphs.ops.reference import gdn_recurrent_ref
from helpers import bits, rel

TOL = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2}


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def make_inputs(T, HK, HV, K, V, dtype, device, seed=0):
    """q, k, v as strided views of one packed [T, 2*HK*K + HV*V + 5] tensor (token stride larger
    than the content), a and b as views of one [T, 2*HV + 3] tensor. Decays are mild on some heads
    (the state carries across many chunks) and strong on others."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    qkv = rnd(T, 2 * HK * K + HV * V + 5).to(dtype).to(device)
    q = qkv[:, :HK * K].unflatten(1, (HK, K))
    k = qkv[:, HK * K:2 * HK * K].unflatten(1, (HK, K))
    v = qkv[:, 2 * HK * K:2 * HK * K + HV * V].unflatten(1, (HV, V))
    ab = rnd(T, 2 * HV + 3).to(dtype).to(device)
    a, b = ab[:, :HV], ab[:, HV:2 * HV]
    A_log = torch.linspace(-4.0, 0.5, HV).float().to(device)
    dt_bias = (0.5 * rnd(HV)).float().to(device)
    return q, k, v, a, b, A_log, dt_bias


def make_pool(num_slots, HV, V, K, dtype, device, pad=8):
    """A pool of NaN (poison) whose slot stride exceeds a state by ``pad`` elements."""
    buf = torch.full((num_slots, HV * V * K + pad), float("nan"), dtype=dtype, device=device)
    return buf[:, :HV * V * K].unflatten(1, (HV, V, K))


def plan(seqs, B, num_slots, rng, drop=()):
    """Slots by the README's block arithmetic from a random block table per sequence: read table[(n-1)//B]
    (-1 when n == 0), write table[(n+q-1)//B], checkpoint p -> table[p//B - 1]. Indices in
    ``drop`` = (seq, e) get checkpoint slot -1. Distinct sequences use distinct slots."""
    free = list(range(num_slots))
    rng.shuffle(free)
    reads, writes, ckpts = [], [], []
    for i, (q, n) in enumerate(seqs):
        table = [free.pop() for _ in range((n + q - 1) // B + 1)]
        reads.append(table[(n - 1) // B] if n > 0 else NO_SLOT)
        writes.append(table[(n + q - 1) // B])
        ck = [table[n // B + e] for e in range(num_checkpoints(n, q, B))]  # p_e // B - 1
        ckpts.append([NO_SLOT if (i, e) in drop else s for e, s in enumerate(ck)])
    return reads, writes, ckpts


def seed_states(pool, reads, scale=0.5, seed=2):
    gen = torch.Generator().manual_seed(seed)
    for s in reads:
        if s >= 0:
            pool[s] = (scale * torch.randn(pool.shape[1:], generator=gen)).to(pool.dtype).to(pool.device)


def check_batch(seqs, B, reads, writes, ckpts, inputs, out, before, after, tol, scale=None):
    """Outputs and every written slot vs the fp64 reference; padding rows zero; the rest of the
    pool bit-identical."""
    q, k, v, a, b, A_log, dt_bias = inputs
    written, c = set(), 0
    for i, (L, n) in enumerate(seqs):
        sl = slice(c, c + L)
        c += L
        init = before[reads[i]] if reads[i] >= 0 else None
        o, S, states = gdn_recurrent_ref(q[sl], k[sl], v[sl], a[sl], b[sl], A_log, dt_bias,
                                         state=init, scale=scale, return_all_states=True)
        assert rel(out[sl], o) < tol, (i, L, n, rel(out[sl], o))
        if writes[i] >= 0:
            assert rel(after[writes[i]], S) < tol, (i, "final", rel(after[writes[i]], S))
            written.add(writes[i])
        for e, s in enumerate(ckpts[i]):
            if s >= 0:
                p = (n // B + 1 + e) * B
                err = rel(after[s], states[p - n - 1])
                assert err < tol, (i, "ckpt", p, err)
                written.add(s)
    assert torch.equal(out[c:], torch.zeros_like(out[c:])), "padding rows must be zero"
    for s in range(after.shape[0]):
        if s not in written:
            assert torch.equal(bits(after[s]), bits(before[s])), f"slot {s} changed"


def run(seqs, B, reads, writes, ckpts, inputs, pool, pad_tokens=0, maxima=None, **kw):
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B,
                      device=pool.device, **(maxima or {}))
    q, k, v, a, b, A_log, dt_bias = inputs
    T = sum(L for L, _ in seqs) + pad_tokens
    return gdn_chunk_prefill(q[:T], k[:T], v[:T], a[:T], b[:T], A_log, dt_bias, pool, meta, **kw)


# ---------------------------------------------------------------------------------------------
# CPU tier (also runs on a GPU)
# ---------------------------------------------------------------------------------------------

# (length, start) of each sequence: starts at 0, mid-chunk (37, 100, 5) and on block boundaries
BATCH = [(1, 0), (63, 37), (64, 100), (65, 128), (130, 0), (300, 5), (20, 37), (64, 256)]


@pytest.mark.parametrize("K,V,B", [(32, 32, 64), (16, 16, 128)])
def test_batch_vs_reference_fp32(device, K, V, B):
    HK, HV = 2, 4
    rng = random.Random(K + B)
    seqs = BATCH
    pad = 37
    inputs = make_inputs(sum(L for L, _ in seqs) + pad, HK, HV, K, V, torch.float32, device)
    pool = make_pool(80, HV, V, K, torch.float32, device)
    reads, writes, ckpts = plan(seqs, B, pool.shape[0], rng, drop={(4, 0), (5, 2)})
    # the aliasing cases happen by construction; make sure they are there
    assert any(r >= 0 and r in c for r, c in zip(reads, ckpts)), "need a checkpoint slot == read slot"
    assert any(r >= 0 and r == w for r, w in zip(reads, writes)), "need a write slot == read slot"
    seed_states(pool, reads)
    before = pool.clone()
    nck = sum(len(c) for c in ckpts)
    nch = sum(num_chunks(n, L) for L, n in seqs)
    maxima = dict(max_seqs=len(seqs) + 3, max_chunks=nch + 5, max_ckpts=nck + 2)
    ws = ChunkWorkspace(sum(L for L, _ in seqs) + pad + 11, HV, K, V, torch.float32, device)
    out = run(seqs, B, reads, writes, ckpts, inputs, pool, pad_tokens=pad, maxima=maxima, workspace=ws,
              config=ChunkConfig(bv=16))
    check_batch(seqs, B, reads, writes, ckpts, inputs, out, before, pool, TOL[torch.float32])


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_batch_vs_reference_bf16(device, pool_dtype):
    HK, HV, K, V, B = 2, 4, 32, 32, 64
    seqs = [(130, 0), (100, 37), (70, 128), (1, 5)]
    inputs = make_inputs(sum(L for L, _ in seqs), HK, HV, K, V, torch.bfloat16, device, seed=3)
    pool = make_pool(40, HV, V, K, pool_dtype, device)
    reads, writes, ckpts = plan(seqs, B, pool.shape[0], random.Random(5))
    seed_states(pool, reads)
    before = pool.clone()
    out = run(seqs, B, reads, writes, ckpts, inputs, pool)
    assert out.dtype == torch.bfloat16
    check_batch(seqs, B, reads, writes, ckpts, inputs, out, before, pool, TOL[torch.bfloat16])


def test_repeated_token_inverse(device):
    """One token repeated (k_t . k_s = 1, beta ~ 1, no decay) is the hard case for the in-chunk
    inverse: (I + A)^-1 then has entries of alternating sign that do not decay along a diagonal.
    The inverse must stay at fp32 accuracy there (random inputs hardly test it: an off-by-one in
    the forward substitution passed the other tests of this file and failed this one)."""
    HK, HV, K, V, B = 1, 2, 16, 16, 64
    seqs = [(150, 0), (70, 37)]
    T = sum(L for L, _ in seqs)
    q, k, v, a, b, A_log, dt_bias = make_inputs(T, HK, HV, K, V, torch.float32, device, seed=9)
    for t in (q, k, v):
        t.copy_(t[:1].expand_as(t))
    a.fill_(-30.0)  # softplus(-30 + dt_bias) ~ 1e-13: decay 1
    b.fill_(12.0)   # beta = sigmoid(12) ~ 1
    inputs = (q, k, v, a, b, A_log, dt_bias)
    pool = make_pool(20, HV, V, K, torch.float32, device)
    reads, writes, ckpts = plan(seqs, B, pool.shape[0], random.Random(2))
    seed_states(pool, reads)
    before = pool.clone()
    out = run(seqs, B, reads, writes, ckpts, inputs, pool)
    check_batch(seqs, B, reads, writes, ckpts, inputs, out, before, pool, TOL[torch.float32])


def test_odd_head_dims_scale_and_fp32_out(device):
    """K, V not powers of two, a custom scale, an fp32 output for bf16-free fp32 inputs."""
    HK, HV, K, V, B = 1, 3, 24, 40, 64
    seqs = [(70, 0), (90, 50)]
    inputs = make_inputs(160, HK, HV, K, V, torch.float32, device, seed=7)
    pool = make_pool(12, HV, V, K, torch.float32, device)
    reads, writes, ckpts = plan(seqs, B, pool.shape[0], random.Random(1))
    seed_states(pool, reads)
    before = pool.clone()
    out = run(seqs, B, reads, writes, ckpts, inputs, pool, scale=0.3)
    check_batch(seqs, B, reads, writes, ckpts, inputs, out, before, pool, TOL[torch.float32], scale=0.3)


def test_all_padding_batch(device):
    """No live sequence: every output row is zero and the pool is untouched."""
    HK, HV, K, V = 2, 4, 16, 16
    inputs = make_inputs(70, HK, HV, K, V, torch.float32, device)
    pool = make_pool(4, HV, V, K, torch.float32, device)
    before = pool.clone()
    meta = chunk_meta([], [], [], [], [], 64, device=device, max_seqs=2, max_chunks=3, max_ckpts=1)
    out = gdn_chunk_prefill(*inputs[:5], inputs[5], inputs[6], pool, meta)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(bits(pool), bits(before))


def _warm_vs_cold(device, dtype, pool_dtype, n0=37, L=300, B=64, HK=2, HV=4, K=32, V=32):
    """Cold: one prefill of L tokens from n0 with checkpoints. Warm: one batch that resumes from
    every checkpoint and prefills the rest. Everything must match the cold run bit for bit."""
    inputs = make_inputs(L, HK, HV, K, V, dtype, device, seed=11)
    q, k, v, a, b, A_log, dt_bias = inputs
    pool = make_pool(64, HV, V, K, pool_dtype, device)
    rng = random.Random(3)
    reads, writes, ckpts = plan([(L, n0)], B, pool.shape[0], rng)
    seed_states(pool, reads)
    cold_out = run([(L, n0)], B, reads, writes, ckpts, inputs, pool).clone()
    cold = pool.clone()
    bounds = [(n0 // B + 1 + e) * B for e in range(len(ckpts[0]))]
    assert len(bounds) >= 3
    # warm batch: sequence e starts at bounds[e] from the checkpoint, into fresh slots
    used = set(reads + writes + ckpts[0])
    free = [s for s in range(pool.shape[0]) if s not in used]
    seqs, w_reads, w_writes, w_ckpts, pieces = [], [], [], [], []
    for e, p in enumerate(bounds):
        seqs.append((n0 + L - p, p))
        w_reads.append(ckpts[0][e])
        w_writes.append(free.pop())
        w_ckpts.append([free.pop() for _ in range(num_checkpoints(p, n0 + L - p, B))])
        pieces.append(slice(p - n0, L))
    idx = torch.cat([torch.arange(s.start, s.stop) for s in pieces]).to(device)
    w_inputs = tuple(t[idx] for t in (q, k, v, a, b)) + (A_log, dt_bias)
    warm_out = run(seqs, B, w_reads, w_writes, w_ckpts, w_inputs, pool)
    c = 0
    for e, p in enumerate(bounds):
        n = L - (p - n0)
        assert torch.equal(warm_out[c:c + n], cold_out[p - n0:]), f"outputs after {p} differ"
        c += n
        assert torch.equal(bits(pool[w_writes[e]]), bits(cold[writes[0]])), f"final state from {p} differs"
        for e2, s in enumerate(w_ckpts[e]):
            assert torch.equal(bits(pool[s]), bits(cold[ckpts[0][e + 1 + e2]])), f"checkpoint from {p} differs"


@pytest.mark.parametrize("dtype,pool_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                              (torch.bfloat16, torch.bfloat16)])
def test_warm_equals_cold(device, dtype, pool_dtype):
    _warm_vs_cold(device, dtype, pool_dtype)


def _steps_vs_one_step(device, dtype, cuts, B, HK, HV, K, V, seed, plan_seed, pool_slots):
    """A prefill over [cuts[0], cuts[-1]) run as one step, then as steps between the cuts (each
    resuming from the previous step's final state): outputs, final state and every block
    checkpoint bit-identical."""
    n0, L = cuts[0], cuts[-1] - cuts[0]
    inputs = make_inputs(L, HK, HV, K, V, dtype, device, seed=seed)
    q, k, v, a, b, A_log, dt_bias = inputs
    pool = make_pool(pool_slots, HV, V, K, torch.float32, device)
    reads, writes, ckpts = plan([(L, n0)], B, pool.shape[0], random.Random(plan_seed))
    seed_states(pool, reads)
    before = pool.clone()
    one_out = run([(L, n0)], B, reads, writes, ckpts, inputs, pool).clone()
    one = pool.clone()
    pool.copy_(before)  # the one-step run put its first checkpoint into its read slot
    state, outs, state_at = reads[0], [], {}
    used = set(reads + writes + ckpts[0])
    free = [s for s in range(pool.shape[0]) if s not in used]
    for s0, s1 in zip(cuts, cuts[1:]):
        w = free.pop()
        ck = [free.pop() for _ in range(num_checkpoints(s0, s1 - s0, B))]
        state_at.update({(s0 // B + 1 + e) * B: c for e, c in enumerate(ck)})
        state_at[s1] = w  # a step that ends on a block boundary stores it as its final state
        sl = slice(s0 - n0, s1 - n0)
        step_inputs = tuple(t[sl] for t in (q, k, v, a, b)) + (A_log, dt_bias)
        outs.append(run([(s1 - s0, s0)], B, [state], [w], [ck], step_inputs, pool).clone())
        state = w
    assert torch.equal(torch.cat(outs), one_out)
    assert torch.equal(bits(pool[state]), bits(one[writes[0]]))
    for e, s_one in enumerate(ckpts[0]):
        assert torch.equal(bits(pool[state_at[(n0 // B + 1 + e) * B]]), bits(one[s_one]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_steps_equal_one_step(device, dtype):
    """A prefill split into steps at multiples of 64 (block boundary or not) equals one step."""
    # steps [37, 128) [128, 192) [192, 357): 128 is a block boundary, 192 only a chunk boundary
    _steps_vs_one_step(device, dtype, [37, 128, 192, 357], B=128, HK=2, HV=4, K=16, V=32,
                       seed=13, plan_seed=9, pool_slots=32)


def test_bad_inputs_raise(device):
    HK, HV, K, V = 2, 4, 16, 16
    q, k, v, a, b, A_log, dt_bias = make_inputs(70, HK, HV, K, V, torch.float32, device)
    pool = make_pool(4, HV, V, K, torch.float32, device)
    meta = chunk_meta([70], [0], [-1], [0], [[1]], 64, device=device)
    args = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm=pool, meta=meta)

    def bad(**over):
        with pytest.raises(ValueError):
            gdn_chunk_prefill(**{**args, **over})

    bad(q=q.double(), k=k.double(), v=v.double())                      # dtype
    bad(q=q.to(torch.int32))                                            # dtype
    bad(v=v.to(torch.bfloat16))                                         # mixed dtypes
    bad(q=q[:, :1], k=k[:, :1], v=v[:, :3])                             # HV % HK
    bad(v=v[:60])                                                       # T mismatch
    bad(k=k[:, :, :8])                                                  # shape
    bad(q=q.transpose(1, 2).contiguous().transpose(1, 2))               # last dim not contiguous
    bad(a=a[:, :2])                                                     # gate shape
    bad(A_log=A_log[:2])                                                # [HV]
    bad(ssm=pool.transpose(2, 3))                                       # pool layout
    bad(ssm=pool[:, :, :, :8])                                          # pool shape
    bad(meta=dataclasses.replace(meta, block_size=96))                  # block not a multiple of 64
    bad(meta=dataclasses.replace(meta, block_size=0))
    bad(meta=dataclasses.replace(meta, read_slot=meta.read_slot.long()))  # int32 metadata
    bad(out=torch.zeros(70, HV, V + 1, device=device))                  # out shape
    qkv = torch.zeros(70, (2 * HK * K + HV * V), device=device)         # out overlapping v
    vv = qkv[:, 2 * HK * K:].unflatten(1, (HV, V))
    with pytest.raises(ValueError, match="out must not overlap"):  # (q's range spans v's rows)
        gdn_chunk_prefill(**{**args, "q": qkv[:, :HK * K].unflatten(1, (HK, K)),
                             "k": qkv[:, HK * K:2 * HK * K].unflatten(1, (HK, K)), "v": vv, "out": vv})
    bad(workspace=ChunkWorkspace(69, HV, K, V, torch.float32, device))  # too small
    bad(workspace=ChunkWorkspace(70, HV, K, V, torch.bfloat16, device))  # wrong dtype
    with pytest.raises(ValueError):
        ChunkWorkspace(70, HV, K, V, torch.float64, device)


_COMPILE_SCRIPT = r"""
import torch
from gdn_graphs.constants import CHUNK
from gdn_graphs.ops import chunk as C
from sm90_compile import compile_sm90, ptxas_report

HK, HV, K, V = 16, 32, 128, 128
cfg = C.DEFAULT_CONFIG
common = dict(HK=HK, HV=HV, K=K, V=V, BK=K, BC=CHUNK, DOT_PREC="tf32", INTERPRET=False)
kernels = [
    (C._chunk_intra_kernel, dict(common, BVF=V, INV_PREC="tf32"), cfg.warps_intra,
     dict(a="*bf16", b="*bf16", A_log="*fp32", dt_bias="*fp32", g_ws="*fp32", scale="fp32")),
    (C._chunk_seq_kernel, dict(common, BV=cfg.bv, NUM_STAGES=cfg.stages_for(torch.bfloat16), ROUND_STATE=False),
     cfg.warps_seq, dict(g_ws="*fp32", ssm="*fp32")),
]
meta = {"cu_seqlens", "start_pos", "chunk_seq", "chunk_idx", "read_slot", "write_slot",
        "ckpt_offsets", "ckpt_slots", "error_flag"}
ints = ("T", "max_seqs", "max_chunks", "max_ckpts", "num_slots", "block_size")


def divisible(name, ty):  # what the launcher specialises on a GPU
    return ty.startswith("*") or name.startswith("s_") or name == "block_size"


# with the error flag (every engine step carries one) and without (direct calls)
for (heur, base, warps, special), has_flag in [(k, f) for k in kernels for f in (True, False)]:
    fn = heur.fn  # the JITFunction under @triton.heuristics
    ck = compile_sm90(fn, base, special, meta, ints, has_flag, warps, divisible)
    name = f"{fn.__name__} (flag: {has_flag})"
    assert ck.metadata.shared <= 227 * 1024, (name, ck.metadata.shared)
    if fn is C._chunk_seq_kernel.fn:
        assert "async_copy_global_to_local" in ck.asm["ttgir"], "chunk loop not software-pipelined"
    assert "warp_group_dot" in ck.asm["ttgir"], (name, "no wgmma")
    assert ("atom" in ck.asm["ptx"]) == has_flag, (name, "the flag's atomic")
    regs, spills = ptxas_report(ck)
    print(name, "regs", regs, "spill stores", spills, "shared", ck.metadata.shared)
    assert max(spills) == 0, (name, "spills registers")
"""


def test_kernels_compile_for_sm90_without_spills():
    """The GPU path (tl.range pipelining, bf16 wgmma, no interpreter shims) compiles for an H200
    (sm_90) at the real shapes with the default config: software-pipelined chunk loop, wgmma, no
    register spills, shared memory within the limit. Needs no GPU (a subprocess without the
    interpreter, Triton's bundled ptxas)."""
    import os

    from sm90_compile import ptxas_path, run_script
    if not os.path.exists(ptxas_path()):
        pytest.skip("this triton has no bundled ptxas")
    res = run_script(_COMPILE_SCRIPT)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# GPU tier: real shapes (HK 16, HV 32, K = V = 128, bf16 inputs, fp32 pool)
# ---------------------------------------------------------------------------------------------

GPU_DIMS = dict(HK=16, HV=32, K=128, V=128)


@pytest.mark.gpu
def test_gpu_vs_reference(gpu):
    HK, HV, K, V = GPU_DIMS.values()
    B = 256
    # short sequences are checked against the (slow) fp64 reference; a long one rides along and
    # must not disturb them
    seqs = [(1, 0), (63, 37), (200, 100), (700, 256), (333, 0), (16384, 0)]
    pad = 100
    inputs = make_inputs(sum(L for L, _ in seqs) + pad, HK, HV, K, V, torch.bfloat16, gpu, seed=21)
    pool = make_pool(200, HV, V, K, torch.float32, gpu)
    reads, writes, ckpts = plan(seqs, B, pool.shape[0], random.Random(4), drop={(3, 1)})
    seed_states(pool, reads)
    before = pool.clone()
    out = run(seqs, B, reads, writes, ckpts, inputs, pool, pad_tokens=pad,
              maxima=dict(max_seqs=8, max_chunks=400, max_ckpts=80))
    torch.cuda.synchronize()
    # the fp64 reference for the short ones; the long one: finite (warm == cold covers it)
    q, k, v, a, b, A_log, dt_bias = inputs
    c, written = 0, set()
    for i, (L, n) in enumerate(seqs):
        sl = slice(c, c + L)
        c += L
        written |= {writes[i], *[s for s in ckpts[i] if s >= 0]}
        if L > 1000:
            assert torch.isfinite(out[sl]).all() and torch.isfinite(pool[writes[i]]).all()
            continue
        init = before[reads[i]] if reads[i] >= 0 else None
        o, S, st = gdn_recurrent_ref(q[sl], k[sl], v[sl], a[sl], b[sl], A_log, dt_bias, state=init,
                                     return_all_states=True)
        assert rel(out[sl], o) < TOL[torch.bfloat16], (i, rel(out[sl], o))
        assert rel(pool[writes[i]], S) < TOL[torch.bfloat16], (i, rel(pool[writes[i]], S))
        for e, s in enumerate(ckpts[i]):
            if s >= 0:
                p = (n // B + 1 + e) * B
                assert rel(pool[s], st[p - n - 1]) < TOL[torch.bfloat16], (i, p)
    assert torch.equal(out[c:], torch.zeros_like(out[c:]))
    for s in range(pool.shape[0]):
        if s not in written:
            assert torch.equal(bits(pool[s]), bits(before[s])), s


@pytest.mark.gpu
def test_gpu_fp32_vs_reference(gpu):
    HK, HV, K, V = GPU_DIMS.values()
    seqs = [(130, 0), (200, 37)]
    inputs = make_inputs(330, HK, HV, K, V, torch.float32, gpu, seed=22)
    pool = make_pool(16, HV, V, K, torch.float32, gpu)
    reads, writes, ckpts = plan(seqs, 64, pool.shape[0], random.Random(6))
    seed_states(pool, reads)
    before = pool.clone()
    out = run(seqs, 64, reads, writes, ckpts, inputs, pool)
    check_batch(seqs, 64, reads, writes, ckpts, inputs, out, before, pool, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_gpu_warm_equals_cold(gpu, pool_dtype):
    _warm_vs_cold(gpu, torch.bfloat16, pool_dtype, n0=100, L=8192 + 300, B=1024, **GPU_DIMS)


@pytest.mark.gpu
def test_gpu_chunked_steps_equal_one_step(gpu):
    _steps_vs_one_step(gpu, torch.bfloat16, [37, 512, 512 + 320, 2048 + 64, 4037], B=256,
                       **GPU_DIMS, seed=23, plan_seed=2, pool_slots=64)


@pytest.mark.gpu
def test_gpu_graph_replay_matches_eager(gpu):
    """Capture once at static upper bounds, replay three different batches (new metadata and
    inputs copied into the persistent buffers), each bit-identical to an eager run."""
    HK, HV, K, V = GPU_DIMS.values()
    B, max_tokens, max_seqs, num_slots = 256, 65536, 8, 320
    from gdn_graphs.ops.meta import host_chunk_meta, max_chunks_bound, max_ckpts_bound
    maxima = dict(max_seqs=max_seqs, max_chunks=max_chunks_bound(max_tokens, max_seqs),
                  max_ckpts=max_ckpts_bound(max_tokens, max_seqs, B))
    inputs = make_inputs(max_tokens, HK, HV, K, V, torch.bfloat16, gpu, seed=30)
    static_in = [t.clone() for t in inputs[:5]]  # persistent (contiguous) input buffers
    A_log, dt_bias = inputs[5], inputs[6]
    pool = make_pool(num_slots, HV, V, K, torch.float32, gpu)
    pool.copy_(0.1 * torch.randn(pool.shape, device=gpu))
    ws = ChunkWorkspace(max_tokens, HV, K, V, torch.bfloat16, gpu)
    out = torch.zeros(max_tokens, HV, V, dtype=torch.bfloat16, device=gpu)

    def host_lists(seqs, rng):
        reads, writes, ckpts = plan(seqs, B, num_slots, rng)
        return host_chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B, **maxima)

    batches = [[(8192, 0)], [(16384, 0)] * 4, [(2048, 100), (5000, 256), (1, 0), (3000, 1000), (700, 37)]]
    rng = random.Random(8)
    lists = [host_lists(s, rng) for s in batches]
    meta = chunk_meta([64], [0], [-1], [0], [[]], B, device=gpu, **maxima)  # persistent buffers

    def load(lst):
        for name, vals in lst.items():
            getattr(meta, name).copy_(torch.tensor(vals, dtype=torch.int32))

    def call():
        gdn_chunk_prefill(*static_in, A_log, dt_bias, pool, meta, out=out, workspace=ws)

    load(lists[0])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()  # warm-up (compiles)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    gen = torch.Generator(device=gpu).manual_seed(0)
    for lst in lists:
        for t in static_in:
            t.copy_(torch.randn(t.shape, generator=gen, device=gpu).to(t.dtype))
        pool0 = 0.1 * torch.randn(pool.shape, generator=gen, device=gpu)
        load(lst)
        pool.copy_(pool0)
        out.fill_(float("nan"))
        call()
        eager_out, eager_pool = out.clone(), pool.clone()
        pool.copy_(pool0)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out)
        assert torch.equal(pool, eager_pool)
        live = lst["cu_seqlens"][-1]
        assert torch.isfinite(out[:live].float()).all()
        assert torch.equal(out[live:], torch.zeros_like(out[live:]))


def test_chunk_config_refuses_unvalidated_knobs():
    for bad in (dict(stages=1), dict(bv=8), dict(bv=128), dict(warps_seq=16), dict(warps_intra=2),
                dict(dot_precision="fp64")):
        with pytest.raises(ValueError):
            ChunkConfig(**bad)
    assert ChunkConfig().stages_for(torch.bfloat16) == 3 and ChunkConfig().bv == 32
    assert ChunkConfig().stages_for(torch.float32) == 2  # 3 stages of fp32 tiles exceed shared memory


@pytest.mark.gpu
def test_gpu_every_accepted_config_matches_default(gpu):
    """Every launch config ChunkConfig accepts computes what the default computes, bit for bit
    (outputs and stored states), on a batch with mid-chunk starts and checkpoints."""
    import itertools
    HK, HV, K, V = GPU_DIMS.values()
    B = 128
    seqs = [(1000, 0), (300, 37), (129, 256), (2, 63)]
    inputs = make_inputs(sum(L for L, _ in seqs), HK, HV, K, V, torch.bfloat16, gpu, seed=40)
    pool0 = make_pool(64, HV, V, K, torch.float32, gpu)
    reads, writes, ckpts = plan(seqs, B, pool0.shape[0], random.Random(5))
    seed_states(pool0, reads)
    meta = chunk_meta([L for L, _ in seqs], [n for _, n in seqs], reads, writes, ckpts, B, device=gpu)
    results = {}
    for bv, ws, st, wi in itertools.product((16, 32, 64), (4, 8), (None, 2, 3), (4, 8)):
        cfg = ChunkConfig(bv=bv, warps_seq=ws, stages=st, warps_intra=wi)
        pool = pool0.clone()
        out = gdn_chunk_prefill(*inputs, pool, meta, config=cfg)
        torch.cuda.synchronize()
        results[cfg] = (out, pool)
    ref_out, ref_pool = results[ChunkConfig()]
    bad = [c for c, (o, p) in results.items()
           if not (torch.equal(o, ref_out) and torch.equal(p.nan_to_num(7.0), ref_pool.nan_to_num(7.0)))]
    assert not bad, f"configs that differ from the default: {bad}"


def test_chunk_config_by_sequence_count():
    """Several prefill sequences with 16-bit inputs get the wider V tile; at most 16 (sequence,
    value head) pairs the narrower one; one sequence with more heads or unknown heads, an unknown
    count (a graph template) and fp32 inputs keep the default (bit-identical either way: the GPU
    test above)."""
    from gdn_graphs.ops.workspace import FEW_PAIRS_CONFIG, MANY_SEQS_CONFIG, chunk_config
    bf16 = torch.bfloat16
    assert MANY_SEQS_CONFIG.bv == 64 and MANY_SEQS_CONFIG != ChunkConfig()
    assert FEW_PAIRS_CONFIG.bv == 16
    assert chunk_config(None, bf16) == chunk_config(1, bf16) == chunk_config(0, bf16) == ChunkConfig()
    assert chunk_config(1, bf16, 32) == chunk_config(None, bf16, 16) == ChunkConfig()
    assert chunk_config(1, bf16, 16) == chunk_config(1, torch.float16, 8) == FEW_PAIRS_CONFIG
    assert chunk_config(2, bf16, 8) == FEW_PAIRS_CONFIG                 # 16 pairs
    assert chunk_config(2, bf16) == chunk_config(64, torch.float16) == chunk_config(2, bf16, 16) \
        == chunk_config(3, bf16, 8) == MANY_SEQS_CONFIG
    assert chunk_config(8, torch.float32) == chunk_config(1, torch.float32, 16) == ChunkConfig()
