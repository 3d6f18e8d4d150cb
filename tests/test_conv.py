"""Causal conv1d over a conv-state pool (gdn_graphs/ops/conv.py) against ops/reference.py.

CPU tier: the Triton interpreter on small awkward shapes (C = 24 or 40, W = 2, 3, 4, 6), fp64
reference, relative error ||y - ref|| / ||ref|| below 1e-5 (fp32 outputs) or 1e-2 (bf16 outputs).
Windows are copies of inputs, so every stored window must equal the reference exactly, and every
byte of the pool that no window should touch (other slots, page padding) must be unchanged: pools
are compared bit for bit against the expected pool, and start out NaN except for the slots that
are read, so any stray read shows up in the outputs too.

GPU tier (marker ``gpu``): Qwen3-Next's conv (C = 8192, W = 4, bf16), a batch of prefills of 16k
tokens with checkpoints at every 64-token block against the reference, and CUDA-graph capture at
static upper bounds replayed over different batches, bit-identical to eager runs.
"""

from __future__ import annotations

import random

import pytest
import torch

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.conv import conv_decode, conv_prefill
from gdn_graphs.ops.meta import (
    ChunkMeta, chunk_meta, host_chunk_meta, max_chunks_bound, max_ckpts_bound,
)
from gdn_graphs.ops.reference import causal_conv1d_ref
from helpers import assert_bits_equal, rel

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
f32, bf16 = torch.float32, torch.bfloat16


# --------------------------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------------------------- #


def make_pool(num_slots, C, W, dtype, device, pad=5):
    """A pool whose slot stride exceeds C*(W-1) by ``pad`` (as vLLM pads pages), all NaN.
    Returns (pool view [num_slots, C, W-1], base [num_slots, C*(W-1)+pad])."""
    base = torch.full((num_slots, C * (W - 1) + pad), float("nan"), dtype=dtype, device=device)
    return base[:, :C * (W - 1)].view(num_slots, C, W - 1), base


def pool_view(base, C, W):
    return base[:, :C * (W - 1)].view(base.shape[0], C, W - 1)


def assert_pool(base, exp, x_dtype, what):
    """Bit-identical pools, except where windows are rounded to a pool dtype narrower than x:
    the GPU rounds to nearest even like torch, the Triton interpreter truncates, so those are
    compared to within one bf16 ulp (NaN poison still has to match)."""
    if torch.finfo(base.dtype).bits >= torch.finfo(x_dtype).bits:
        assert_bits_equal(base, exp, what)
    else:
        torch.testing.assert_close(base.float(), exp.float(), rtol=2 ** -7, atol=0, equal_nan=True,
                                   msg=what)


def rand_rows(T, C, dtype, device, gen, extra=8):
    """x [T, C] with a row stride of C + extra (a slice of a wider projection output)."""
    wide = torch.randn(T, C + extra, generator=gen, device="cpu").to(device=device, dtype=dtype)
    return wide[:, 3:3 + C]


def block_slots(n, q, B, table):
    """Slots by the design's block arithmetic: read table[(n-1)//B], write table[(n+q-1)//B],
    the state after every multiple p of B inside (n, n+q) in table[p//B - 1]."""
    read = table[(n - 1) // B] if n > 0 else NO_SLOT
    ckpts = [table[p // B - 1] for p in range((n // B + 1) * B, n + q, B)]
    return read, table[(n + q - 1) // B], ckpts


def expected_prefill(x, weight, bias, base, C, W, B, seqs, activation, cu):
    """Reference outputs per sequence and the expected pool after the prefill (checkpoints in
    order, then the final window), starting from a copy of ``base``."""
    exp = base.clone()
    pv = pool_view(exp, C, W)
    pool_before = pool_view(base, C, W)
    ys = []
    for i, (n, q, rs, ws, ck) in enumerate(seqs):
        bos = cu[i]
        win = pool_before[rs] if rs >= 0 else None
        y, fin, wins = causal_conv1d_ref(x[bos:bos + q], weight, bias, win, activation,
                                         return_all_windows=True)
        ys.append(y)
        for e, s in enumerate(ck):
            p = (n // B + 1 + e) * B
            if s >= 0:
                pv[s] = wins[p - n - 1].to(exp.dtype)
        if ws >= 0:
            pv[ws] = fin.to(exp.dtype)
    return ys, exp


def run_prefill(x, weight, bias, pool_base, C, W, B, seqs, activation="silu", maxima=None,
                **kw):
    """Run conv_prefill on a copy of the pool; returns (y, pool_base_after, meta)."""
    lens = [q for (_, q, _, _, _) in seqs]
    meta = chunk_meta(lens, [n for (n, *_) in seqs], [s[2] for s in seqs], [s[3] for s in seqs],
                      [s[4] for s in seqs], B, device=x.device, **(maxima or {}))
    base = pool_base.clone()
    y = conv_prefill(x, weight, bias, pool_view(base, C, W), meta, activation=activation, **kw)
    return y, base, meta


def check_prefill(x, weight, bias, pool_base, C, W, B, seqs, activation="silu", maxima=None, **kw):
    y, base, _ = run_prefill(x, weight, bias, pool_base, C, W, B, seqs, activation, maxima, **kw)
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + s[1])
    ys, exp = expected_prefill(x, weight, bias, pool_base, C, W, B, seqs, activation, cu)
    assert y.dtype == x.dtype and y.shape == x.shape
    for i, (n, q, *_rest) in enumerate(seqs):
        err = rel(y[cu[i]:cu[i + 1]], ys[i])
        assert err < TOL[x.dtype], f"sequence {i} (n={n}, q={q}): rel err {err:.2e}"
    pad = y[cu[-1]:]
    assert torch.equal(pad, torch.zeros_like(pad)), "padding rows must be exactly zero"
    assert_pool(base, exp, x.dtype, "pool after prefill")
    return y, base


def batch_seqs(lens, starts, B, rng, first_slot=0):
    """Sequences (n, q, read, write, ckpts) with block tables drawn from a shuffled slot range.
    Returns (seqs, number of slots used, slots that are read)."""
    need = [(n + q - 1) // B + 1 for n, q in zip(starts, lens)]
    slots = list(range(first_slot, first_slot + sum(need)))
    rng.shuffle(slots)
    seqs, k = [], 0
    for n, q, m in zip(starts, lens, need):
        table = slots[k:k + m]
        k += m
        seqs.append((n, q, *block_slots(n, q, B, table)))
    return seqs, first_slot + sum(need)


def fill_read_slots(base, C, W, seqs, gen):
    pv = pool_view(base, C, W)
    for (_, _, rs, _, _) in seqs:
        if rs >= 0:
            pv[rs] = torch.randn(C, W - 1, generator=gen).to(base.dtype)


# --------------------------------------------------------------------------------------------- #
# decode
# --------------------------------------------------------------------------------------------- #


DECODE_CASES = [
    # C, W, x dtype, pool dtype, bias, N, activation, block_c
    (40, 4, f32, f32, True, 5, "silu", None),
    (24, 4, bf16, bf16, False, 5, "silu", 16),
    (40, 3, bf16, f32, True, 1, "silu", None),
    (24, 2, f32, f32, True, 5, None, None),
    (24, 4, f32, bf16, True, 5, "silu", 8),
    (40, 6, f32, f32, False, 5, "silu", 32),
]


@pytest.mark.parametrize("C,W,xdt,pdt,use_bias,N,act,block_c", DECODE_CASES)
def test_decode_matches_reference(device, C, W, xdt, pdt, use_bias, N, act, block_c):
    gen = torch.Generator().manual_seed(1000 + C + W + N)
    weight = torch.randn(C, W, generator=gen).to(device)
    bias = torch.randn(C, generator=gen).to(device) if use_bias else None
    x = rand_rows(N, C, xdt, device, gen)
    pool, base = make_pool(12, C, W, pdt, device)
    # (read, write): in place, moved, zero start, no store, padding.
    rows = [(7, 7), (2, 9), (NO_SLOT, 4), (5, NO_SLOT), (NO_SLOT, NO_SLOT)] if N == 5 else [(3, 10)]
    for rs, _ in rows:
        if rs >= 0:
            pool[rs] = torch.randn(C, W - 1, generator=gen).to(device=device, dtype=pdt)
    # Entries past N must be ignored: point them at slots nobody else touches.
    read = torch.tensor([r for r, _ in rows] + [0, 1], dtype=torch.int32, device=device)
    write = torch.tensor([w for _, w in rows] + [0, 1], dtype=torch.int32, device=device)
    before = base.clone()
    y = conv_decode(x, weight, bias, pool, read, write, activation=act, block_c=block_c)

    exp = before.clone()
    pv, pv0 = pool_view(exp, C, W), pool_view(before, C, W)
    for i, (rs, ws) in enumerate(rows):
        yr, fin = causal_conv1d_ref(x[i:i + 1], weight, bias, pv0[rs] if rs >= 0 else None, act)
        if rs < 0 and ws < 0:
            assert torch.equal(y[i], torch.zeros_like(y[i])), "padded row must output zeros"
        else:
            err = rel(y[i], yr[0])
            assert err < TOL[xdt], f"row {i}: rel err {err:.2e}"
        if ws >= 0:
            pv[ws] = fin.to(pdt)
    assert_pool(base, exp, xdt, "pool after decode")


def test_decode_in_place_on_x(device):
    """out may be x itself (each row reads its own x before storing)."""
    gen = torch.Generator().manual_seed(7)
    C, W = 40, 4
    weight = torch.randn(C, W, generator=gen).to(device)
    x = rand_rows(3, C, f32, device, gen)
    pool, _ = make_pool(4, C, W, f32, device)
    pool[1:3] = torch.randn(2, C, W - 1, generator=gen).to(device)
    slots = torch.tensor([1, NO_SLOT, 2], dtype=torch.int32, device=device)
    p2 = pool.clone()
    ref = conv_decode(x.clone(), weight, None, p2, slots, slots)
    out = conv_decode(x, weight, None, pool, slots, slots, out=x)
    assert out.data_ptr() == x.data_ptr()
    assert torch.equal(x, ref)


# --------------------------------------------------------------------------------------------- #
# prefill
# --------------------------------------------------------------------------------------------- #


LENS = [1, 2, 3, 63, 64, 65, 130, 300]
STARTS = [0, 37, 100, 128, 62, 63, 191, 256]

PREFILL_CASES = [
    # C, W, x dtype, pool dtype, bias, B, block_c, rotations of STARTS, activation, padded meta
    (40, 4, f32, f32, True, 64, None, (0, 4), "silu", False),
    (24, 4, bf16, bf16, False, 128, None, (1, 5), "silu", True),
    (40, 4, bf16, f32, True, 64, 16, (2, 6), "silu", False),
    (24, 4, f32, bf16, True, 64, None, (3, 7), None, True),
    (40, 3, f32, f32, True, 128, None, (1, 6), "silu", False),
    (24, 2, bf16, bf16, True, 64, None, (2, 5), "silu", False),
    (24, 6, f32, f32, False, 64, None, (0, 5), "silu", True),
]


@pytest.mark.parametrize("C,W,xdt,pdt,use_bias,B,block_c,rots,act,padded", PREFILL_CASES)
def test_prefill_matches_reference(device, C, W, xdt, pdt, use_bias, B, block_c, rots, act, padded):
    """Every length with several starts (0, mid-chunk, chunk end, block boundary), in batches of 8
    sequences; slots by block-table arithmetic, so checkpoint 0 is often the read slot and short
    sequences starting on a boundary have read != write."""
    gen = torch.Generator().manual_seed(C * 100 + W * 10 + B)
    rng = random.Random(C + W + B)
    weight = torch.randn(C, W, generator=gen).to(device)
    bias = torch.randn(C, generator=gen).to(device) if use_bias else None
    for rot in rots:
        starts = STARTS[rot:] + STARTS[:rot]
        seqs, used = batch_seqs(LENS, starts, B, rng)
        assert any(ck and ck[0] == rs for (_, _, rs, _, ck) in seqs) or B == 128
        _, base = make_pool(used + 3, C, W, pdt, device)
        fill_read_slots(base, C, W, seqs, gen)
        T = sum(LENS) + 11  # trailing padding rows
        x = rand_rows(T, C, xdt, device, gen)
        maxima = dict(max_seqs=11, max_chunks=60, max_ckpts=40) if padded else None
        check_prefill(x, weight, bias, base, C, W, B, seqs, act, maxima, block_c=block_c,
                      block_e=4 if padded else None)


def test_prefill_slot_corner_cases(device):
    """Hand-picked slots: a checkpoint equal to the read slot, a write slot equal to the read
    slot after crossing a boundary, short sequences (q < W-1) with read != write whose final window
    mixes initial-window entries and x, a sequence with n > 0 and no read slot, and -1 holes."""
    gen = torch.Generator().manual_seed(11)
    C, W, B = 24, 4, 64
    weight = torch.randn(C, W, generator=gen).to(device)
    bias = torch.randn(C, generator=gen).to(device)
    seqs = [
        (100, 300, 1, 2, [1, 3, NO_SLOT, 4, 5]),   # ckpt 0 (p = 128) into the read slot
        (126, 2, 6, 7, []),                         # short, read != write
        (127, 1, 8, 9, []),                         # shortest, ends on a boundary
        (63, 70, 10, 10, [11, 15]),                 # chunk 0 is one token; write == read
        (40, 30, NO_SLOT, 12, [13]),                # zero initial window mid-sequence
        (5, 2, 14, NO_SLOT, []),                    # nothing stored
    ]
    _, base = make_pool(16, C, W, bf16, device)
    fill_read_slots(base, C, W, seqs, gen)
    x = rand_rows(sum(s[1] for s in seqs) + 64, C, bf16, device, gen)
    check_prefill(x, weight, bias, base, C, W, B, seqs)


def test_prefill_padding_beyond_chunk_table(device):
    """x may hold many more padding rows than the chunk table's programs cover: all get zeros."""
    gen = torch.Generator().manual_seed(12)
    C, W = 40, 4
    weight = torch.randn(C, W, generator=gen).to(device)
    _, base = make_pool(2, C, W, f32, device)
    x = rand_rows(200, C, f32, device, gen)
    check_prefill(x, weight, None, base, C, W, 64, [(0, 5, NO_SLOT, 0, [])])


@pytest.mark.parametrize("dt,block_c,tail_from", [(bf16, 8, 16), (f32, 16, 32)])
def test_prefill_tail_out_same_bits(device, dt, block_c, tail_from):
    """tail_out: channels tail_from.. land in the second buffer with the bits a plain call puts
    in out (padding rows' zeros too), out's columns there stay untouched, the pool is the same."""
    gen = torch.Generator().manual_seed(21)
    rng = random.Random(21)
    C, W, B = 40, 4, 64
    weight = torch.randn(C, W, generator=gen).to(device)
    bias = torch.randn(C, generator=gen).to(device)
    seqs, used = batch_seqs([70, 1, 130, 3], [0, 63, 100, 128], B, rng)
    _, base = make_pool(used + 2, C, W, bf16, device)
    fill_read_slots(base, C, W, seqs, gen)
    x = rand_rows(sum(s[1] for s in seqs) + 9, C, dt, device, gen)
    T = x.shape[0]
    y, pool, meta = run_prefill(x, weight, bias, base, C, W, B, seqs, block_c=block_c)
    out = torch.full((T, C), float("nan"), dtype=dt, device=device)
    tail = torch.full((T + 5, C - tail_from + 3), float("nan"), dtype=dt, device=device)
    tail_view = tail[2:T + 2, 1:C - tail_from + 1]  # a row stride of its own
    pool2 = base.clone()
    r = conv_prefill(x, weight, bias, pool_view(pool2, C, W), meta, out=out, block_c=block_c,
                     tail_out=tail_view, tail_from=tail_from)
    assert r is out
    assert_bits_equal(out[:, :tail_from], y[:, :tail_from], "head channels")
    assert_bits_equal(tail_view, y[:, tail_from:], "tail channels")
    assert torch.isnan(out[:, tail_from:]).all(), "out's tail columns must stay untouched"
    assert torch.isnan(tail[:2]).all() and torch.isnan(tail[:, 0]).all(), "outside tail_out"
    assert_bits_equal(pool2, pool, "pool")


def _warm_vs_cold(device, C, dt, L, resumes, cuts, B=64, W=4, seed=5):
    """Cold: one request of L tokens from 0. Warm: requests resuming at the block boundaries
    ``resumes``, each from its checkpoint (one batch). Chained: steps between ``cuts`` (mid-chunk
    too), each continuing the previous step's final window. All bit-identical to the cold run."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(C, W, generator=gen).to(device)
    bias = torch.randn(C, generator=gen).to(device)
    x = rand_rows(L, C, dt, device, gen)
    nb = (L - 1) // B + 1
    table = list(range(nb))
    _, base = make_pool(nb * (len(resumes) + 1) + len(cuts), C, W, dt, device)
    cold_y, cold_base, _ = run_prefill(x, weight, bias, base, C, W, B,
                                       [(0, L, *block_slots(0, L, B, table))])
    cold_final = pool_view(cold_base, C, W)[table[-1]]

    seqs, xs = [], []
    for k, p in enumerate(resumes):
        assert p % B == 0
        t = table[:p // B] + list(range(nb * (k + 1), nb * (k + 1) + nb - p // B))
        seqs.append((p, L - p, *block_slots(p, L - p, B, t)))
        xs.append(x[p:])
    y, warm_base, _ = run_prefill(torch.cat(xs), weight, bias, cold_base, C, W, B, seqs)
    off = 0
    for (p, q, _, ws, _) in seqs:
        assert_bits_equal(y[off:off + q], cold_y[p:], f"warm outputs from {p}")
        assert_bits_equal(pool_view(warm_base, C, W)[ws], cold_final, f"final window from {p}")
        off += q

    cur, outs, prev = cold_base.clone(), [], NO_SLOT
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        ws = nb * (len(resumes) + 1) + k
        y, cur, _ = run_prefill(x[a:b].clone(), weight, bias, cur, C, W, B,
                                [(a, b - a, prev, ws, [NO_SLOT] * ((b - 1) // B - a // B))])
        outs.append(y)
        prev = ws
    assert_bits_equal(torch.cat(outs), cold_y, "chained outputs")
    assert_bits_equal(pool_view(cur, C, W)[prev], cold_final, "chained final window")


def _decode_vs_prefill(device, C, dt, n, B=64, W=4, seed=9):
    """Decoding token n + 1 after prefilling n gives the bits of prefilling n + 1 tokens."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(C, W, generator=gen).to(device)
    bias = torch.randn(C, generator=gen).to(device)
    x = rand_rows(n + 1, C, dt, device, gen)
    _, base = make_pool(2, C, W, dt, device)
    ck = [NO_SLOT] * ((n - 1) // B)
    ck_full = ck + [NO_SLOT] * (n % B == 0)
    y_full, _, _ = run_prefill(x, weight, bias, base, C, W, B, [(0, n + 1, NO_SLOT, 0, ck_full)])
    _, b2, _ = run_prefill(x[:n].clone(), weight, bias, base, C, W, B, [(0, n, NO_SLOT, 1, ck)])
    slot = torch.tensor([1], dtype=torch.int32, device=device)
    y_dec = conv_decode(x[n:n + 1], weight, bias, pool_view(b2, C, W), slot, slot)
    assert_bits_equal(y_dec[0], y_full[n], "decode vs prefill output")


@pytest.mark.parametrize("dt", [f32, bf16])
def test_warm_equals_cold(device, dt):
    _warm_vs_cold(device, 40, dt, 300, resumes=(64, 128, 256), cuts=(0, 100, 163, 300))


@pytest.mark.parametrize("n", [70, 128])
def test_decode_equals_prefill_token(device, n):
    _decode_vs_prefill(device, 24, bf16, n)


# --------------------------------------------------------------------------------------------- #
# bad input
# --------------------------------------------------------------------------------------------- #


def test_bad_input_raises(device):
    C, W = 24, 4
    x = torch.randn(6, C, device=device)
    xw = torch.randn(6, C + 1, device=device)
    w = torch.randn(C, W, device=device)
    b = torch.randn(C, device=device)
    pool = torch.zeros(4, C, W - 1, device=device)
    s = torch.zeros(6, dtype=torch.int32, device=device)
    meta = chunk_meta([6], [0], [NO_SLOT], [1], [[]], 64, device=device)

    bad_decode = [
        dict(x=x[:, :C - 1]),                                   # channel mismatch
        dict(x=x.t().contiguous().t()),                         # channels not contiguous
        dict(x=x.to(torch.int32)),
        dict(x=x[0]),                                            # 1-D
        dict(weight=torch.randn(C, 1, device=device)),           # W = 1
        dict(weight=torch.randn(C, 9, device=device)),           # W = 9
        dict(bias=torch.randn(C + 1, device=device)),
        dict(conv=torch.zeros(4, C, W, device=device)),          # wrong window length
        dict(conv=torch.zeros(4, C, W - 1, device=device, dtype=torch.int32)),
        dict(read_slot=s.long()),
        dict(write_slot=s[:5]),
        dict(out=torch.zeros(6, C, device=device, dtype=torch.bfloat16)),
        dict(out=torch.zeros(5, C, device=device)),
        dict(activation="relu"),
        dict(x=xw[:, :C], out=xw[:, 1:]),                        # overlaps x, not x itself
    ]
    for kw in bad_decode:
        args = dict(x=x, weight=w, bias=b, conv=pool, read_slot=s, write_slot=s)
        args.update(kw)
        with pytest.raises(ValueError):
            conv_decode(**args)

    bad_meta = ChunkMeta(**{**meta.__dict__, "block_size": 96})
    bad_meta2 = ChunkMeta(**{**meta.__dict__, "cu_seqlens": meta.cu_seqlens.long()})
    bad_meta3 = ChunkMeta(**{**meta.__dict__, "start_pos": torch.zeros(2, dtype=torch.int32, device=device)})
    bad_prefill = [
        dict(meta=bad_meta),
        dict(meta=bad_meta2),
        dict(meta=bad_meta3),
        dict(out=x),                                             # in place: halo race
        dict(out=torch.zeros(6, C, device=device).t().contiguous().t()),
        dict(weight=torch.randn(C, 1, device=device)),
        dict(conv=torch.zeros(4, C + 1, W - 1, device=device)),
        dict(activation="gelu"),
        dict(tail_out=torch.zeros(6, C - 8, device=device)),        # without tail_from
        dict(tail_out=torch.zeros(6, C - 12, device=device), tail_from=12, block_c=8),  # mid-tile
        dict(tail_out=torch.zeros(6, C - 8, device=device), tail_from=8, block_c=16),
        dict(tail_out=torch.zeros(5, C - 8, device=device), tail_from=8, block_c=8),    # rows
        dict(tail_out=torch.zeros(6, C - 8, device=device, dtype=torch.bfloat16), tail_from=8,
             block_c=8),
        dict(tail_out=torch.zeros(6, C, device=device)[:, 8:].t().contiguous().t(), tail_from=8,
             block_c=8),                                         # channels not contiguous
        dict(tail_out=x[:, 8:], tail_from=8, block_c=8),         # overlaps x
        dict(tail_out=torch.zeros(6, 0, device=device), tail_from=C, block_c=8),  # nothing left
    ]
    for kw in bad_prefill:
        args = dict(x=x, weight=w, bias=b, conv=pool, meta=meta)
        args.update(kw)
        with pytest.raises(ValueError):
            conv_prefill(**args)


# --------------------------------------------------------------------------------------------- #
# GPU tier
# --------------------------------------------------------------------------------------------- #


QWEN_C, QWEN_W = 8192, 4  # 2 * 16 * 128 + 32 * 128


def _gpu_batch(seed, B, lens, starts, first_slot=0):
    rng = random.Random(seed)
    return batch_seqs(lens, starts, B, rng, first_slot)


def _windows_from_inputs(xx, n, ck, B, W):
    """Checkpoint windows straight from xx = initial window ++ x (no [T, C, W-1] stack)."""
    out = []
    for e in range(len(ck)):
        p = (n // B + 1 + e) * B
        out.append(xx[p - n:p - n + W - 1].t())
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("B", [64, 128])
def test_gpu_prefill_16k_vs_reference(gpu, B):
    C, W, dt = QWEN_C, QWEN_W, bf16
    gen = torch.Generator().manual_seed(B)
    lens = [9000, 4000, 2000, 1000, 300, 65, 2, 1]
    starts = [0, 100, 128, 37, 63, 1000, 130, 5]
    seqs, used = _gpu_batch(B, B, lens, starts)
    weight = torch.randn(C, W, generator=gen).to(gpu)
    bias = torch.randn(C, generator=gen).to(gpu)
    _, base = make_pool(used + 3, C, W, dt, gpu, pad=24)
    fill_read_slots(base, C, W, seqs, gen)
    T = sum(lens) + 20
    x = rand_rows(T, C, dt, gpu, gen)
    out_base = base.clone()
    meta = chunk_meta(lens, starts, [s[2] for s in seqs], [s[3] for s in seqs],
                      [s[4] for s in seqs], B, device=gpu)
    y = conv_prefill(x, weight, bias, pool_view(out_base, C, W), meta)
    torch.cuda.synchronize()

    exp = base.clone()
    pv, pv0 = pool_view(exp, C, W), pool_view(base, C, W)
    bos = 0
    for (n, q, rs, ws, ck) in seqs:
        win = pv0[rs] if rs >= 0 else None
        yr, fin = causal_conv1d_ref(x[bos:bos + q], weight, bias, win)
        err = rel(y[bos:bos + q], yr)
        assert err < TOL[dt], f"n={n}, q={q}: rel err {err:.2e}"
        w0 = win.double() if win is not None else torch.zeros(C, W - 1, dtype=torch.float64, device=gpu)
        xx = torch.cat([w0.t(), x[bos:bos + q].double()])
        for s, wnd in zip(ck, _windows_from_inputs(xx, n, ck, B, W)):
            if s >= 0:
                pv[s] = wnd.to(dt)
        if ws >= 0:
            pv[ws] = fin.to(dt)
        bos += q
    assert torch.equal(y[bos:], torch.zeros_like(y[bos:]))
    assert_bits_equal(out_base, exp, "pool after 16k prefill")


@pytest.mark.gpu
def test_gpu_prefill_cuda_graph_replay(gpu):
    C, W, dt, B = QWEN_C, QWEN_W, bf16, 64
    T_max, S_max = 16384, 8
    max_chunks = max_chunks_bound(T_max, S_max)
    max_ckpts = max_ckpts_bound(T_max, S_max, B)
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(C, W, generator=gen).to(gpu)
    bias = torch.randn(C, generator=gen).to(gpu)
    num_slots = T_max // B + 2 * S_max + 8
    pool, base0 = make_pool(num_slots, C, W, dt, gpu, pad=8)
    base0.copy_(torch.randn(base0.shape, generator=gen).to(gpu, dt))  # every slot readable
    base = base0.clone()
    x_buf = torch.zeros(T_max, C, dtype=dt, device=gpu)
    out_buf = torch.zeros(T_max, C, dtype=dt, device=gpu)
    empty = host_chunk_meta([1], [0], [NO_SLOT], [NO_SLOT], [[]], B, max_seqs=S_max,
                            max_chunks=max_chunks, max_ckpts=max_ckpts)
    bufs = {k: torch.tensor(v, dtype=torch.int32, device=gpu) for k, v in empty.items()}
    meta = ChunkMeta(block_size=B, **bufs)

    def load(lens, starts, seqs):
        lists = host_chunk_meta(lens, starts, [s[2] for s in seqs], [s[3] for s in seqs],
                                [s[4] for s in seqs], B, max_seqs=S_max, max_chunks=max_chunks,
                                max_ckpts=max_ckpts)
        for k, v in lists.items():
            bufs[k].copy_(torch.tensor(v, dtype=torch.int32))

    pv = pool_view(base, C, W)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        conv_prefill(x_buf, weight, bias, pv, meta, out=out_buf)  # compile + warm up
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        conv_prefill(x_buf, weight, bias, pv, meta, out=out_buf)

    batches = [
        ([16000, 300, 84], [0, 100, 128]),
        ([1, 2, 3, 63, 64, 65, 130, 5000], [0, 37, 100, 128, 62, 63, 191, 256]),
        ([700], [1000]),
        ([4096, 4096, 4096, 4000], [64, 0, 37, 5]),
    ]
    for k, (lens, starts) in enumerate(batches):
        seqs, _ = _gpu_batch(k, B, lens, starts)
        load(lens, starts, seqs)
        x_buf.copy_(torch.randn(T_max, C, generator=gen).to(gpu, dt))
        out_buf.fill_(float("nan"))
        base.copy_(base0)
        graph.replay()
        torch.cuda.synchronize()
        g_out, g_pool = out_buf.clone(), base.clone()

        base.copy_(base0)
        eager_meta = chunk_meta(lens, starts, [s[2] for s in seqs], [s[3] for s in seqs],
                                [s[4] for s in seqs], B, device=gpu)
        e_out = conv_prefill(x_buf, weight, bias, pv, eager_meta)
        torch.cuda.synchronize()
        assert_bits_equal(g_out, e_out, f"batch {k}: graph vs eager outputs")
        assert_bits_equal(g_pool, base, f"batch {k}: graph vs eager pool")
        total = sum(lens)
        assert torch.equal(g_out[total:], torch.zeros_like(g_out[total:]))


@pytest.mark.gpu
def test_gpu_decode_vs_reference_and_graph(gpu):
    C, W, dt, N = QWEN_C, QWEN_W, bf16, 64
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(C, W, generator=gen).to(gpu)
    bias = torch.randn(C, generator=gen).to(gpu)
    pool, base0 = make_pool(3 * N, C, W, dt, gpu, pad=8)
    base0.copy_(torch.randn(base0.shape, generator=gen).to(gpu, dt))
    base = base0.clone()
    pv, pv0 = pool_view(base, C, W), pool_view(base0, C, W)
    x_buf = torch.zeros(N, C, dtype=dt, device=gpu)
    out_buf = torch.zeros(N, C, dtype=dt, device=gpu)
    rs_buf = torch.full((N,), NO_SLOT, dtype=torch.int32, device=gpu)
    ws_buf = torch.full((N,), NO_SLOT, dtype=torch.int32, device=gpu)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        conv_decode(x_buf, weight, bias, pv, rs_buf, ws_buf, out=out_buf)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        conv_decode(x_buf, weight, bias, pv, rs_buf, ws_buf, out=out_buf)

    for k, live in enumerate((N, 5, 33)):
        perm = torch.randperm(3 * N, generator=gen)
        rs = perm[:N].clone()
        ws = torch.where(torch.arange(N) % 3 == 0, rs, perm[N:2 * N])  # a third in place
        rs[live:] = NO_SLOT
        ws[live:] = NO_SLOT
        rs_buf.copy_(rs)
        ws_buf.copy_(ws)
        x_buf.copy_(torch.randn(N, C, generator=gen).to(gpu, dt))
        base.copy_(base0)
        graph.replay()
        torch.cuda.synchronize()
        g_out, g_pool = out_buf.clone(), base.clone()
        base.copy_(base0)
        e_out = conv_decode(x_buf, weight, bias, pv, rs_buf, ws_buf)
        assert_bits_equal(g_out, e_out, "decode graph vs eager outputs")
        assert_bits_equal(g_pool, base, "decode graph vs eager pool")
        exp = base0.clone()
        pe = pool_view(exp, C, W)
        for i in range(live):
            yr, fin = causal_conv1d_ref(x_buf[i:i + 1], weight, bias, pv0[rs[i]])
            assert rel(g_out[i], yr[0]) < TOL[dt]
            pe[ws[i]] = fin.to(dt)
        assert torch.equal(g_out[live:], torch.zeros_like(g_out[live:]))
        assert_bits_equal(g_pool, exp, "decode pool vs reference")


@pytest.mark.gpu
def test_gpu_warm_equals_cold(gpu):
    _warm_vs_cold(gpu, QWEN_C, bf16, 4000, resumes=(64, 1024, 2048, 3968),
                  cuts=(0, 1000, 1037, 1039, 2500, 4000))


@pytest.mark.gpu
def test_gpu_decode_equals_prefill_token(gpu):
    _decode_vs_prefill(gpu, QWEN_C, bf16, 1000)
