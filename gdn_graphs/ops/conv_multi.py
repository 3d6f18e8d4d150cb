"""Causal depthwise conv1d (+ SiLU) over a conv-state pool for a few tokens per row (speculative
rows): ``conv_decode_multi``, the conv counterpart of ``gdn_decode_multi``.

Row i owns tokens ``cu_seqlens[i] .. cu_seqlens[i+1]``, continues from the window in
``conv[read_slot[i]]`` (-1: zeros) and stores the window after its token t into
``conv[write_slots[i, t]]`` (-1: nothing), so a later step can resume after any of its tokens.

Per token it does exactly what ``conv_decode`` does (fp32 taps oldest first, then the new input,
bias, SiLU; the window holds the inputs as the pool's dtype does), so its outputs and windows are
bit-identical to running the row's tokens one at a time through conv_decode. The window lives in
registers: it is loaded once, before a barrier, and every later pool access is a store, so a write
slot may equal the read slot (the planner's in-place case). Columns of the window are picked and
shifted on its int32 bit patterns (one non-zero term per sum), which moves values exactly, signs
of zero included.

Memory safety as in conv.py: slots outside [-1, num_slots) are never dereferenced (ERR_SLOT), a
row's span is clipped to [0, T) (ERR_TOKENS), tokens past the table's width store nothing. Grid
(N, cdiv(C, BLOCK_C)); no sync, no allocation except ``out`` when None: graph-safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_graphs.ops.common import (ERR_SLOT_C, ERR_TOKENS_C, bad_slot, check_flag, check_slots,
                                   clip_span, fail, overlaps, report, slot_ok)
from gdn_graphs.ops.conv import _block_c, _check_common

__all__ = ["conv_decode_multi"]

MULTI_BLOCK_C, MULTI_NUM_WARPS = 128, 4


@triton.jit
def _pick(wbits, o_m, k):
    """Column k of an int32 [BLOCK_C, WP] tile, exactly (each row sums one non-zero term)."""
    return tl.sum(tl.where(o_m[None, :] == k, wbits, 0), axis=1)


@triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None,
                    "HAS_FLAG": lambda args: args["error_flag"] is not None})
@triton.jit(do_not_specialize=["T", "Tmax", "num_slots"])
def _conv_decode_multi_kernel(
    x, weight, bias, conv, y, cu_seqlens, read_slot, write_slots, error_flag,
    C, T, Tmax, num_slots,
    stride_x, stride_y, stride_wc, stride_wk, stride_slot, stride_sc, stride_sk, stride_ws,
    W: tl.constexpr, WP: tl.constexpr, BLOCK_C: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_FLAG: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1)
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < C
    o_m = tl.arange(0, WP)
    m_m = o_m < W - 1

    bos, eos, clipped = clip_span(tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1), T)
    r_slot = tl.load(read_slot + i_n)
    has_init = slot_ok(r_slot, num_slots)
    src = conv + tl.where(has_init, r_slot, 0).to(tl.int64) * stride_slot + o_c * stride_sc
    win = tl.load(src[:, None] + o_m[None, :] * stride_sk,
                  mask=m_c[:, None] & (m_m & has_init & (eos > bos))[None, :], other=0.0)
    wbits = win.to(tl.float32).to(tl.int32, bitcast=True)
    # every load of the pool before any store: a write slot may be the read slot
    tl.debug_barrier()
    report(error_flag, bad_slot(r_slot, num_slots), ERR_SLOT_C, HAS_FLAG)
    report(error_flag, clipped, ERR_TOKENS_C, HAS_FLAG)

    t = bos
    while t < eos:
        xv = tl.load(x + t.to(tl.int64) * stride_x + o_c, mask=m_c, other=0.0)
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for k in tl.static_range(W - 1):
            v = _pick(wbits, o_m, k).to(tl.float32, bitcast=True)
            wk = tl.load(weight + o_c * stride_wc + k * stride_wk, mask=m_c, other=0.0)
            acc += v * wk.to(tl.float32)
        wk = tl.load(weight + o_c * stride_wc + (W - 1) * stride_wk, mask=m_c, other=0.0)
        acc += xv.to(tl.float32) * wk.to(tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias + o_c, mask=m_c, other=0.0).to(tl.float32)
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        tl.store(y + t.to(tl.int64) * stride_y + o_c, acc.to(y.dtype.element_ty), mask=m_c)
        # new window [c, m] = old [c, m + 1] for m < W - 2, the input (as the pool holds it) last
        xb = xv.to(conv.dtype.element_ty).to(tl.float32).to(tl.int32, bitcast=True)
        new = tl.where(o_m[None, :] == W - 2, xb[:, None], 0)
        for k in tl.static_range(W - 2):
            new = tl.where(o_m[None, :] == k, _pick(wbits, o_m, k + 1)[:, None], new)
        wbits = new
        i_t = t - bos
        w_slot = tl.load(write_slots + i_n * stride_ws + i_t, mask=i_t < Tmax, other=-1)
        w_ok = slot_ok(w_slot, num_slots)
        dst = (conv + tl.where(w_ok, w_slot, 0).to(tl.int64) * stride_slot
               + o_c[:, None] * stride_sc + o_m[None, :] * stride_sk)
        tl.store(dst, wbits.to(tl.float32, bitcast=True).to(conv.dtype.element_ty),
                 mask=(m_c[:, None] & m_m[None, :]) & w_ok)
        report(error_flag, bad_slot(w_slot, num_slots), ERR_SLOT_C, HAS_FLAG)
        t += 1


def conv_decode_multi(x, weight, bias, conv, cu_seqlens, read_slot, write_slots, out=None,
                      activation="silu", *, block_c=None, num_warps=None, error_flag=None):
    """A few decode tokens per row: causal depthwise conv1d continuing from a pooled window.

    x           [T, C] float16/bfloat16/float32, channels contiguous, any row stride.
    weight      [C, W], 2 <= W <= 8; bias [C] or None.
    conv        [num_slots, C, W-1] pool (any strides).  MUTATED: the slots in write_slots.
    cu_seqlens  int32 [N + 1]: row i owns tokens cu_seqlens[i] .. cu_seqlens[i+1] (0: padding,
                touches nothing).
    read_slot   int32 [>= N]: row i continues from conv[read_slot[i]] (-1: zeros).
    write_slots int32 [>= N, Tmax]: entry [i, t] receives the window after token t of row i
                (the last W-1 inputs up to it; -1: not stored). May name the read slot.
    out         [T, C], x's dtype, not overlapping x; allocated when None. Rows of tokens that
                belong to no row are not written.
    activation  "silu" or None; error_flag: optional int32 [>= 1] (ERR_SLOT, ERR_TOKENS).
    Returns out (y[t] as conv_decode computes it for that token). Graph-safe.
    """
    fn = "conv_decode_multi"
    _check_common(fn, x, weight, bias, conv, out, activation, "T")
    T, C = x.shape
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        fail(fn, "cu_seqlens must be a 1-d int32 tensor [N + 1]")
    N = cu_seqlens.shape[0] - 1
    check_slots(fn, "cu_seqlens", cu_seqlens, N + 1, x.device, ref="x")
    check_slots(fn, "read_slot", read_slot, N, x.device, ref="x")
    check_slots(fn, "write_slots", write_slots, N, x.device, ref="x", ndim=2)
    check_flag(fn, error_flag, x.device, ref="x")
    if out is not None and overlaps(out, x):
        fail(fn, "out must not overlap x")
    if out is None:
        out = torch.empty((T, C), dtype=x.dtype, device=x.device)
    if N == 0 or C == 0 or T == 0:
        return out
    BLOCK_C = _block_c(fn, block_c, MULTI_BLOCK_C, C)
    W = weight.shape[1]
    _conv_decode_multi_kernel[(N, triton.cdiv(C, BLOCK_C))](
        x, weight, bias, conv, out, cu_seqlens, read_slot, write_slots, error_flag,
        C, T, write_slots.shape[1], conv.shape[0],
        x.stride(0), out.stride(0), weight.stride(0), weight.stride(1),
        conv.stride(0), conv.stride(1), conv.stride(2), write_slots.stride(0),
        W=W, WP=triton.next_power_of_2(W - 1), BLOCK_C=BLOCK_C, SILU=activation == "silu",
        num_warps=MULTI_NUM_WARPS if num_warps is None else num_warps,
    )
    return out
