"""Causal depthwise conv1d (+ SiLU) over a conv-state pool, for decode and for varlen prefill.

Pool layout: ``conv[num_slots, C, W-1]`` holds, per slot and channel, the last W-1 inputs (oldest
first). Any strides are accepted, so a pool whose slot stride exceeds C*(W-1) (vLLM pads pages)
works. Slot -1 is never read or written (see gdn_graphs/constants.py).

Both entry points are CUDA-graph safe: grids depend only on buffer shapes, nothing synchronises,
nothing is allocated except ``out`` when it is None, and all data-dependent choices happen on the
device.

Prefill race hazard, and how it is avoided: within one sequence, a checkpoint slot or the write slot
may be the read slot (n = 100, B = 64: the read slot is table[1] and the state after 128 tokens also
goes to table[1]); and a short sequence's final window, or an early checkpoint's window, contains
initial-window values. So, per sequence and channel block, exactly one program (the one of chunk 0)
touches the pool: it loads everything it needs from the pool first, then a CTA barrier (loads and
stores of different layouts put the same element in different threads), then stores the checkpoints
in order, another barrier, then the final window. The first W-1 tokens of a span (whose conv windows
reach into the initial window) are computed by that program's small "head" tile, even when they lie
in chunk 1 (n % 64 > 64 - W + 1); every other program reads x only and never touches the pool.

Grids: decode (N, cdiv(C, BLOCK_C)); prefill (cdiv(C, BLOCK_C), max(max_chunks, cdiv(T, 64))), with
channel blocks fastest so that CTAs resident together stream whole rows of x. Row tile i_t of the
prefill grid also zeroes the padding rows [cu_seqlens[-1], T) that fall in [64 i_t, 64 i_t + 64).

Memory safety does not rest on slot values or metadata: a slot outside [-1, num_slots) reads and
stores nothing (as -1), a sequence's span is clipped to [0, T), its start position to [0, MAX_POS),
chunk and checkpoint entries outside their tables or the span are skipped, and every such repair
sets a code in the optional ``error_flag`` (gdn_graphs.ops.common). All of it is scalar
arithmetic and masks on existing accesses: valid inputs compute exactly what they did.

``conv_prefill(..., tail_out=, tail_from=)`` writes the channels from tail_from on into a second
buffer instead of ``out`` (the FlashInfer path passes its workspace's contiguous v, which the prep
would otherwise copy there): the same values, one store per element either way.

Supported kernel widths: 2 <= W <= 8 (tested: 2, 3, 4, 6). Arithmetic is fp32 with the same
operation sequence everywhere (taps oldest first, then bias, then SiLU), so a token's output does
not depend on which tile or kernel computed it: a warm run resumed from a stored window repeats the
cold run's bits, and decoding token n + 1 matches prefilling it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.common import (ERR_META_C, ERR_SLOT_C, ERR_TOKENS_C, FLOAT_DTYPES,
                                   bad_slot, check_flag, check_meta, check_slots, clip_pos,
                                   clip_span, fail, first_overlap, overlaps, report, slot_ok,
                                   span_chunks)

__all__ = ["conv_decode", "conv_prefill", "prefill_tail_ok"]

MAX_WIDTH = 8
_ACTIVATIONS = ("silu", None)

# Defaults; every public function takes overrides.
DECODE_BLOCK_C, DECODE_NUM_WARPS = 512, 2  # 8 channels a thread: 16-byte bf16 accesses
PREFILL_BLOCK_C, PREFILL_NUM_WARPS = 64, 4
PREFILL_BLOCK_E = 16  # checkpoints stored per iteration by chunk 0's program


# --------------------------------------------------------------------------------------------- #
# kernels
# --------------------------------------------------------------------------------------------- #


@triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None,
                    "HAS_FLAG": lambda args: args["error_flag"] is not None})
@triton.jit(do_not_specialize=["num_slots"])
def _conv_decode_kernel(
    x, weight, bias, conv, y, read_slot, write_slot, error_flag,
    C, num_slots,
    stride_x, stride_y, stride_wc, stride_wk, stride_slot, stride_sc, stride_sk,
    W: tl.constexpr, WP: tl.constexpr, BLOCK_C: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_FLAG: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1)
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < C
    o_m = tl.arange(0, WP)
    m_m = o_m < W - 1

    r_slot = tl.load(read_slot + i_n)
    w_slot = tl.load(write_slot + i_n)
    # only slots inside the pool are dereferenced; -1 and bad values address slot 0, masked
    has_init = slot_ok(r_slot, num_slots)
    has_w = slot_ok(w_slot, num_slots)
    # [BLOCK_C] (dereferenced only if has_init)
    src = conv + tl.where(has_init, r_slot, 0).to(tl.int64) * stride_slot + o_c * stride_sc

    # Phase 1: every load. Layouts of loads and stores may differ (different threads own the same
    # element), so in-place (read == write, or out == x) needs all loads done before the barrier.
    xv = tl.load(x + i_n * stride_x + o_c, mask=m_c, other=0.0)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(W - 1):
        v = tl.load(src + k * stride_sk, mask=m_c & has_init, other=0.0).to(tl.float32)
        wk = tl.load(weight + o_c * stride_wc + k * stride_wk, mask=m_c, other=0.0).to(tl.float32)
        acc += v * wk
    wk = tl.load(weight + o_c * stride_wc + (W - 1) * stride_wk, mask=m_c, other=0.0).to(tl.float32)
    acc += xv.to(tl.float32) * wk
    if HAS_BIAS:
        acc += tl.load(bias + o_c, mask=m_c, other=0.0).to(tl.float32)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    # A padded row (both slots -1) outputs zeros.
    acc = tl.where(has_init | has_w, acc, 0.0)
    # New window [c, m] = old window [c, m + 1] for m < W - 2, x for m = W - 2.
    shifted = tl.load(src[:, None] + (o_m + 1)[None, :] * stride_sk,
                      mask=m_c[:, None] & ((o_m + 1 < W - 1) & has_init)[None, :], other=0.0)
    new = tl.where((o_m == W - 2)[None, :], xv[:, None].to(shifted.dtype), shifted)

    tl.debug_barrier()
    # Phase 2: stores.
    tl.store(y + i_n * stride_y + o_c, acc.to(y.dtype.element_ty), mask=m_c)
    dst = (conv + tl.where(has_w, w_slot, 0).to(tl.int64) * stride_slot + o_c[:, None] * stride_sc
           + o_m[None, :] * stride_sk)
    tl.store(dst, new.to(conv.dtype.element_ty), mask=(m_c[:, None] & m_m[None, :]) & has_w)
    report(error_flag, bad_slot(r_slot, num_slots) | bad_slot(w_slot, num_slots), ERR_SLOT_C,
           HAS_FLAG)


@triton.jit
def _bias_act(acc, bias, o_c, m_c, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    """acc [rows, BLOCK_C] fp32 + bias, then SiLU: the one epilogue of both prefill tiles."""
    if HAS_BIAS:
        acc += tl.load(bias + o_c, mask=m_c, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    return acc


@triton.jit
def _store_y(y, y_tail, rows, o_c, val, mask, stride_y, stride_yt, tail_from, to_tail):
    """Prefill outputs of rows ``rows`` and channels ``o_c``: into y, or, for a channel block at
    or past ``tail_from`` (``to_tail``, one value per program), into y_tail at channel
    o_c - tail_from (conv_prefill's ``tail_out``). A uniform branch: one store either way."""
    r64 = rows.to(tl.int64)[:, None]
    if to_tail:
        tl.store(y_tail + r64 * stride_yt + (o_c - tail_from)[None, :], val.to(y_tail.dtype.element_ty),
                 mask=mask)
    else:
        tl.store(y + r64 * stride_y + o_c[None, :], val.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _load_window(x, init, bos, r0, q, ok, has_init, o_c, m_c, o_m, m_m, stride_x, stride_sk,
                 W: tl.constexpr):
    """[BLOCK_C, WP] window whose entry m is the input at span index r = r0 + m: x[bos + r] when
    r >= 0, else entry W - 1 + r of the initial window (zeros without one). ``ok``: load at all."""
    r = r0 + o_m
    in_x = r >= 0
    mx = m_c[:, None] & (m_m & in_x & (r < q) & ok)[None, :]
    xv = tl.load(x + (bos + r).to(tl.int64)[None, :] * stride_x + o_c[:, None], mask=mx, other=0.0)
    mi = m_c[:, None] & (m_m & (r < 0) & (ok & has_init))[None, :]
    iv = tl.load(init[:, None] + (r + W - 1)[None, :] * stride_sk, mask=mi, other=0.0)
    return tl.where(in_x[None, :], xv.to(iv.dtype), iv)


# Not specialised on (see chunk.py's intra kernel): T, the planner's limits, the pool's size and
# its slot stride (an engine's page size; it only addresses the few window loads and checkpoint
# stores per sequence, where an alignment proof buys nothing).
@triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None,
                    "HAS_FLAG": lambda args: args["error_flag"] is not None})
@triton.jit(do_not_specialize=["T", "max_seqs", "max_chunks", "max_ckpts", "num_slots",
                               "stride_slot", "tail_from", "stride_yt"])
def _conv_prefill_kernel(
    x, weight, bias, conv, y, y_tail,
    cu_seqlens, start_pos, read_slot, write_slot, ckpt_offsets, ckpt_slots, chunk_seq, chunk_idx,
    error_flag,
    T, C, max_seqs, max_chunks, max_ckpts, num_slots, block_size, tail_from,
    stride_x, stride_y, stride_yt, stride_wc, stride_wk, stride_slot, stride_sc, stride_sk,
    W: tl.constexpr, WP: tl.constexpr, BT: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_E: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_FLAG: tl.constexpr,
):
    # Channel blocks vary fastest: CTAs resident together read whole rows of x (long contiguous
    # runs), and chunk j's 3-row halo was just read by chunk j - 1's CTAs (an L2 hit).
    i_c = tl.program_id(0)
    i_t = tl.program_id(1)
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < C
    o_r = tl.arange(0, BT)
    # the channel block's outputs go to y_tail from tail_from on (tail_from = C: none do; the
    # launcher makes tail_from a multiple of BLOCK_C, so a block lies on one side)
    to_tail = i_c * BLOCK_C >= tail_from

    # Tokens [total, T) belong to no sequence: tile i_t zeroes its share of them. The grid has at
    # least cdiv(T, BT) rows, so every such token is covered.
    total = tl.load(cu_seqlens + max_seqs)
    if (i_t + 1) * BT > total:
        r = i_t * BT + o_r
        m = (r >= total) & (r < T)
        _store_y(y, y_tail, r, o_c, tl.zeros([BT, BLOCK_C], dtype=tl.float32),
                 m[:, None] & m_c[None, :], stride_y, stride_yt, tail_from, to_tail)
    report(error_flag, (i_t == 0) & (i_c == 0) & ((total < 0) | (total > T)), ERR_TOKENS_C,
           HAS_FLAG)
    if i_t >= max_chunks:
        return
    seq = tl.load(chunk_seq + i_t)
    # -1: an idle entry; any other value outside [0, max_seqs) names no sequence
    report(error_flag, (seq < -1) | (seq >= max_seqs), ERR_META_C, HAS_FLAG)
    if (seq < 0) | (seq >= max_seqs):
        return

    j = tl.load(chunk_idx + i_t)
    # The span clipped to the tensors' [0, T) and the position to [0, MAX_POS) (no change for valid
    # metadata): every token index below is inside x and y, and no position arithmetic overflows.
    bos, eos, clipped = clip_span(tl.load(cu_seqlens + seq), tl.load(cu_seqlens + seq + 1), T)
    n, moved = clip_pos(tl.load(start_pos + seq))
    report(error_flag, clipped | moved, ERR_TOKENS_C, HAS_FLAG)
    q = eos - bos
    off = n % BT
    # chunk j must be one of the span's chunks (else it would compute nothing, or repeat another)
    bad_j = (j < 0) | (j >= span_chunks(n, q, BT))
    report(error_flag, bad_j, ERR_META_C, HAS_FLAG)
    if bad_j:
        return
    first = j == 0
    # Chunk j covers [bos + max(0, j*BT - off), min(bos + (j+1)*BT - off, eos)). The first W - 1
    # tokens of the span (whose windows reach into the initial window) are left to the "head" tile
    # of chunk 0's program below, so this tile reads x only: no pool, no layout conversions.
    lo = bos + tl.maximum(j * BT - off, W - 1)
    hi = tl.minimum(bos + tl.maximum((j + 1) * BT - off, W - 1), eos)
    rows = lo + o_r
    m_r = rows < hi
    acc = tl.zeros([BT, BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(W):
        v = tl.load(x + (rows - (W - 1) + k).to(tl.int64)[:, None] * stride_x + o_c[None, :],
                    mask=m_r[:, None] & m_c[None, :], other=0.0).to(tl.float32)
        wk = tl.load(weight + o_c * stride_wc + k * stride_wk, mask=m_c, other=0.0).to(tl.float32)
        acc += v * wk[None, :]
    acc = _bias_act(acc, bias, o_c, m_c, HAS_BIAS, SILU)
    _store_y(y, y_tail, rows, o_c, acc, m_r[:, None] & m_c[None, :], stride_y, stride_yt,
             tail_from, to_tail)

    if first:
        # All of this sequence's pool traffic, for this channel block.
        r_slot = tl.load(read_slot + seq)
        w_slot = tl.load(write_slot + seq)
        e_lo0 = tl.load(ckpt_offsets + seq)
        nck0 = tl.load(ckpt_offsets + seq + 1) - e_lo0
        # Checkpoint entries: inside ckpt_slots, and no more than the span has boundaries (which
        # is what a valid table holds; then nothing changes).
        e_lo = tl.minimum(tl.maximum(e_lo0, 0), max_ckpts)
        nck_span = (n + q - 1) // block_size - n // block_size
        nck = tl.minimum(tl.maximum(nck0, 0), tl.minimum(nck_span, max_ckpts - e_lo))
        report(error_flag, (e_lo != e_lo0) | (nck != nck0) | (nck0 != nck_span), ERR_META_C,
               HAS_FLAG)
        # only slots inside the pool are dereferenced; -1 and bad values address slot 0, masked
        has_init = slot_ok(r_slot, num_slots)
        has_w = slot_ok(w_slot, num_slots)
        report(error_flag, bad_slot(r_slot, num_slots) | bad_slot(w_slot, num_slots), ERR_SLOT_C,
               HAS_FLAG)
        init = conv + tl.where(has_init, r_slot, 0).to(tl.int64) * stride_slot + o_c * stride_sc
        o_m = tl.arange(0, WP)
        m_m = o_m < W - 1
        # Head tile: tokens bos + i, i < min(W - 1, q). Tap k of token i is span index
        # s = i - (W - 1) + k: x[bos + s] when s >= 0, else initial-window entry W - 1 + s. The
        # same fp32 operations in the same order as the main tile: warm == cold bit for bit.
        m_h = o_m < tl.minimum(q, W - 1)
        acc_h = tl.zeros([WP, BLOCK_C], dtype=tl.float32)
        for k in tl.static_range(W):
            sh = o_m - (W - 1) + k
            vh = tl.load(x + (bos + sh).to(tl.int64)[:, None] * stride_x + o_c[None, :],
                        mask=(m_h & (sh >= 0))[:, None] & m_c[None, :], other=0.0).to(tl.float32)
            if k < W - 1:
                iv = tl.load(init[None, :] + (sh + W - 1)[:, None] * stride_sk,
                             mask=(m_h & (sh < 0) & has_init)[:, None] & m_c[None, :],
                             other=0.0).to(tl.float32)
                vh = tl.where((sh >= 0)[:, None], vh, iv)
            wkh = tl.load(weight + o_c * stride_wc + k * stride_wk, mask=m_c, other=0.0).to(tl.float32)
            acc_h += vh * wkh[None, :]
        acc_h = _bias_act(acc_h, bias, o_c, m_c, HAS_BIAS, SILU)
        _store_y(y, y_tail, bos + o_m, o_c, acc_h, m_h[:, None] & m_c[None, :], stride_y,
                 stride_yt, tail_from, to_tail)
        pc = tl.zeros([BLOCK_C, WP], dtype=tl.int64) + o_c[:, None] * stride_sc + o_m[None, :] * stride_sk
        m_cm = m_c[:, None] & m_m[None, :]
        # Phase 1: the reads that may touch the pool. The final window is the last W - 1 inputs
        # (span index q - W + 1 ...); checkpoint 0's, the W - 1 inputs before p_0.
        p0 = (n // block_size + 1) * block_size
        fin = _load_window(x, init, bos, q - (W - 1), q, has_w, has_init, o_c, m_c, o_m, m_m,
                           stride_x, stride_sk, W)
        ck0 = _load_window(x, init, bos, p0 - n - (W - 1), q, nck > 0, has_init, o_c, m_c, o_m,
                           m_m, stride_x, stride_sk, W)
        tl.debug_barrier()
        # Phase 2: checkpoints in order, then the final window.
        s0 = tl.load(ckpt_slots + e_lo, mask=nck > 0, other=-1)
        s0_ok = slot_ok(s0, num_slots)
        report(error_flag, bad_slot(s0, num_slots), ERR_SLOT_C, HAS_FLAG)
        tl.store(conv + tl.where(s0_ok, s0, 0).to(tl.int64) * stride_slot + pc,
                 ck0.to(conv.dtype.element_ty), mask=m_cm & s0_ok)
        # Checkpoints e >= 1 sit at least B - W + 1 > 0 tokens into the span: x only, no pool reads.
        # (A while loop: the Triton interpreter cannot take a loaded scalar as a range bound.)
        e = 1 + tl.arange(0, BLOCK_E)
        e0 = 1
        while e0 < nck:
            se = tl.load(ckpt_slots + e_lo + e, mask=e < nck, other=-1)
            se_ok = slot_ok(se, num_slots)
            report(error_flag, tl.max(bad_slot(se, num_slots).to(tl.int32), 0) > 0, ERR_SLOT_C,
                   HAS_FLAG)
            src = bos + (n // block_size + 1 + e) * block_size - n - (W - 1)  # first input, flat
            m3 = se_ok[:, None, None] & m_cm[None, :, :]
            vals = tl.load(x + (src[:, None, None] + o_m[None, None, :]).to(tl.int64) * stride_x
                           + o_c[None, :, None], mask=m3, other=0.0)
            tl.store(conv + tl.where(se_ok, se, 0).to(tl.int64)[:, None, None] * stride_slot
                     + pc[None, :, :], vals.to(conv.dtype.element_ty), mask=m3)
            e += BLOCK_E
            e0 += BLOCK_E
        tl.debug_barrier()
        tl.store(conv + tl.where(has_w, w_slot, 0).to(tl.int64) * stride_slot + pc,
                 fin.to(conv.dtype.element_ty), mask=m_cm & has_w)


# --------------------------------------------------------------------------------------------- #
# checks (metadata only: no device sync)
# --------------------------------------------------------------------------------------------- #


def _check_common(fn, x, weight, bias, conv, out, activation, rows_name):
    """Checks shared by both public functions (``fn``: which one, for the messages)."""
    if activation not in _ACTIVATIONS:
        fail(fn, f"activation must be 'silu' or None, got {activation!r}")
    if x.dim() != 2:
        fail(fn, f"x must be 2-D [{rows_name}, C], got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        fail(fn, f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        fail(fn, f"x must be contiguous along channels (stride(1) == 1), got {x.stride()}")
    if weight.dim() != 2:
        fail(fn, f"weight must be 2-D [C, W], got shape {tuple(weight.shape)}")
    C, W = weight.shape
    if not 2 <= W <= MAX_WIDTH:
        fail(fn, f"kernel width W must be in [2, {MAX_WIDTH}], got {W}")
    if x.shape[1] != C:
        fail(fn, f"x has {x.shape[1]} channels, weight has {C}")
    if weight.dtype not in FLOAT_DTYPES:
        fail(fn, f"weight must be a float tensor, got {weight.dtype}")
    if bias is not None:
        if bias.shape != (C,) or bias.dtype not in FLOAT_DTYPES:
            fail(fn, f"bias must be a float [{C}] tensor, got {tuple(bias.shape)} {bias.dtype}")
        if C > 1 and bias.stride(0) != 1:
            fail(fn, "bias must be contiguous")
    if conv.dim() != 3 or conv.shape[1] != C or conv.shape[2] != W - 1:
        fail(fn, f"conv pool must be [num_slots, {C}, {W - 1}], got {tuple(conv.shape)}")
    if conv.dtype not in FLOAT_DTYPES:
        fail(fn, f"conv pool must be float16, bfloat16 or float32, got {conv.dtype}")
    if out is not None:
        if out.shape != x.shape:
            fail(fn, f"out must have x's shape {tuple(x.shape)}, got {tuple(out.shape)}")
        if out.dtype != x.dtype:
            fail(fn, f"out must have x's dtype {x.dtype}, got {out.dtype}")
        if C > 1 and out.stride(1) != 1:
            fail(fn, f"out must be contiguous along channels, got strides {out.stride()}")
    for name, t in (("weight", weight), ("bias", bias), ("conv", conv), ("out", out)):
        if t is not None and t.device != x.device:
            fail(fn, f"{name} is on {t.device}, x on {x.device}")


def prefill_tail_ok(C: int, tail_from: int, block_c: int | None = None) -> bool:
    """Whether conv_prefill over C channels (channel tile ``block_c``, default its default) can
    send channels tail_from.. to a tail_out: tail_from must be a multiple of the tile."""
    bc = min(PREFILL_BLOCK_C, triton.next_power_of_2(C)) if block_c is None else block_c
    return 0 < tail_from < C and tail_from % bc == 0


def _check_tail(x, out, tail_out, tail_from, BLOCK_C):
    """conv_prefill's tail_out / tail_from (see its docstring)."""
    T, C = x.shape
    if not prefill_tail_ok(C, tail_from, BLOCK_C):
        fail("conv_prefill", f"tail_from must be a multiple of the channel tile {BLOCK_C} in "
             f"(0, {C}), got {tail_from}")
    if tail_out.dim() != 2 or tuple(tail_out.shape) != (T, C - tail_from):
        fail("conv_prefill", f"tail_out must be [{T}, {C - tail_from}], got {tuple(tail_out.shape)}")
    if tail_out.dtype != x.dtype or tail_out.device != x.device:
        fail("conv_prefill", f"tail_out must have x's dtype and device ({x.dtype}, {x.device}), "
             f"got {tail_out.dtype}, {tail_out.device}")
    if C - tail_from > 1 and tail_out.stride(1) != 1:
        fail("conv_prefill", f"tail_out must be contiguous along channels, got {tail_out.stride()}")
    hit = first_overlap(tail_out, {"x": x, "out": out})
    if hit is not None:
        fail("conv_prefill", f"tail_out must not overlap {hit}")


def _block_c(fn, block_c, default, C):
    """The channel tile: ``block_c``, or ``default`` capped at C rounded up to a power of two."""
    bc = min(default, triton.next_power_of_2(C)) if block_c is None else block_c
    if bc < 1 or bc & (bc - 1):
        fail(fn, f"block_c must be a power of two, got {bc}")
    return bc


# --------------------------------------------------------------------------------------------- #
# launchers (arguments checked by the public functions; nothing here syncs or allocates)
# --------------------------------------------------------------------------------------------- #


def _launch_decode(x, weight, bias, conv, out, read_slot, write_slot, silu, BLOCK_C, num_warps,
                   error_flag=None):
    """Grid (N, cdiv(C, BLOCK_C)) over x [N, C]; writes out [N, C] and the write slots of conv."""
    (N, C), W = x.shape, weight.shape[1]
    _conv_decode_kernel[(N, triton.cdiv(C, BLOCK_C))](
        x, weight, bias, conv, out, read_slot, write_slot, error_flag,
        C, conv.shape[0],
        x.stride(0), out.stride(0), weight.stride(0), weight.stride(1),
        conv.stride(0), conv.stride(1), conv.stride(2),
        W=W, WP=triton.next_power_of_2(W - 1), BLOCK_C=BLOCK_C, SILU=silu, num_warps=num_warps,
    )


def _launch_prefill(x, weight, bias, conv, out, meta, tiles, silu, BLOCK_C, BLOCK_E, num_warps,
                    error_flag=None, tail_out=None, tail_from=None):
    """Grid (cdiv(C, BLOCK_C), tiles) over x [T, C]; writes out [T, C] (padding rows too; channels
    tail_from.. into tail_out [T, C - tail_from] instead, when given) and the write and checkpoint
    slots of conv."""
    (T, C), W = x.shape, weight.shape[1]
    if tail_out is None:  # no block goes to the tail (y_tail is never dereferenced then)
        tail_out, tail_from = out, C
    _conv_prefill_kernel[(triton.cdiv(C, BLOCK_C), tiles)](
        x, weight, bias, conv, out, tail_out,
        meta.cu_seqlens, meta.start_pos, meta.read_slot, meta.write_slot, meta.ckpt_offsets,
        meta.ckpt_slots, meta.chunk_seq, meta.chunk_idx, error_flag,
        T, C, meta.max_seqs, meta.max_chunks, meta.ckpt_slots.shape[0], conv.shape[0],
        meta.block_size, tail_from,
        x.stride(0), out.stride(0), tail_out.stride(0), weight.stride(0), weight.stride(1),
        conv.stride(0), conv.stride(1), conv.stride(2),
        W=W, WP=triton.next_power_of_2(W - 1), BT=CHUNK, BLOCK_C=BLOCK_C, BLOCK_E=BLOCK_E,
        SILU=silu, num_warps=num_warps,
    )


# --------------------------------------------------------------------------------------------- #
# public functions
# --------------------------------------------------------------------------------------------- #


def conv_decode(x, weight, bias, conv, read_slot, write_slot, out=None, activation="silu", *,
                block_c=None, num_warps=None, error_flag=None):
    """One decode token per row: causal depthwise conv1d continuing from a pooled window.

    x           [N, C] float16/bfloat16/float32, channels contiguous, any row stride.
    weight      [C, W], 2 <= W <= 8 (any strides); bias [C] (contiguous) or None.
    conv        [num_slots, C, W-1] pool (float16/bfloat16/float32, any strides): per slot and
                channel the last W-1 inputs, oldest first.  MUTATED: slots write_slot[i].
    read_slot, write_slot  int32 [>= N] (entries past N are ignored). Row i continues from window
                conv[read_slot[i]] (-1: zeros) and stores its new window (the last W-1 of
                window ++ x[i]) to conv[write_slot[i]] (-1: nothing). read == write (in place)
                and read != write both work. A row with both slots -1 is padding: output zeros.
                A slot outside [-1, num_slots) is treated as -1 (and reported: ERR_SLOT).
    out         [N, C], x's dtype, channels contiguous; allocated when None. out may be x itself.
    activation  "silu" or None.
    error_flag  optional int32 [>= 1]: gdn_graphs.ops.common's codes are OR-ed into element 0.
    Returns out: y[i] = act(bias + sum_j weight[:, j] * xx[j]), xx = window ++ x[i], in fp32 then
    cast to x's dtype. Graph-safe: grid (N, cdiv(C, block_c)), no sync, no allocation if out given.
    """
    _check_common("conv_decode", x, weight, bias, conv, out, activation, "N")
    N, C = x.shape
    check_slots("conv_decode", "read_slot", read_slot, N, x.device, ref="x")
    check_slots("conv_decode", "write_slot", write_slot, N, x.device, ref="x")
    check_flag("conv_decode", error_flag, x.device, ref="x")
    if out is not None and overlaps(out, x) and (out.data_ptr(), out.stride()) != (x.data_ptr(), x.stride()):
        fail("conv_decode", "out must be x itself or not overlap it")
    if out is None:
        out = torch.empty((N, C), dtype=x.dtype, device=x.device)
    if N == 0 or C == 0:
        return out
    BLOCK_C = _block_c("conv_decode", block_c, DECODE_BLOCK_C, C)
    _launch_decode(x, weight, bias, conv, out, read_slot, write_slot, activation == "silu", BLOCK_C,
                   DECODE_NUM_WARPS if num_warps is None else num_warps, error_flag)
    return out


def conv_prefill(x, weight, bias, conv, meta, out=None, activation="silu", *, block_c=None,
                 num_warps=None, block_e=None, error_flag=None, tail_out=None, tail_from=None):
    """Varlen prefill: causal depthwise conv1d per sequence, storing windows into the pool.

    x           [T, C] float16/bfloat16/float32, channels contiguous, any row stride. Tokens of
                sequence i are rows meta.cu_seqlens[i] .. meta.cu_seqlens[i+1]; rows past the last
                live token are padding and get zeros.
    weight      [C, W], 2 <= W <= 8; bias [C] or None.
    conv        [num_slots, C, W-1] pool (any strides).  MUTATED, per sequence i with n = start_pos:
                - conv[write_slot[i]] <- the last W-1 inputs of window ++ x_i (-1: nothing); for a
                  sequence shorter than W-1 this includes initial-window entries;
                - conv[ckpt_slots[ckpt_offsets[i] + e]] <- the W-1 inputs before absolute position
                  p_e = (n // B + 1 + e) * B, for each block boundary strictly inside (n, n + q)
                  (-1: nothing). Checkpoints are stored in order, then the final window.
                The initial window is conv[read_slot[i]] (-1: zeros); it is read before any of the
                sequence's stores, so a checkpoint or write slot may equal the read slot.
    meta        ChunkMeta (gdn_graphs.ops.meta); its buffers may be longer than the live batch. One
                built on the host must cover at most T tokens (ValueError). Slots outside
                [-1, num_slots) and spans or tables that point outside the tensors are never
                dereferenced (ERR_SLOT, ERR_TOKENS, ERR_META in ``error_flag``).
    out         [T, C], x's dtype, channels contiguous, not overlapping x; allocated when None.
    activation  "silu" or None.
    error_flag  optional int32 [>= 1]: gdn_graphs.ops.common's codes are OR-ed into element 0.
    tail_out, tail_from  optional: channels tail_from .. C-1 of every row (padding rows too) are
                written to tail_out[t, c - tail_from] instead of out, whose columns there are then
                left as they were (the FlashInfer path hands its workspace's v here, saving a
                copy). tail_out [T, C - tail_from], x's dtype, channels contiguous, overlapping
                neither x nor out; tail_from a multiple of the channel tile (block_c, default 64
                or C's power of two), 0 < tail_from < C. Same values, bit for bit, either way.
    Returns out. Graph-safe: grid (cdiv(C, block_c), max(meta.max_chunks, cdiv(T, 64))) depends on
    buffer sizes only; no sync; no allocation if out is given. block_e: checkpoints per iteration.
    """
    _check_common("conv_prefill", x, weight, bias, conv, out, activation, "T")
    T, C = x.shape
    check_meta("conv_prefill", meta, x.device, T, ref="x")
    check_flag("conv_prefill", error_flag, x.device, ref="x")
    if out is not None and overlaps(out, x):
        fail("conv_prefill", "out must not overlap x: prefill programs read neighbouring tokens of x")
    if out is None:
        out = torch.empty((T, C), dtype=x.dtype, device=x.device)
    if T == 0 or C == 0:
        return out
    BLOCK_C = _block_c("conv_prefill", block_c, PREFILL_BLOCK_C, C)
    if (tail_out is None) != (tail_from is None):
        fail("conv_prefill", "tail_out and tail_from go together")
    if tail_out is not None:
        _check_tail(x, out, tail_out, int(tail_from), BLOCK_C)
    BLOCK_E = PREFILL_BLOCK_E if block_e is None else block_e
    if BLOCK_E < 1 or BLOCK_E & (BLOCK_E - 1):
        fail("conv_prefill", f"block_e must be a power of two, got {BLOCK_E}")
    tiles = max(meta.max_chunks, triton.cdiv(T, CHUNK))
    if tiles > 65535:  # CUDA's limit on grid dimension y
        fail("conv_prefill", f"{tiles} chunk tiles exceed 65535: split the batch (T = {T}, "
             f"max_chunks = {meta.max_chunks})")
    _launch_prefill(x, weight, bias, conv, out, meta, tiles, activation == "silu", BLOCK_C, BLOCK_E,
                    PREFILL_NUM_WARPS if num_warps is None else num_warps, error_flag, tail_out,
                    None if tail_from is None else int(tail_from))
    return out
