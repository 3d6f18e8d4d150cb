"""The Triton kernels around FlashInfer's chunk prefill (gdn_graphs.ops.fi_prefill uses them).

FlashInfer's SM90 ``chunk_gated_delta_rule`` wants contiguous, already l2-normalised q and k,
alpha = exp(g) and beta = sigmoid(b) in fp32, int64 cu_seqlens, one initial state per sequence
(not indexed by slot) and writes its checkpoints into a side tensor. Four kernels adapt our
contract (views of the conv output, gate inputs a and b, a slot-indexed pool) to it, each for a
group of consecutive sequences seq0 .. seq0 + num_seqs - 1 (all of them unless the call has more
than the workspace holds; ``seq0`` indexes the meta's per-sequence entries, and the workspace
holds the group's tokens from its row 0: token ``base + r`` in row r, base = cu_seqlens[seq0],
0 for the first group):

``_fi_prep_kernel`` (one program per (token tile, key head))
    q, k -> l2-normalised (q not scaled: FlashInfer applies ``scale`` itself) in the input dtype;
    v copied contiguous (unless the conv wrote it there already: ``v_ready``); alpha = exp(g), beta = sigmoid(b) in fp32 for the key head's value heads;
    the caller's output rows past every group's tokens zeroed (by the last group: FlashInfer
    writes only its sequences' rows), and the workspace rows past the group's tokens zeroed, up
    to ``T_ws`` in a call of one group, 63 rows in a call of several (FlashInfer's TMA tiles of
    a final partial chunk read up to 63 rows past a span: masked by coefficients, so they must be
    finite; zeros there are what its loads read past the end of an exact-size tensor). Program
    (0, 0) also writes the int64 tables: cu64 (the group's cu_seqlens clipped to [base, T], made
    non-decreasing, minus base) and ckcu, the exclusive cumsum of len_i // every (FlashInfer's
    checkpoint_cu_starts).
``_fi_gather_kernel`` (one program per (sequence, tile of its state))
    h0[i] = ssm[read_slot[seq0 + i]] (zeros for -1 or a slot outside the pool, ERR_SLOT for the latter).
``_fi_scatter_kernel`` (one program per (FlashInfer checkpoint or sequence, tile of a state))
    FlashInfer's checkpoint c of sequence i holds the state after (c - ckcu[i] + 1) * every tokens
    of the span, i.e. at absolute position p = n_i + that; when p is a multiple of the block size
    B strictly inside the span, it is our checkpoint entry p // B - n_i // B - 1 and goes to that
    slot. The last programs store each sequence's final state (FlashInfer's output_state) into its
    write slot. Index formulas, clipping and error codes are chunk.py's: a slot outside
    [-1, num_slots) is never dereferenced (ERR_SLOT), an entry past ckpt_slots stores nothing,
    offsets outside the table are clipped (ERR_META). A sequence whose start is not a multiple of
    ``every`` has no FlashInfer checkpoint on its block boundaries: it stores no checkpoint and
    reports ERR_META (the host chooses ``every`` so this does not happen).
``_fi_out_kernel`` (one program per (token tile, value head))
    out[base + r] = the workspace's out[r] for the group's r < cu64[num_seqs] (a copy).

All grids depend on buffer sizes and host ints only; idle programs exit at once. The gather and
scatter grids are flat with a state's tiles fastest, so programs that run together copy
neighbouring bytes of one state (gdn_decode's reason: a grid with the state index fastest makes
them stride by whole states, and fewer DRAM channels work).
"""

from __future__ import annotations

import triton
import triton.language as tl

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.common import (ERR_META_C, ERR_SLOT_C, ERR_TOKENS_C, bad_slot, cast_like_gpu,
                                   clip_pos, gdn_gate, inv_l2norm, report, slot_ok)

__all__ = ["fi_prep", "fi_gather", "fi_scatter", "fi_out"]

STATE_TILE = 4096  # elements of a state copied by one program (16 KiB of fp32)
CHUNK_C = tl.constexpr(CHUNK)


@triton.jit
def _max_fn(a, b):
    return tl.maximum(a, b)


@triton.jit
def _group_base(cu_seqlens, seq0, T):
    """The first token of the group of sequences from seq0: 0 for the first group (so a call of
    one group reads and writes the rows it always did), else cu_seqlens[seq0] clipped to [0, T].
    The workspace holds the group's tokens from its row 0. (seq0 < num_seqs <= max_seqs: the
    load is inside the table.)"""
    first = tl.minimum(tl.maximum(tl.load(cu_seqlens + seq0), 0), T)
    return tl.where(seq0 > 0, first, 0)


@triton.jit
def _live_cu(cu_seqlens, seq0, num_seqs, T, base, BS: tl.constexpr):
    """cu_seqlens[seq0 .. seq0 + num_seqs] clipped to [base, T], made non-decreasing (a running
    max) and counted from base, as a [BS] vector (entries past num_seqs repeat the last), with
    the raw entries. FlashInfer needs spans of length >= 0."""
    o_s = tl.arange(0, BS)
    m_s = o_s <= num_seqs
    cu0 = tl.load(cu_seqlens + seq0 + o_s, mask=m_s, other=0)
    cu = tl.associative_scan(tl.where(m_s, tl.minimum(tl.maximum(cu0, base), T), base), 0, _max_fn)
    return o_s, m_s, cu0 - base, cu - base


@triton.jit
def _l2norm_rows(src, dst, s64, r64, s_t, i_hk, o_k, m_tk, m_lk, HK: tl.constexpr, K: tl.constexpr,
                 DT: tl.constexpr, INTERPRET: tl.constexpr):
    """dst[rows r64, i_hk] = l2norm(src[rows s64, i_hk]) (fp32 math, rounded once to DT); zeros
    where m_lk is off (rows past the live tokens)."""
    x = tl.load(src + s64[:, None] * s_t + i_hk * K + o_k[None, :], mask=m_lk, other=0.).to(tl.float32)
    x = x * inv_l2norm(x, 1)[:, None]
    tl.store(dst + r64[:, None] * (HK * K) + i_hk * K + o_k[None, :], cast_like_gpu(x, DT, INTERPRET),
             mask=m_tk)


@triton.heuristics({"HAS_FLAG": lambda args: args["error_flag"] is not None})
@triton.jit(do_not_specialize=["T", "T_ws", "seq0", "num_seqs", "ns_total", "max_seqs", "every",
                               "v_ready", "s_qt", "s_kt", "s_vt", "s_at", "s_bt", "s_ot"])
def _fi_prep_kernel(
    q, k, v, a, b, A_log, dt_bias, out,
    qn, kn, vc, alpha, beta, cu_seqlens, cu64, ckcu, error_flag,
    T, T_ws, seq0, num_seqs, ns_total, max_seqs, every, v_ready,
    s_qt, s_kt, s_vt, s_at, s_bt, s_ot,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
    INTERPRET: tl.constexpr, HAS_FLAG: tl.constexpr,
):
    G: tl.constexpr = HV // HK
    i_t = tl.program_id(0)
    i_hk = tl.program_id(1)
    base = _group_base(cu_seqlens, seq0, T)
    o_s, m_s, cu0, cu = _live_cu(cu_seqlens, seq0, num_seqs, T, base, BS)
    t_live = tl.max(cu, 0)  # the group's tokens
    if (i_t == 0) & (i_hk == 0):
        tl.store(cu64 + o_s, cu.to(tl.int64), mask=m_s)
        # len_i = cu[i + 1] - cu[i]: the next entry of the running max is max(cu[i], cu0[i + 1])
        nxt = tl.load(cu_seqlens + seq0 + o_s + 1, mask=o_s < num_seqs, other=0)
        nxt = tl.maximum(cu, tl.minimum(tl.maximum(nxt, base), T) - base)
        n_ck = tl.where(o_s < num_seqs, (nxt - cu) // every, 0).to(tl.int64)
        tl.store(ckcu + o_s, tl.cumsum(n_ck, 0) - n_ck, mask=m_s)
        report(error_flag, tl.sum(tl.where(m_s & (cu != cu0), 1, 0), 0) > 0, ERR_TOKENS_C, HAS_FLAG)
        # live tokens of sequences past ns_total would get no output: the host total was wrong
        report(error_flag, tl.load(cu_seqlens + max_seqs) != tl.load(cu_seqlens + ns_total),
               ERR_META_C, HAS_FLAG)

    rows = i_t * BT + tl.arange(0, BT)
    # workspace rows written: the tokens, then zeros up to T_ws (>= T) for a call of one group
    # (as before groups existed), 63 rows past the group's tokens in a call of several (what
    # FlashInfer's tiles read past its last span)
    m_t = (rows < T_ws) & (((seq0 == 0) & (num_seqs == ns_total)) | (rows < t_live + CHUNK_C - 1))
    live = rows < t_live
    r64 = rows.to(tl.int64)
    src = r64 + base  # the token each workspace row holds
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = tl.arange(0, BV)
    m_v = o_v < V
    m_tk = m_t[:, None] & m_k[None, :]
    m_lk = live[:, None] & m_k[None, :]
    DT: tl.constexpr = qn.dtype.element_ty
    # rows past the live tokens: zeros everywhere (the loads are masked off there)
    _l2norm_rows(q, qn, src, r64, s_qt, i_hk, o_k, m_tk, m_lk, HK, K, DT, INTERPRET)
    _l2norm_rows(k, kn, src, r64, s_kt, i_hk, o_k, m_tk, m_lk, HK, K, DT, INTERPRET)
    # the caller's padding rows (past every group's tokens): zeros, by the last group
    pad = (seq0 + num_seqs == ns_total) & (src < T) & (rows >= t_live)
    # v_ready: the conv wrote the live rows of v into the workspace already (conv_prefill's
    # tail_out); only the zero rows past them are written here
    copy_v = live & (v_ready == 0)
    m_vw = m_t & (~live | (v_ready == 0))
    for j in tl.static_range(G):
        i_h = i_hk * G + j
        x = tl.load(v + src[:, None] * s_vt + i_h * V + o_v[None, :], mask=copy_v[:, None] & m_v[None, :],
                    other=0.)
        tl.store(vc + r64[:, None] * (HV * V) + i_h * V + o_v[None, :], x.to(DT),
                 mask=m_vw[:, None] & m_v[None, :])
        tl.store(out + src[:, None] * s_ot + i_h * V + o_v[None, :],
                 tl.zeros([BT, BV], dtype=out.dtype.element_ty), mask=pad[:, None] & m_v[None, :])
        b_a = tl.load(a + src * s_at + i_h, mask=live, other=0.).to(tl.float32)
        b_b = tl.load(b + src * s_bt + i_h, mask=live, other=0.).to(tl.float32)
        neg_A = -tl.exp(tl.load(A_log + i_h).to(tl.float32))
        g, be = gdn_gate(b_a, b_b, neg_A, tl.load(dt_bias + i_h).to(tl.float32))
        # padding rows: alpha 1, beta 0 (no change of the state), as FlashInfer pads itself
        tl.store(alpha + r64 * HV + i_h, tl.where(live, tl.exp(g), 1.), mask=m_t)
        tl.store(beta + r64 * HV + i_h, tl.where(live, be, 0.), mask=m_t)


@triton.heuristics({"HAS_FLAG": lambda args: args["error_flag"] is not None})
@triton.jit(do_not_specialize=["seq0", "num_slots", "s_slot"])
def _fi_gather_kernel(ssm, h0, read_slot, error_flag, seq0, num_slots, s_slot,
                      N_ELEM: tl.constexpr, TILE: tl.constexpr, HAS_FLAG: tl.constexpr):
    N_TILE: tl.constexpr = (N_ELEM + TILE - 1) // TILE
    i_n = tl.program_id(0) // N_TILE  # a state's tiles fastest (module docstring)
    i_e = tl.program_id(0) % N_TILE
    o = i_e * TILE + tl.arange(0, TILE)
    slot = tl.load(read_slot + seq0 + i_n)
    ok = slot_ok(slot, num_slots)  # only pool slots are dereferenced (else zeros)
    x = tl.load(ssm + tl.where(ok, slot, 0).to(tl.int64) * s_slot + o, mask=(o < N_ELEM) & ok, other=0.)
    tl.store(h0 + i_n.to(tl.int64) * N_ELEM + o, x.to(tl.float32), mask=o < N_ELEM)
    report(error_flag, (i_e == 0) & bad_slot(slot, num_slots), ERR_SLOT_C, HAS_FLAG)


@triton.jit
def _copy_state(src, ssm, slot, num_slots, s_slot, o, N_ELEM: tl.constexpr):
    """ssm[slot] (the tile at offsets o) = src when slot names a pool slot; nothing otherwise."""
    if slot_ok(slot, num_slots):
        x = tl.load(src + o, mask=o < N_ELEM)
        tl.store(ssm + slot.to(tl.int64) * s_slot + o, x.to(ssm.dtype.element_ty), mask=o < N_ELEM)


@triton.heuristics({"HAS_FLAG": lambda args: args["error_flag"] is not None})
@triton.jit(do_not_specialize=["n_ck_prog", "seq0", "num_seqs", "max_ckpts", "num_slots", "s_slot",
                               "every", "block_size"])
def _fi_scatter_kernel(
    ssm, ck_states, h_final, cu64, ckcu, start_pos, write_slot, ckpt_offsets, ckpt_slots, error_flag,
    n_ck_prog, seq0, num_seqs, max_ckpts, num_slots, s_slot, every, block_size,
    N_ELEM: tl.constexpr, TILE: tl.constexpr, BS: tl.constexpr, HAS_FLAG: tl.constexpr,
):
    N_TILE: tl.constexpr = (N_ELEM + TILE - 1) // TILE
    pid = tl.program_id(0) // N_TILE  # a state's tiles fastest (module docstring)
    i_e = tl.program_id(0) % N_TILE
    o = i_e * TILE + tl.arange(0, TILE)
    if pid < n_ck_prog:  # FlashInfer's checkpoint c = pid
        o_s = tl.arange(0, BS)
        cks = tl.load(ckcu + o_s, mask=o_s <= num_seqs, other=0)
        if pid >= tl.max(cks, 0):  # past the checkpoints of this launch
            return
        # its sequence: the last i with ckcu[i] <= c (ckcu is non-decreasing, ckcu[0] = 0)
        i_n = tl.sum(tl.where((o_s >= 1) & (o_s <= num_seqs) & (cks <= pid), 1, 0), 0)
        c0 = tl.load(ckcu + i_n)
        bos = tl.load(cu64 + i_n).to(tl.int32)
        n_end0 = tl.load(cu64 + i_n + 1).to(tl.int32) - bos
        n, _ = clip_pos(tl.load(start_pos + seq0 + i_n))
        p = n + ((pid - c0).to(tl.int32) + 1) * every  # absolute position after that checkpoint
        n_end = n + n_end0
        if ((n % every) == 0) & ((p % block_size) == 0) & (p < n_end):
            ck0 = tl.minimum(tl.maximum(tl.load(ckpt_offsets + seq0 + i_n), 0), max_ckpts)
            i_c = ck0 + (p // block_size - n // block_size - 1)
            slot = tl.load(ckpt_slots + i_c, mask=i_c < max_ckpts, other=-1)
            _copy_state(ck_states + pid.to(tl.int64) * N_ELEM, ssm, slot, num_slots, s_slot, o, N_ELEM)
            report(error_flag, (i_e == 0) & bad_slot(slot, num_slots), ERR_SLOT_C, HAS_FLAG)
    else:  # sequence i_n's final state
        i_n = pid - n_ck_prog
        bos = tl.load(cu64 + i_n).to(tl.int32)
        q_len = tl.load(cu64 + i_n + 1).to(tl.int32) - bos
        if q_len <= 0:  # an empty span stores nothing (as chunk.py)
            return
        n, moved = clip_pos(tl.load(start_pos + seq0 + i_n))
        n_end = n + q_len
        ck00 = tl.load(ckpt_offsets + seq0 + i_n)
        ck0 = tl.minimum(tl.maximum(ck00, 0), max_ckpts)
        n_blk = (n_end - 1) // block_size - n // block_size  # boundaries strictly inside the span
        if i_e == 0:
            report(error_flag, moved, ERR_TOKENS_C, HAS_FLAG)
            report(error_flag, (ck0 != ck00) | (ck0 + n_blk > max_ckpts), ERR_META_C, HAS_FLAG)
            report(error_flag, (n_blk > 0) & ((n % every) != 0), ERR_META_C, HAS_FLAG)
        slot = tl.load(write_slot + seq0 + i_n)
        _copy_state(h_final + i_n.to(tl.int64) * N_ELEM, ssm, slot, num_slots, s_slot, o, N_ELEM)
        report(error_flag, (i_e == 0) & bad_slot(slot, num_slots), ERR_SLOT_C, HAS_FLAG)


@triton.jit(do_not_specialize=["T", "seq0", "num_seqs", "s_ot"])
def _fi_out_kernel(ws_out, out, cu_seqlens, cu64, T, seq0, num_seqs, s_ot,
                   HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr):
    i_h = tl.program_id(1)
    n_live = tl.load(cu64 + num_seqs)  # the group's tokens (its cu_seqlens from its first)
    if tl.program_id(0) * BT >= n_live:
        return
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    r64 = rows.to(tl.int64)
    src = r64 + _group_base(cu_seqlens, seq0, T)
    o_v = tl.arange(0, BV)
    m = (rows < n_live)[:, None] & (o_v < V)[None, :]
    x = tl.load(ws_out + r64[:, None] * (HV * V) + i_h * V + o_v[None, :], mask=m)
    tl.store(out + src[:, None] * s_ot + i_h * V + o_v[None, :], x, mask=m)


def fi_prep(q, k, v, a, b, A_log, dt_bias, out, ws, meta, num_seqs: int, every: int, error_flag=None,
            interpret: bool = False, block_t: int = 16, num_warps: int = 4, T_ws: int | None = None,
            seq0: int = 0, ns_total: int | None = None, v_ready: bool = False):
    """Launch the prep kernel (no checks; see gdn_fi_prefill) for the group of sequences
    seq0 .. seq0 + num_seqs - 1 of ns_total (default: all of them, seq0 = 0): ws.q/k/v/alpha/beta
    from row 0 (the group's tokens, then zeros and alpha 1: up to T_ws, default T = q.shape[0],
    for the first group, 63 rows for a later one), ws.cu64 and ws.ckcu[:num_seqs + 1] (counted
    from the group's first token), and, by the last group, out's padding rows (of its first T).
    v_ready: ws.v's live rows already hold v (a call of one group whose conv wrote them); v is
    then not read, and only ws.v's rows past the live tokens are written (zeros)."""
    T, HK, K = q.shape
    T_ws = T if T_ws is None else T_ws
    ns_total = num_seqs if ns_total is None else ns_total
    HV, V = v.shape[1], v.shape[2]
    # (the workspace's sequence capacity, not num_seqs: a constexpr that changed with the batch
    # would compile a new kernel after the warm-up)
    BS = triton.next_power_of_2(ws.max_seqs + 1)
    _fi_prep_kernel[(triton.cdiv(T_ws, block_t), HK)](
        q, k, v, a, b, A_log, dt_bias, out,
        ws.q, ws.k, ws.v, ws.alpha, ws.beta, meta.cu_seqlens, ws.cu64, ws.ckcu, error_flag,
        T, T_ws, seq0, num_seqs, ns_total, meta.max_seqs, every, int(bool(v_ready)),
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), out.stride(0),
        HK=HK, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V),
        BT=block_t, BS=BS, INTERPRET=interpret, num_warps=num_warps,
    )


def fi_gather(ssm, ws, meta, num_seqs: int, error_flag=None, seq0: int = 0):
    """Launch the gather of the initial states ws.h0[:num_seqs] from meta.read_slot[seq0:]."""
    n_elem = ssm[0].numel()
    _fi_gather_kernel[(num_seqs * triton.cdiv(n_elem, STATE_TILE),)](
        ssm, ws.h0, meta.read_slot, error_flag, seq0, ssm.shape[0], ssm.stride(0),
        N_ELEM=n_elem, TILE=STATE_TILE, num_warps=4)


def fi_scatter(ssm, ws, meta, num_seqs: int, n_ck: int, every: int, error_flag=None, seq0: int = 0):
    """Launch the scatter of ws.ckpt[:n_ck] (FlashInfer's checkpoints, every ``every`` tokens of
    each span) onto block boundaries and of ws.h0[:num_seqs] (final states) into write slots, for
    the sequences seq0 .. seq0 + num_seqs - 1 (their meta entries; ws's tables are the group's)."""
    n_elem = ssm[0].numel()
    _fi_scatter_kernel[((n_ck + num_seqs) * triton.cdiv(n_elem, STATE_TILE),)](
        ssm, ws.ckpt, ws.h0, ws.cu64, ws.ckcu, meta.start_pos, meta.write_slot, meta.ckpt_offsets,
        meta.ckpt_slots, error_flag, n_ck, seq0, num_seqs, meta.ckpt_slots.shape[0], ssm.shape[0],
        ssm.stride(0), every, meta.block_size,
        N_ELEM=n_elem, TILE=STATE_TILE, BS=triton.next_power_of_2(ws.max_seqs + 1), num_warps=4)


def fi_out(ws, out, meta, num_seqs: int, seq0: int = 0, block_t: int = 64, num_warps: int = 4):
    """Launch the copy of FlashInfer's outputs for the group seq0 .. seq0 + num_seqs - 1 (ws.out
    from row 0) into their rows of ``out`` (contiguous heads; its rows past the tokens are the
    prep's). Exact: a copy."""
    T, HV, V = out.shape
    _fi_out_kernel[(triton.cdiv(T, block_t), HV)](
        ws.out, out, meta.cu_seqlens, ws.cu64, T, seq0, num_seqs, out.stride(0),
        HV=HV, V=V, BV=triton.next_power_of_2(V), BT=block_t, num_warps=num_warps)
