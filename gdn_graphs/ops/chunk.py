"""Chunked GatedDeltaNet prefill that stores block-boundary states straight into the state pool.

Two kernels, both graph-safe (grids depend on buffer sizes only, idle programs exit at once):

``_chunk_intra_kernel`` (one program per (chunk, key head), fully parallel)
    For one chunk of at most 64 tokens: the l2-normalised q (times scale) and k of the key head
    and K K^T, Q K^T; then for each of its value heads gating g and beta, the chunk-local cumsum
    gc of g, the matrix A[t, s] = beta_t exp(gc_t - gc_s) k_t.k_s
    (s < t), T' = (I + A)^-1 diag(beta) and P[t, s] = exp(gc_t - gc_s) q_t.k_s (s <= t). These
    go to a ChunkWorkspace, indexed by flat token. It also writes zeros to the output rows of
    padding tokens (beyond cu_seqlens[-1]). It does not read v.

``_chunk_seq_kernel`` (one program per (sequence, value head, V tile), sequential over chunks)
    Keeps the state tile S^T [K, BV] in fp32 registers. Per chunk, with S0 the entering state:
        v_new = T' (v - exp(gc) * (k S0^T))
        o     = exp(gc) * (q S0^T) + P v_new                        -> out
        S     = exp(gc_last) S0 + (exp(gc_last - gc) v_new)^T k
    and stores S into the pool at every block boundary that has a checkpoint slot, and the final
    state into the write slot. The same program reads the initial state before it writes any
    slot, so a checkpoint or write slot may equal the read slot.

On Hopper (sm_90) with bf16 inputs and K = V = 128 the first kernel's job is done by
``chunk_intra_gluon._intra_gluon_kernel`` for every step (chunk_intra_fwd_for): the same workspace,
the inverse's last bits aside; the second may be ``chunk_gluon``'s, which gives its bits exactly
(at V tile 64 it makes P itself, with the intra kernel's bits, and the intra kernel skips it).

Chunks are aligned to absolute positions (a span starting mid-chunk first finishes that chunk), and
a chunk's arithmetic depends only on its own tokens and its entering state (rows are indexed from
the chunk's first token; nothing depends on the flat offset, the batch or the grid). So a run that
resumes from a block-boundary checkpoint repeats the cold run's arithmetic bit for bit. With a
reduced-precision pool (bf16), the running state is rounded to the pool dtype at every block
boundary so that this still holds; steps that end mid-block are then only close, not identical.

Derivation: write the token update as S_s = exp(g_s) S_{s-1} + d_s k_s^T with
d_s = beta_s (v_s - exp(g_s) S_{s-1} k_s). Unrolled inside the chunk,
S_s = exp(gc_s) S0 + sum_{r<=s} exp(gc_s - gc_r) d_r k_r^T, so
exp(g_s) S_{s-1} k_s = exp(gc_s) S0 k_s + sum_{r<s} exp(gc_s - gc_r) (k_r.k_s) d_r, hence
(I + A) d = beta v - beta exp(gc) (S0 k), d = T' (v - exp(gc) k S0^T) = v_new; o_t = S_t q_t and
S_end follow from the unrolled sum. (The WY form d = u - w S0^T with u = T' v and
w = T' diag(exp(gc)) k, which this kernel pair used before, costs two 64 x 64 x 128 products more
per chunk and three times the workspace traffic; FlashInfer's SM90 kernel forms d as here.)

Memory safety does not rest on slot values or metadata (gdn_graphs.ops.common): slots outside
[-1, num_slots) are never dereferenced, spans are clipped to [0, T) and positions to [0, MAX_POS),
chunk entries outside their sequence and checkpoint entries outside ckpt_slots are skipped, and
each repair ORs a code into the optional ``error_flag``. Only scalar arithmetic and masks on
existing accesses: valid inputs compute exactly what they did.

Precision: bf16/fp16 inputs use 16-bit tensor-core operands with fp32 accumulation (the workspace
holds T', P, q, k in the input dtype, and v - exp(gc) k S0^T is rounded to it before the T'
product; ~4e-3 relative error against fp64 at K = V = 128), the in-chunk inverse uses tf32 dots
on fp32 values, and the state always accumulates in fp32. fp32
inputs use "tf32x3" dots on the GPU (ChunkConfig can ask for "ieee"). Under the Triton
interpreter every dot runs in fp32 on operands already rounded like the GPU's, so the CPU tier sees
the GPU's bf16 arithmetic up to summation order.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.common import (ERR_META_C, ERR_SLOT_C, ERR_TOKENS_C, FLOAT_DTYPES, bad_slot,
                                   cast_like_gpu, check_flag, check_meta, clip_pos, clip_span,
                                   dot_like_gpu, fail, first_overlap, gdn_gate, interpreting,
                                   inv_l2norm, report, slot_ok, span_chunks)
from gdn_graphs.ops.chunk_gluon import chunk_seq_fwd_gluon, gluon_seq_supported
from gdn_graphs.ops.chunk_intra_gluon import chunk_intra_fwd_gluon, gluon_intra_supported
from gdn_graphs.ops.meta import ChunkMeta
from gdn_graphs.ops.workspace import (DEFAULT_CONFIG, ChunkConfig, ChunkWorkspace, check_workspace,
                                      chunk_config)

__all__ = ["gdn_chunk_prefill", "ChunkConfig", "DEFAULT_CONFIG", "ChunkWorkspace", "chunk_intra_fwd",
           "chunk_intra_fwd_for", "chunk_seq_fwd", "chunk_seq_fwd_by"]


@triton.jit
def _chunk_rows(bos, eos, off, j, o_c, BC: tl.constexpr):
    """Chunk j of the span [bos, eos) of flat tokens whose first token sits at offset ``off`` in
    its chunk: chunk j covers absolute positions [(n // BC + j) * BC, + BC) clipped to the span.
    Returns its end (flat, exclusive) and, per row o_c of the tile, whether it is a token of the
    chunk and its flat index (int64): rows count from the chunk's first token."""
    cs = bos + tl.maximum(j * BC - off, 0)
    ce = tl.minimum(bos + (j + 1) * BC - off, eos)
    return ce, o_c < (ce - cs), (cs + o_c).to(tl.int64)


# Integer arguments that change with the engine rather than the model are not specialised on
# (Triton keys a compiled kernel on ints being 1 or multiples of 16): T, the step's token count,
# only bounds the padding loop and masks; max_seqs / max_chunks are the planner's limits, which
# differ between a warm-up and the engine; the row strides of a and b (read one scalar per row)
# depend on how the engine packs its gate projections. Otherwise the first request recompiles
# what the warm-up compiled, which under vLLM stalls that request for over a second.
# (Measurements: profiling/results/2026-11-29/VLLM.md.) The same holds for the pool's size
# num_slots and the checkpoint table's length max_ckpts, which only bound slot values and indices.
@triton.heuristics({"HAS_FLAG": lambda args: args["error_flag"] is not None})
@triton.jit(do_not_specialize=["T", "max_seqs", "max_chunks", "s_at", "s_bt"])
def _chunk_intra_kernel(
    q, k, a, b, A_log, dt_bias, out,
    t_ws, p_ws, g_ws, qs_ws, kn_ws,
    cu_seqlens, start_pos, chunk_seq, chunk_idx, error_flag,
    T, max_seqs, max_chunks,
    s_qt, s_kt, s_at, s_bt, s_ot,
    scale,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BVF: tl.constexpr, BC: tl.constexpr,
    DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr, INTERPRET: tl.constexpr,
    HAS_FLAG: tl.constexpr,
):
    G: tl.constexpr = HV // HK
    pid = tl.program_id(0)
    i_hk = pid % HK
    i_c = pid // HK
    n_cprog = tl.num_programs(0) // HK

    o_c = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = tl.arange(0, BVF)
    m_v = o_v < V

    # Padding tokens (beyond the live batch) get zero outputs; their tiles are shared out over
    # all programs of this key head with a grid-stride loop, so any T works with any grid.
    # (the live end clipped to [0, T]: the loop stays inside out and ends within cdiv(T, BC) tiles)
    t_live0 = tl.load(cu_seqlens + max_seqs)
    t_live = tl.minimum(tl.maximum(t_live0, 0), T)
    report(error_flag, (pid == 0) & (t_live != t_live0), ERR_TOKENS_C, HAS_FLAG)
    n_pad = tl.cdiv(T - t_live, BC)
    # (a while loop: the Triton interpreter cannot take a loaded scalar as a range bound)
    tile = i_c
    while tile < n_pad:
        rows = t_live + tile * BC + o_c
        for j in tl.static_range(G):
            p_o = out + rows.to(tl.int64)[:, None] * s_ot + (i_hk * G + j) * V + o_v[None, :]
            tl.store(p_o, tl.zeros([BC, BVF], dtype=out.dtype.element_ty),
                     mask=(rows < T)[:, None] & m_v[None, :])
        tile += n_cprog

    if i_c >= max_chunks:
        return
    i_n = tl.load(chunk_seq + i_c)
    # -1: an idle entry; any other value outside [0, max_seqs) names no sequence
    report(error_flag, (i_n < -1) | (i_n >= max_seqs), ERR_META_C, HAS_FLAG)
    if (i_n < 0) | (i_n >= max_seqs):
        return
    i_j = tl.load(chunk_idx + i_c)
    # the span clipped to [0, T) (and the position to [0, MAX_POS)): every row below is a token
    # of the tensors; a chunk index that is not one of the span's chunks is skipped
    bos, eos, clipped = clip_span(tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1), T)
    n, moved = clip_pos(tl.load(start_pos + i_n))
    bad_j = (i_j < 0) | (i_j >= span_chunks(n, eos - bos, BC))
    report(error_flag, clipped | moved, ERR_TOKENS_C, HAS_FLAG)
    report(error_flag, bad_j, ERR_META_C, HAS_FLAG)
    if bad_j:
        return
    off = n % BC
    _, m_t, rows = _chunk_rows(bos, eos, off, i_j, o_c, BC)
    m_tk = m_t[:, None] & m_k[None, :]

    # l2-normalised k and scaled q, in fp32 then in the operand dtype: once per key head, shared
    # by its G value heads with the two products that depend on them only
    b_k = tl.load(k + rows[:, None] * s_kt + i_hk * K + o_k[None, :], mask=m_tk, other=0.)
    b_k = b_k.to(tl.float32)
    b_k = b_k * inv_l2norm(b_k, 1)[:, None]
    b_q = tl.load(q + rows[:, None] * s_qt + i_hk * K + o_k[None, :], mask=m_tk, other=0.)
    b_q = b_q.to(tl.float32)
    b_q = b_q * (inv_l2norm(b_q, 1) * scale)[:, None]
    DT: tl.constexpr = t_ws.dtype.element_ty
    b_kb = cast_like_gpu(b_k, DT, INTERPRET)
    b_qb = cast_like_gpu(b_q, DT, INTERPRET)
    p_hk = rows[:, None] * (HK * K) + i_hk * K + o_k[None, :]
    tl.store(qs_ws + p_hk, b_qb, mask=m_tk)
    tl.store(kn_ws + p_hk, b_kb, mask=m_tk)
    b_kk = dot_like_gpu(b_kb, tl.trans(b_kb), None, DOT_PREC, INTERPRET)
    b_qk = dot_like_gpu(b_qb, tl.trans(b_kb), None, DOT_PREC, INTERPRET)
    # P of every value head first, so that Q K^T is dead before the inverses (it would spill);
    # loops, not unrolled: one value head's temporaries live at a time
    for j in range(G):
        i_h = i_hk * G + j
        b_gc, b_beta, b_dec = _intra_gates(i_h, rows, m_t, a, b, A_log, dt_bias, s_at, s_bt, BC)
        tl.store(p_ws + rows[:, None] * (HV * BC) + i_h * BC + o_c[None, :],
                 cast_like_gpu(b_dec * b_qk, p_ws.dtype.element_ty, INTERPRET), mask=m_t[:, None])
        tl.store(g_ws + rows * HV + i_h, b_gc, mask=m_t)
    for j in range(G):
        _intra_inverse(b_kk, i_hk * G + j, rows, m_t, a, b, A_log, dt_bias, t_ws, s_at, s_bt,
                       HV, BC, INV_PREC, INTERPRET)


@triton.jit
def _intra_gates(i_h, rows, m_t, a, b, A_log, dt_bias, s_at, s_bt, BC: tl.constexpr):
    """Value head i_h's gates on a chunk's rows (fp32; invalid rows get g = 0 and beta = 0 so
    they change nothing): the cumsum gc of g, beta, and the decay exp(gc_t - gc_s) for s <= t
    (<= 1: g <= 0), zero above the diagonal (masking before exp keeps that half from
    overflowing)."""
    b_a = tl.load(a + rows * s_at + i_h, mask=m_t, other=0.).to(tl.float32)
    b_b = tl.load(b + rows * s_bt + i_h, mask=m_t, other=0.).to(tl.float32)
    neg_A = -tl.exp(tl.load(A_log + i_h).to(tl.float32))
    b_g, b_beta = gdn_gate(b_a, b_b, neg_A, tl.load(dt_bias + i_h).to(tl.float32))
    b_g = tl.where(m_t, b_g, 0.)
    b_beta = tl.where(m_t, b_beta, 0.)
    b_gc = tl.cumsum(b_g, 0)
    o_c = tl.arange(0, BC)
    m_le = o_c[None, :] <= o_c[:, None]
    b_dec = tl.where(m_le, tl.exp(tl.where(m_le, b_gc[:, None] - b_gc[None, :], 0.)), 0.)
    return b_gc, b_beta, b_dec


@triton.jit
def _intra_inverse(b_kk, i_h, rows, m_t, a, b, A_log, dt_bias, t_ws, s_at, s_bt,
                   HV: tl.constexpr, BC: tl.constexpr, INV_PREC: tl.constexpr,
                   INTERPRET: tl.constexpr):
    """Value head i_h's T' = (I + A)^-1 diag(beta) of a chunk into the workspace (b_kk: K K^T
    of its key head's normalised rows). Its gates are computed again here: 64 loads and
    exponentials a head, cheaper than keeping them live across the other head's inverse."""
    b_gc, b_beta, b_dec = _intra_gates(i_h, rows, m_t, a, b, A_log, dt_bias, s_at, s_bt, BC)
    o_c = tl.arange(0, BC)
    r = o_c[:, None]
    c = o_c[None, :]
    b_A = tl.where(c < r, b_dec * b_kk * b_beta[:, None], 0.)

    # (I + A)^-1. First D, the inverse of A's block diagonal: the four 16 x 16 diagonal blocks as
    # a [4, 16, 16] batch, Ad[i] = A[16i:16i+16, 16i:16i+16], inverted by forward substitution on
    # all four at once. X = D - I is strictly lower and row r of X is -Ad[r] - sum_{j<r} Ad[r, j]
    # X[j]; rows >= r of X still hold -Ad, whose entries at j >= r are zero, so the full sum is
    # right. (The batch, rather than the masked 64 x 64 tile, keeps the loop small and free of
    # barriers, and is much faster; measurements: profiling/results/2026-11-30/SUMMARY.md.)
    i4 = tl.arange(0, 4)
    on_diag = (i4[:, None] == i4[None, :])[:, None, :, None]
    b_X = -tl.sum(tl.where(on_diag, tl.reshape(b_A, [4, 16, 4, 16]), 0.), 2)
    r16 = tl.arange(0, 16)[None, :, None]
    for rr in range(2, 16):
        b_row = tl.sum(tl.where(r16 == rr, b_X, 0.), 1)
        b_row = b_row + tl.sum(b_row[:, :, None] * b_X, 1)
        b_X = tl.where(r16 == rr, b_row[:, None, :], b_X)
    b_X = b_X + tl.where(r16 == tl.arange(0, 16)[None, None, :], 1., 0.)
    b_D = tl.reshape(tl.where(on_diag, b_X[:, :, None, :], 0.), [BC, BC])
    # then the off-diagonal blocks: T = D - (D A_o) T, exact after 3 sweeps (block forward
    # substitution on 4 block rows)
    b_N = dot_like_gpu(b_D, tl.where((r // 16) > (c // 16), b_A, 0.), None, INV_PREC, INTERPRET)
    b_T = b_D
    for _ in tl.static_range(3):
        b_T = b_D - dot_like_gpu(b_N, b_T, None, INV_PREC, INTERPRET)

    # T' = T diag(beta), the chunk's whole contribution to v_new (the seq kernel forms
    # v_new = T' (v - exp(gc) k S0^T)): 64 values a row instead of the WY factors' K + V
    tl.store(t_ws + rows[:, None] * (HV * BC) + i_h * BC + c,
             cast_like_gpu(b_T * b_beta[None, :], t_ws.dtype.element_ty, INTERPRET), mask=m_t[:, None])


@triton.jit
def _seq_chunk(b_S, j, out, v, t_ws, p_ws, g_ws, qs_ws, kn_ws, ssm, ckpt_slots, error_flag,
               bos, eos, off, c0, n_end, first_blk, ck0, block_size, s_vt, s_ot, s_slot,
               max_ckpts, num_slots,
               i_h, i_hk, o_c, o_k, m_k, o_v, m_v, p_state, m_state,
               HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BC: tl.constexpr,
               DOT_PREC: tl.constexpr, ROUND_STATE: tl.constexpr, INTERPRET: tl.constexpr,
               HAS_FLAG: tl.constexpr):
    """Chunk j of one sequence for one (head, V tile): output rows, state update, checkpoint."""
    ce, m_t, rows = _chunk_rows(bos, eos, off, j, o_c, BC)
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    b_T = tl.load(t_ws + rows[:, None] * (HV * BC) + i_h * BC + o_c[None, :], mask=m_t[:, None],
                  other=0.)
    b_q = tl.load(qs_ws + rows[:, None] * (HK * K) + i_hk * K + o_k[None, :], mask=m_tk, other=0.)
    b_k = tl.load(kn_ws + rows[:, None] * (HK * K) + i_hk * K + o_k[None, :], mask=m_tk, other=0.)
    b_v = tl.load(v + rows[:, None] * s_vt + i_h * V + o_v[None, :], mask=m_tv, other=0.)
    b_P = tl.load(p_ws + rows[:, None] * (HV * BC) + i_h * BC + o_c[None, :], mask=m_t[:, None],
                  other=0.)
    b_gc = tl.load(g_ws + rows * HV + i_h, mask=m_t, other=0.)
    g_last = tl.load(g_ws + (ce - 1).to(tl.int64) * HV + i_h)

    DT: tl.constexpr = t_ws.dtype.element_ty
    # v_new = T' (v - exp(gc) k S0^T); o = exp(gc) (q S0^T) + P v_new
    b_Sb = cast_like_gpu(b_S, DT, INTERPRET)
    b_eg = tl.exp(b_gc)[:, None]
    b_x = b_v.to(tl.float32) - b_eg * dot_like_gpu(b_k, b_Sb, None, DOT_PREC, INTERPRET)
    b_vn = dot_like_gpu(b_T, cast_like_gpu(b_x, DT, INTERPRET), None, DOT_PREC, INTERPRET)
    b_o = dot_like_gpu(b_q, b_Sb, None, DOT_PREC, INTERPRET) * b_eg
    b_o = dot_like_gpu(b_P, cast_like_gpu(b_vn, DT, INTERPRET), b_o, DOT_PREC, INTERPRET)
    tl.store(out + rows[:, None] * s_ot + i_h * V + o_v[None, :],
             cast_like_gpu(b_o, out.dtype.element_ty, INTERPRET), mask=m_tv)
    # S = exp(gc_last) S0 + (exp(gc_last - gc) v_new)^T k   (as S^T: k^T (...))
    b_vs = b_vn * tl.where(m_t, tl.exp(g_last - b_gc), 0.)[:, None]
    b_S = b_S * tl.exp(g_last)
    b_S = dot_like_gpu(tl.trans(b_k), cast_like_gpu(b_vs, DT, INTERPRET), b_S, DOT_PREC, INTERPRET)

    p_end = (c0 + j + 1) * BC  # absolute end of this chunk when it is full
    at_block = (p_end % block_size) == 0
    if ROUND_STATE:  # keep the running state equal to what a block-boundary slot holds
        b_S = tl.where(at_block, cast_like_gpu(b_S, ssm.dtype.element_ty, INTERPRET).to(tl.float32), b_S)
    if at_block & (p_end < n_end):
        # entry e = p_end // B - first_blk - 1 >= 0 of the sequence's checkpoints; one past the
        # table stores nothing (the caller reported it)
        i_e = ck0 + (p_end // block_size - first_blk - 1)
        slot = tl.load(ckpt_slots + i_e, mask=i_e < max_ckpts, other=-1)
        if slot_ok(slot, num_slots):
            tl.store(ssm + slot.to(tl.int64) * s_slot + p_state,
                     cast_like_gpu(b_S, ssm.dtype.element_ty, INTERPRET), mask=m_state)
        report(error_flag, bad_slot(slot, num_slots), ERR_SLOT_C, HAS_FLAG)
    return b_S


@triton.heuristics({"HAS_FLAG": lambda args: args["error_flag"] is not None})
@triton.jit(do_not_specialize=["T", "max_ckpts", "num_slots"])
def _chunk_seq_kernel(
    out, v, t_ws, p_ws, g_ws, qs_ws, kn_ws, ssm,
    cu_seqlens, start_pos, read_slot, write_slot, ckpt_offsets, ckpt_slots, error_flag,
    T, max_ckpts, num_slots, block_size, s_vt, s_ot, s_slot,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,
    DOT_PREC: tl.constexpr, NUM_STAGES: tl.constexpr, ROUND_STATE: tl.constexpr,
    INTERPRET: tl.constexpr, HAS_FLAG: tl.constexpr,
):
    G: tl.constexpr = HV // HK
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0)
    i_v = pid % NV
    i_h = pid // NV
    i_hk = i_h // G
    i_n = tl.program_id(1)

    # the span clipped to [0, T) and the position to [0, MAX_POS) (no change for valid metadata):
    # every chunk below lies inside the tensors and the loop runs at most cdiv(T, BC) + 1 times
    bos, eos, clipped = clip_span(tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1), T)
    report(error_flag, clipped, ERR_TOKENS_C, HAS_FLAG)
    if eos <= bos:
        return
    n0, moved = clip_pos(tl.load(start_pos + i_n))
    report(error_flag, moved, ERR_TOKENS_C, HAS_FLAG)
    n_end = n0 + (eos - bos)
    off = n0 % BC
    c0 = n0 // BC
    nc = (n_end - 1) // BC - c0 + 1
    first_blk = n0 // block_size
    # the sequence's checkpoint entries ck0 .. ck0 + (its boundaries) must lie in ckpt_slots;
    # entries past its end store nothing (_seq_chunk masks them)
    ck00 = tl.load(ckpt_offsets + i_n)
    ck0 = tl.minimum(tl.maximum(ck00, 0), max_ckpts)
    report(error_flag, (ck0 != ck00) | (ck0 + (n_end - 1) // block_size - first_blk > max_ckpts),
           ERR_META_C, HAS_FLAG)

    o_c = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    # the state tile S^T: element [k, v] lives at ssm[slot, h, v, k]
    p_state = i_h * (V * K) + o_v[None, :] * K + o_k[:, None]
    m_state = m_k[:, None] & m_v[None, :]

    r_slot = tl.load(read_slot + i_n)
    r_ok = slot_ok(r_slot, num_slots)  # only pool slots are dereferenced (else slot 0, masked)
    b_S = tl.load(ssm + tl.where(r_ok, r_slot, 0).to(tl.int64) * s_slot + p_state,
                  mask=m_state & r_ok, other=0.).to(tl.float32)
    report(error_flag, bad_slot(r_slot, num_slots), ERR_SLOT_C, HAS_FLAG)

    # tl.range lets Triton software-pipeline the loads of the next chunk; the interpreter (numpy
    # >= 2) cannot take a loaded scalar as a range bound, so it runs the same body in a while loop
    if INTERPRET:
        j = 0
        while j < nc:
            b_S = _seq_chunk(b_S, j, out, v, t_ws, p_ws, g_ws, qs_ws, kn_ws, ssm, ckpt_slots,
                             error_flag, bos, eos, off, c0, n_end, first_blk, ck0, block_size,
                             s_vt, s_ot, s_slot, max_ckpts, num_slots,
                             i_h, i_hk, o_c, o_k, m_k, o_v, m_v, p_state, m_state,
                             HK, HV, K, V, BC, DOT_PREC, ROUND_STATE, INTERPRET, HAS_FLAG)
            j += 1
    else:
        for j in tl.range(0, nc, num_stages=NUM_STAGES):
            b_S = _seq_chunk(b_S, j, out, v, t_ws, p_ws, g_ws, qs_ws, kn_ws, ssm, ckpt_slots,
                             error_flag, bos, eos, off, c0, n_end, first_blk, ck0, block_size,
                             s_vt, s_ot, s_slot, max_ckpts, num_slots,
                             i_h, i_hk, o_c, o_k, m_k, o_v, m_v, p_state, m_state,
                             HK, HV, K, V, BC, DOT_PREC, ROUND_STATE, INTERPRET, HAS_FLAG)

    w_slot = tl.load(write_slot + i_n)
    w_ok = slot_ok(w_slot, num_slots)
    tl.store(ssm + tl.where(w_ok, w_slot, 0).to(tl.int64) * s_slot + p_state,
             cast_like_gpu(b_S, ssm.dtype.element_ty, INTERPRET), mask=m_state & w_ok)
    report(error_flag, bad_slot(w_slot, num_slots), ERR_SLOT_C, HAS_FLAG)


_fail = functools.partial(fail, "gdn_chunk_prefill")  # every message starts "gdn_chunk_prefill: "


def _check_inputs(q, k, v, a, b, A_log, dt_bias, ssm, meta, out, workspace):
    for name, t in dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm=ssm).items():
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a tensor")
        if not t.is_floating_point() or t.dtype not in FLOAT_DTYPES:
            _fail(f"{name} must be float32/bfloat16/float16, got {t.dtype}")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        _fail("q, k must be [T, HK, K] and v [T, HV, V]")
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    if k.shape != q.shape or v.shape[0] != T:
        _fail(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        _fail(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if HK < 1 or HV % HK:
        _fail(f"HV ({HV}) must be a multiple of HK ({HK})")
    if K < 16 or V < 16:
        _fail(f"K and V must be at least 16, got K={K}, V={V}")
    for name, t, d in (("q", q, K), ("k", k, K), ("v", v, V)):
        if t.stride(2) != 1 or t.stride(1) != d:
            _fail(f"{name} needs a contiguous last dim and head stride = head dim, got strides {t.stride()}")
    for name, t in (("a", a), ("b", b)):
        if tuple(t.shape) != (T, HV) or t.stride(1) != 1:
            _fail(f"{name} must be [T, HV] = {(T, HV)} with a contiguous last dim, got "
                  f"{tuple(t.shape)} strides {t.stride()}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if tuple(t.shape) != (HV,) or t.stride(0) != 1:
            _fail(f"{name} must be a contiguous [HV] = [{HV}] tensor, got {tuple(t.shape)}")
    if ssm.dim() != 4 or tuple(ssm.shape[1:]) != (HV, V, K):
        _fail(f"ssm must be [num_slots, HV, V, K] = [*, {HV}, {V}, {K}], got {tuple(ssm.shape)}")
    if ssm.stride(3) != 1 or ssm.stride(2) != K or ssm.stride(1) != V * K or ssm.stride(0) < HV * V * K:
        _fail(f"ssm's inner [HV, V, K] must be contiguous, got strides {ssm.stride()}")
    check_meta("gdn_chunk_prefill", meta, q.device, T, ref="q")
    for name, t in dict(k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm=ssm).items():
        if t.device != q.device:
            _fail(f"{name} is on {t.device}, q on {q.device}")
    if out is not None:
        if tuple(out.shape) != (T, HV, V) or out.dtype not in FLOAT_DTYPES:
            _fail(f"out must be a float [T, HV, V] = {(T, HV, V)} tensor, got {tuple(out.shape)} {out.dtype}")
        if out.stride(2) != 1 or out.stride(1) != V or out.device != q.device:
            _fail(f"out needs a contiguous last dim, head stride V and q's device, got strides {out.stride()}")
        # the seq kernel reads v (and the intra kernel q, k, a, b) while out is written
        name = first_overlap(out, dict(q=q, k=k, v=v, a=a, b=b))
        if name is not None:
            _fail(f"out must not overlap {name}")
    if workspace is not None:
        check_workspace("gdn_chunk_prefill", workspace, T, HK, HV, K, V, q.dtype, q.device)


def chunk_intra_fwd(q, k, a, b, A_log, dt_bias, out, ws: ChunkWorkspace, meta: ChunkMeta, scale: float,
                    num_warps: int = 4, dot_precision: str = "ieee", inv_precision: str = "ieee",
                    error_flag=None):
    """Launch the chunk-parallel kernel (no checks; see gdn_chunk_prefill): ws.t, p, g, qs, kn
    for every chunk, out's padding rows. Returns Triton's handle of the compiled kernel
    (registers, spills: ``.n_regs``, ``.n_spills``)."""
    T, HK, K = q.shape
    HV, V = ws.HV, ws.V
    n_cprog = max(meta.max_chunks, 1)
    return _chunk_intra_kernel[(n_cprog * HK,)](
        q, k, a, b, A_log, dt_bias, out,
        ws.t, ws.p, ws.g, ws.qs, ws.kn,
        meta.cu_seqlens, meta.start_pos, meta.chunk_seq, meta.chunk_idx, error_flag,
        T, meta.max_seqs, meta.max_chunks,
        q.stride(0), k.stride(0), a.stride(0), b.stride(0), out.stride(0),
        float(scale),
        HK=HK, HV=HV, K=K, V=V,
        BK=triton.next_power_of_2(K), BVF=triton.next_power_of_2(V), BC=CHUNK,
        DOT_PREC=dot_precision, INV_PREC=inv_precision, INTERPRET=interpreting(),
        num_warps=num_warps,
    )


def chunk_seq_fwd(out, v, ssm, ws: ChunkWorkspace, meta: ChunkMeta, HK: int,
                  bv: int = 32, num_warps: int = 4, num_stages: int = 2,
                  dot_precision: str = "ieee", error_flag=None):
    """Launch the sequential-over-chunks kernel (no checks; see gdn_chunk_prefill) after
    chunk_intra_fwd filled ``ws``; it reads v itself. The token count T is out's (the workspace
    holds at least as many)."""
    HV, K, V = ws.HV, ws.K, ws.V
    if meta.max_seqs == 0:
        return
    bv = min(bv, triton.next_power_of_2(V))
    grid = (HV * triton.cdiv(V, bv), meta.max_seqs)
    _chunk_seq_kernel[grid](
        out, v, ws.t, ws.p, ws.g, ws.qs, ws.kn, ssm,
        meta.cu_seqlens, meta.start_pos, meta.read_slot, meta.write_slot, meta.ckpt_offsets, meta.ckpt_slots,
        error_flag, out.shape[0], meta.ckpt_slots.shape[0], ssm.shape[0],
        meta.block_size, v.stride(0), out.stride(0), ssm.stride(0),
        HK=HK, HV=HV, K=K, V=V,
        BK=triton.next_power_of_2(K), BV=bv, BC=CHUNK,
        DOT_PREC=dot_precision, NUM_STAGES=num_stages, ROUND_STATE=ssm.dtype != torch.float32,
        INTERPRET=interpreting(), num_warps=num_warps,
    )


def chunk_intra_fwd_for(q, k, a, b, A_log, dt_bias, out, ws: ChunkWorkspace, meta: ChunkMeta, scale: float,
                        cfg: ChunkConfig, dot_precision: str, inv_precision: str, error_flag=None) -> bool:
    """The chunk-parallel kernel this model and device take for every step (no checks; see
    gdn_chunk_prefill): the Gluon one where ``gluon_intra_supported`` (Hopper, bf16 inputs,
    K = V = 128), else Triton's with ``cfg``'s warps. The two differ in T''s last bits, so the
    choice rests only on facts that do not change between an engine's steps (README "Conventions").
    The Gluon one leaves P to a Gluon sequential kernel at V tile 64 (``cfg``; GLUON_CONFIG),
    which makes P's bits itself: 16-18% off this kernel, 7-11% on that one, the pair 2-5% faster
    at 8 x 2048 and 4 x 16384 (H100, thirty-first stop, profiling/results/2026-12-07/SUMMARY.md;
    at V tile 128, one CTA an SM, it cost that kernel 11-15%, more than it saved). Returns whether
    that kernel must make P (own_p for chunk_seq_fwd_by)."""
    if gluon_intra_supported(q, ws.V):
        own_p = cfg.seq_kernel == "gluon" and cfg.bv == 64
        chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale, store_p=not own_p,
                              error_flag=error_flag)
        return own_p
    chunk_intra_fwd(q, k, a, b, A_log, dt_bias, out, ws, meta, scale, num_warps=cfg.warps_intra,
                    dot_precision=dot_precision, inv_precision=inv_precision, error_flag=error_flag)
    return False


def chunk_seq_fwd_by(cfg: ChunkConfig, out, v, ssm, ws: ChunkWorkspace, meta: ChunkMeta, HK: int,
                     dot_precision: str = "tf32", own_p: bool = False, error_flag=None):
    """The sequential kernel ``cfg`` names (Triton's, or the Gluon one on Hopper) with its knobs;
    no checks (see gdn_chunk_prefill). Both give the same bits. own_p: what chunk_intra_fwd_for
    returned (the Gluon kernel makes P; ws.p was not written)."""
    if cfg.seq_kernel == "gluon":
        chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK, bv=cfg.bv, own_p=own_p, error_flag=error_flag)
    else:
        chunk_seq_fwd(out, v, ssm, ws, meta, HK, bv=cfg.bv, num_warps=cfg.warps_seq,
                      num_stages=cfg.stages_for(ws.dtype), dot_precision=dot_precision,
                      error_flag=error_flag)


def gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, ssm, meta: ChunkMeta, out=None, scale=None,
                      workspace: ChunkWorkspace | None = None, config: ChunkConfig | None = None,
                      error_flag=None):
    """Chunked GatedDeltaNet prefill over a varlen batch, storing block states into the pool.

    Args:
        q, k: [T, HK, K]; v: [T, HV, V]; one float dtype (fp32, bf16, fp16). Last dim contiguous,
            head stride = head dim, token stride arbitrary (views of a packed qkv tensor work).
        a, b: [T, HV] gate inputs, last dim contiguous. A_log, dt_bias: [HV] (fp32 in models).
            g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), q and k l2-normalised,
            value head h uses key head h // (HV // HK).
        ssm: state pool [num_slots, HV, V, K] (fp32, or bf16/fp16); slot stride may exceed
            HV * V * K. MUTATED: for sequence i, ssm[write_slot[i]] gets the final state and
            ssm[ckpt_slots[ckpt_offsets[i] + e]] the state after (start_pos[i] // B + 1 + e) * B
            tokens (slot -1: nothing). ssm[read_slot[i]] is read first (-1: zero state); it may be
            one of the slots written. No other slot is touched; a slot outside [-1, num_slots)
            is treated as -1 (ERR_SLOT).
        meta: ChunkMeta (see gdn_graphs.ops.meta); T may exceed its live tokens cu_seqlens[-1].
            One built on the host must cover at most T tokens (ValueError); on the device, spans
            past T are clipped (ERR_TOKENS) and inconsistent tables skipped (ERR_META).
        out: [T, HV, V] (default: new, v's dtype), last dim contiguous, head stride V. MUTATED:
            live rows get the outputs, padding rows (>= cu_seqlens[-1]) zeros.
        scale: query scale, default K ** -0.5.
        workspace: ChunkWorkspace (max_tokens >= T, same HV, K, V, input dtype); default: a new one.
        config: ChunkConfig launch knobs (default: chunk_config(meta.num_seqs, q.dtype, HV,
            gluon_seq_supported(v, K)); every config gives the same bits). A Gluon config where
            that kernel cannot run is a ValueError.
        error_flag: optional int32 [>= 1]; gdn_graphs.ops.common's codes are OR-ed into element 0.
    Returns ``out``. Graph-safe: no host sync and no allocation when out and workspace are given.
    """
    _check_inputs(q, k, v, a, b, A_log, dt_bias, ssm, meta, out, workspace)
    check_flag("gdn_chunk_prefill", error_flag, q.device, ref="q")
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    # (whether the Gluon kernel can run is asked only where it matters: a default config, or one
    # that names it; the engine passes a config it chose the same way)
    if config is None:
        cfg = chunk_config(meta.num_seqs, q.dtype, HV, gluon_seq_supported(v, K))
    else:
        cfg = config
        if cfg.seq_kernel == "gluon" and not gluon_seq_supported(v, K):
            _fail("ChunkConfig(seq_kernel='gluon') needs Gluon, a Hopper GPU (sm_90), bf16 inputs, "
                  "K = V = 128 and v 16-byte aligned with a token stride that is a multiple of 16")
    if out is None:
        out = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    if T == 0:
        return out
    if workspace is None:
        workspace = ChunkWorkspace(T, HV, K, V, q.dtype, q.device, HK=HK)
    scale = K ** -0.5 if scale is None else float(scale)
    fp32 = q.dtype == torch.float32
    dot_prec = (cfg.dot_precision or "tf32x3") if fp32 else "tf32"  # ignored for 16-bit operands
    inv_prec = cfg.inv_precision or ("tf32x3" if fp32 else "tf32")
    own_p = chunk_intra_fwd_for(q, k, a, b, A_log, dt_bias, out, workspace, meta, scale, cfg, dot_prec,
                                inv_prec, error_flag=error_flag)
    chunk_seq_fwd_by(cfg, out, v, ssm, workspace, meta, HK, dot_precision=dot_prec, own_p=own_p,
                     error_flag=error_flag)
    return out
