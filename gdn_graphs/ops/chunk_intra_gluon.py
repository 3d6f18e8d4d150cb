"""chunk.py's chunk-parallel kernel written in Gluon for Hopper (sm_90): the same job and outputs
(T', P, gc, the normalised q and k in a ChunkWorkspace; zeros in out's padding rows), another
schedule of the in-chunk inverse.

``_intra_gluon_kernel`` (one CTA of one warp group per (chunk, key head))
    Every global load first (q and k rows, each value head's a and b rows); q and k are
    l2-normalised in fp32 (q times the scale), rounded to the input dtype, stored to the
    workspace and kept in shared memory for two wgmma: K K^T and Q K^T. Then for each value head
    of the key head, as ``_chunk_intra_kernel``:
        gc = cumsum(g),  dec[t, s] = exp(gc_t - gc_s) (s <= t)       -> g_ws
        P  = dec * Q K^T                                               -> p_ws
        A  = dec * K K^T * beta_t   (s < t)
        T' = (I + A)^-1 diag(beta)                                     -> t_ws
    The decay is 2^(log2(e) gc_t - log2(e) gc_s) on the SFU alone (``_exp2_ftz``). The inverse:
    the four 16 x 16 diagonal blocks by forward substitution, each warp owning one block and each
    lane one column, so that a row step is 16 fused multiply-adds in the lane's registers with the
    block's row broadcast from shared memory (the Triton kernel's row steps reduce across lanes
    and move each new row through shared memory); then the off-diagonal blocks by
    T = D - (D A_o) T, three sweeps, run transposed (T^T = D^T + T^T (-N)^T) as fp16 wgmma with
    fp32 accumulators: D and T^T are register operands, converted from the accumulator's layout
    without moving between lanes, A_o and -N are stored once (fp16 operands may be read MN- or
    K-major, so nothing is stored transposed).

Why it exists: the intra kernel is more than half of our prefill with several sequences, and its
row steps were ~23% of it. On an H100 this kernel ran 1.18-1.23x the Triton one at TP 1 and 2,
one to 32 sequences (profiling/results/2026-12-06/SUMMARY.md, twenty-seventh stop); with the
sweeps on fp16 (tf32 before: half the k-steps, no lane shuffles for the register operand, no
second decay for A_o^T), the decay on the SFU alone and the loads first, 1.33-1.44x the
twenty-eighth stop's kernel (twenty-ninth stop; 1,530 instructions a value head where it had
2,247). A version with fewer registers (three CTAs an SM: K K^T and Q K^T in shared memory,
maxnreg 168) ran 2-4% slower.

Numerics: fp16 operands keep tf32's 10-bit mantissa, and on the repeated-token case this kernel's
T' is closer to float64 than the tf32 kernel's (GPU test). A's entries are at most 1 in magnitude
(normalised k, beta and decays <= 1), but that does not bound D, N and T: an A whose inverse has
entries past 65504 would overflow fp16 here where tf32 would not (not seen on random or
repeated-token inputs; FlashInfer's fp16 inverse shares the limit). q, k and gc are the Triton
kernel's bits; P differs in ~0.1% of entries by the exp2 rounding, T' in its last bits (relative
3-4e-6 from the tf32 sweeps' T' on an H100). So an engine uses one of the two kernels for every
step (README "Conventions"), which ``gluon_intra_supported`` decides from facts of the model and
the device only.
Triton's interpreter cannot run Gluon: the CPU tier compiles this kernel for sm_90, the GPU tier
compares it with the Triton kernel, checks its inverse against float64 on the hard case, and
checks warm == cold on it.
"""

from __future__ import annotations

import torch
import triton

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.chunk_gluon import _is_sm90
from gdn_graphs.ops.common import (ERR_META_C, ERR_TOKENS_C, clip_pos, clip_span, gdn_gate, interpreting,
                                   report, span_chunks)
from gdn_graphs.ops.meta import ChunkMeta
from gdn_graphs.ops.workspace import ChunkWorkspace

try:  # Gluon ships with Triton >= 3.5 (experimental)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    HAS_GLUON = True
except ImportError:  # pragma: no cover - Triton without Gluon: Triton's kernel runs everywhere
    HAS_GLUON = False

__all__ = ["gluon_intra_supported", "chunk_intra_fwd_gluon"]


def gluon_intra_supported(q: torch.Tensor, V: int) -> bool:
    """Whether ``chunk_intra_fwd_gluon`` can run on q [T, HK, K] with value dim V: Gluon present and
    no interpreter, a Hopper GPU (sm_90), bf16 inputs (the dtype its GPU tests ran; fp16 compiles),
    K = V = 128. Every fact is a constant of the model and the device, so an engine takes one
    intra kernel for all its steps."""
    if not HAS_GLUON or interpreting() or q.device.type != "cuda":
        return False
    if q.dtype != torch.bfloat16 or q.dim() != 3 or (q.shape[2], V) != (128, 128):
        return False
    return _is_sm90(q.device.index if q.device.index is not None else torch.cuda.current_device())


if HAS_GLUON:
    @gluon.jit
    def _add(x, y):
        return x + y

    @gluon.jit
    def _exp2_ftz(x):
        """2^x by the SFU alone (results below 2^-126 flush to zero: decays that small change no
        sum; gl.exp spends four more instructions an element keeping them)."""
        return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _diag_inverse(ad_s, L3: gl.constexpr):
        """D - I for the four 16 x 16 diagonal blocks Ad[b] of A held in ad_s [4, 16, 16] (fp32,
        Ad[b, r, c] = A[16 b + r, 16 b + c]), where D[b] = (I + Ad[b])^-1: [4, 16, 16] in L3, each
        lane holding one column of one block in its registers. Row r of X = D - I is
        -Ad[r] - sum_{j<r} Ad[r, j] X[j]; rows >= r still hold -Ad, whose coefficients Ad[r, j>=r]
        are zero, so the sum may run over all 16 rows."""
        X = -ad_s.load(L3)
        r3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3))), 0), 2)
        for rr in gl.static_range(2, 16):
            coef = ad_s.slice(rr, 1, 1).permute((0, 2, 1)).load(L3)  # [4, 16 (j), 1]: Ad[b, rr, j]
            X = gl.where(r3 == rr, X - gl.expand_dims(gl.sum(coef * X, 1), 1), X)
        return X

    @gluon.jit
    def _gates(ga, gb, A_log, dt_bias, i_h, m1, L64: gl.constexpr):
        """Value head i_h's gates on a chunk's rows from its a and b rows ga, gb (fp32, 0 on invalid
        rows), as chunk.py's _intra_gates (invalid rows: g = 0, beta = 0, so they change nothing):
        gc = cumsum(g) and beta in ga's layout, and the decay exp(gc_t - gc_s) (s <= t, else 0) in
        L64. (The scan runs in a 1-D layout: Gluon's scan does not take a slice of the wgmma
        layout.)"""
        neg_A = -gl.exp(gl.load(A_log + i_h).to(gl.float32))
        g, beta = gdn_gate(ga, gb, neg_A, gl.load(dt_bias + i_h).to(gl.float32))
        gc = gl.associative_scan(gl.where(m1, g, 0.), 0, _add)
        gc2 = gc * 1.4426950408889634  # log2(e): the decay as 2^(gc2_t - gc2_s)
        gr = gl.convert_layout(gc2, gl.SliceLayout(1, L64))
        gcol = gl.convert_layout(gc2, gl.SliceLayout(0, L64))
        rr = gl.arange(0, gr.shape[0], layout=gl.SliceLayout(1, L64))
        cc = gl.arange(0, gr.shape[0], layout=gl.SliceLayout(0, L64))
        dec = gl.where(cc[None, :] <= rr[:, None], _exp2_ftz(gr[:, None] - gcol[None, :]), 0.)
        return gc, gl.where(m1, beta, 0.), dec

    @gluon.jit(do_not_specialize=["T", "max_seqs", "max_chunks", "s_at", "s_bt"])
    def _intra_gluon_kernel(q, k, a, b, A_log, dt_bias, out, t_ws, p_ws, g_ws, qs_ws, kn_ws,
                            cu_seqlens, start_pos, chunk_seq, chunk_idx, error_flag,
                            T, max_seqs, max_chunks, s_qt, s_kt, s_at, s_bt, s_ot, scale,
                            HK: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                            BC: gl.constexpr, STORE_P: gl.constexpr, HAS_FLAG: gl.constexpr):
        gl.static_assert(K == 128)
        gl.static_assert(V == 128)
        gl.static_assert(BC == 64)
        G: gl.constexpr = HV // HK
        pid = gl.program_id(0)
        i_hk = pid % HK
        i_c = pid // HK
        n_cprog = gl.num_programs(0) // HK

        # layouts: coalesced [64, 128] rows (16 bytes a thread), the wgmma accumulator [64, 64],
        # the inverse's [4 blocks, 16 rows, 16 columns] (a warp a block, a lane a column: the rows
        # in its registers; 16 columns on 32 lanes, each held twice), and [64, 16] block columns
        LD: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        L64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BC, 16])
        L3: gl.constexpr = gl.BlockedLayout([1, 16, 1], [1, 1, 32], [4, 1, 1], [1, 2, 0])
        LB: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [4, 1], [1, 0])
        LO: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-bit rows of 64: 128 bytes a row
        DOTA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L64, k_width=2)  # 16-bit A from registers
        PLAIN2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        PLAIN3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        DT: gl.constexpr = qs_ws.dtype.element_ty
        SHK: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BC, K], DT)
        SH16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BC, BC], gl.float16)

        r_ld = gl.arange(0, BC, layout=gl.SliceLayout(1, LD))
        c_ld = gl.arange(0, K, layout=gl.SliceLayout(0, LD))

        # Padding tokens (beyond the live batch) get zero outputs, shared out over all programs of
        # this key head with a grid-stride loop (_chunk_intra_kernel's, the same repair)
        t_live0 = gl.load(cu_seqlens + max_seqs)
        t_live = gl.minimum(gl.maximum(t_live0, 0), T)
        report(error_flag, (pid == 0) & (t_live != t_live0), ERR_TOKENS_C, HAS_FLAG)
        n_pad = gl.cdiv(T - t_live, BC)
        zeros_o = gl.zeros([BC, V], out.dtype.element_ty, LD)
        tile = i_c
        while tile < n_pad:
            prow = t_live + tile * BC + r_ld
            for j in gl.static_range(G):
                gl.store(out + prow.to(gl.int64)[:, None] * s_ot + (i_hk * G + j) * V + c_ld[None, :],
                         zeros_o, mask=(prow < T)[:, None])
            tile += n_cprog

        if i_c >= max_chunks:
            return
        i_n = gl.load(chunk_seq + i_c)
        report(error_flag, (i_n < -1) | (i_n >= max_seqs), ERR_META_C, HAS_FLAG)
        if (i_n < 0) | (i_n >= max_seqs):
            return
        i_j = gl.load(chunk_idx + i_c)
        bos, eos, clipped = clip_span(gl.load(cu_seqlens + i_n), gl.load(cu_seqlens + i_n + 1), T)
        n, moved = clip_pos(gl.load(start_pos + i_n))
        bad_j = (i_j < 0) | (i_j >= span_chunks(n, eos - bos, BC))
        report(error_flag, clipped | moved, ERR_TOKENS_C, HAS_FLAG)
        report(error_flag, bad_j, ERR_META_C, HAS_FLAG)
        if bad_j:
            return
        off = n % BC
        cs = bos + gl.maximum(i_j * BC - off, 0)  # chunk.py's _chunk_rows
        n_t = gl.minimum(bos + (i_j + 1) * BC - off, eos) - cs

        # every global load of the CTA first: k, q and all its value heads' a and b rows (issued
        # after a store to the workspace, a load waits one memory latency more: the compiler
        # cannot move it above a store it cannot tell apart from it)
        row_ld = (cs + r_ld).to(gl.int64)[:, None]
        m_ld = (r_ld < n_t)[:, None]
        p_hk = row_ld * (HK * K) + i_hk * K + c_ld[None, :]
        k_raw = gl.load(k + row_ld * s_kt + i_hk * K + c_ld[None, :], mask=m_ld, other=0.)
        q_raw = gl.load(q + row_ld * s_qt + i_hk * K + c_ld[None, :], mask=m_ld, other=0.)
        G2: gl.constexpr = triton.next_power_of_2(G)
        LG: gl.constexpr = gl.BlockedLayout([1, G2], [32, 1], [4, 1], [1, 0])  # a row's heads in a thread
        rg = gl.arange(0, BC, layout=gl.SliceLayout(1, LG))
        hg = gl.arange(0, G2, layout=gl.SliceLayout(0, LG))
        mg = (rg < n_t)[:, None] & (hg < G)[None, :]
        p_g = (cs + rg).to(gl.int64)[:, None]
        ga_all = gl.load(a + p_g * s_at + i_hk * G + hg[None, :], mask=mg, other=0.).to(gl.float32)
        gb_all = gl.load(b + p_g * s_bt + i_hk * G + hg[None, :], mask=mg, other=0.).to(gl.float32)

        # l2-normalised k and scaled q (fp32, then the operand dtype), once per key head, one
        # after the other (fewer live registers), into the workspace and shared memory
        kx = k_raw.to(gl.float32)
        kb = (kx * gl.rsqrt(gl.sum(kx * kx, 1) + 1e-6)[:, None]).to(DT)
        gl.store(kn_ws + p_hk, kb, mask=m_ld)
        k_s = gl.allocate_shared_memory(DT, [BC, K], SHK, kb)
        qx = q_raw.to(gl.float32)
        qb = (qx * (gl.rsqrt(gl.sum(qx * qx, 1) + 1e-6) * scale)[:, None]).to(DT)
        gl.store(qs_ws + p_hk, qb, mask=m_ld)
        if STORE_P:
            q_s = gl.allocate_shared_memory(DT, [BC, K], SHK, qb)
        fence_async_shared()
        gl.thread_barrier()
        zero = gl.zeros([BC, BC], gl.float32, L64)
        if STORE_P:
            KK = warpgroup_mma(k_s, k_s.permute((1, 0)), zero, is_async=True)
            QK = warpgroup_mma(q_s, k_s.permute((1, 0)), zero, is_async=True)
            KK, QK = warpgroup_mma_wait(0, deps=(KK, QK))
        else:  # Q K^T only feeds P
            KK = warpgroup_mma(k_s, k_s.permute((1, 0)), zero)

        rr = gl.arange(0, BC, layout=gl.SliceLayout(1, L64))
        cc = gl.arange(0, BC, layout=gl.SliceLayout(0, L64))
        row64 = (cs + rr).to(gl.int64)
        m64 = rr < n_t
        ro = gl.arange(0, BC, layout=gl.SliceLayout(1, LO))
        co = gl.arange(0, BC, layout=gl.SliceLayout(0, LO))
        rowo = (cs + ro).to(gl.int64)
        mo = ro < n_t
        L1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        r1 = gl.arange(0, BC, layout=L1)
        row1 = (cs + r1).to(gl.int64)
        m1 = r1 < n_t
        # A, then D, swizzled: 16-byte units XOR the row, so that the wgmma layout's 8-byte stores
        # and loads (a warp's 8 rows x 4 column pairs) take two wavefronts, not 8 (unswizzled
        # every row starts on bank 0: ncu counted 3-4-way conflicts over the kernel, call 5)
        a_s = gl.allocate_shared_memory(gl.float32, [BC, BC], gl.SwizzledSharedLayout(4, 1, 8, [1, 0]))
        ad_s = gl.allocate_shared_memory(gl.float32, [BC, 16], PLAIN2)    # A's diagonal blocks, then D's
        ad3_s = ad_s._reinterpret(gl.float32, [4, 16, 16], PLAIN3)      # the same, as [block, row, col]
        ao_s = gl.allocate_shared_memory(gl.float16, [BC, BC], SH16)      # fp16 wgmma operands: A_o
        n_s = gl.allocate_shared_memory(gl.float16, [BC, BC], SH16)       # and -N
        rb = gl.arange(0, BC, layout=gl.SliceLayout(1, LB))
        d3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3))), 0), 2)
        e3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3))), 0), 1)
        # (one value head at a time with everything in registers: a version that computed every
        # P first and read D back from shared memory, for fewer registers and three CTAs an SM,
        # ran 1.2x slower on an H100)
        for jh in range(G):
            i_h = i_hk * G + jh
            sel = hg[None, :] == jh  # head jh's column of the prefetched rows (a thread's own registers)
            ga = gl.convert_layout(gl.sum(gl.where(sel, ga_all, 0.), 1), L1)
            gb = gl.convert_layout(gl.sum(gl.where(sel, gb_all, 0.), 1), L1)
            gc1, beta1, dec = _gates(ga, gb, A_log, dt_bias, i_h, m1, L64)
            gl.store(g_ws + row1 * HV + i_h, gc1, mask=m1)
            if STORE_P:  # (else the Gluon sequential kernel makes these bits itself: OWN_P)
                gl.store(p_ws + row64[:, None] * (HV * BC) + i_h * BC + cc[None, :],
                         (dec * QK).to(p_ws.dtype.element_ty), mask=m64[:, None])
            beta = gl.convert_layout(beta1, gl.SliceLayout(1, L64))
            A = gl.where(cc[None, :] < rr[:, None], dec * KK * beta[:, None], 0.)

            # the diagonal blocks' inverses: A through shared memory into ad_s, rows in registers
            gl.thread_barrier()  # the previous head's readers of a_s, ad_s, ao_s, n_s are done
            a_s.store(A)
            ao_s.store(gl.where((cc // 16)[None, :] < (rr // 16)[:, None], A, 0.).to(gl.float16))  # A_o
            fence_async_shared()  # (read by wgmma below)
            gl.thread_barrier()
            for blk in gl.static_range(4):
                ad_s.slice(16 * blk, 16, 0).store(a_s.slice(16 * blk, 16, 0).slice(16 * blk, 16, 1).load(LB))
            gl.thread_barrier()
            X = _diag_inverse(ad3_s, L3)
            gl.thread_barrier()  # every lane has read its coefficients
            ad3_s.store(X + gl.where(d3 == e3, 1., 0.))
            gl.thread_barrier()
            # D = blockdiag(D[b]) into a_s, a block column at a time (zeros off the diagonal)
            Dst = ad_s.load(LB)  # row 16 b + r: D[b, r, :]
            for blk in gl.static_range(4):
                a_s.slice(16 * blk, 16, 1).store(gl.where((rb // 16 == blk)[:, None], Dst, 0.))
            gl.thread_barrier()
            D = a_s.load(L64)
            Dt = a_s.permute((1, 0)).load(L64)
            # the off-diagonal blocks: T = D - (D A_o) T, exact after three sweeps, run transposed,
            # T^T = D^T + T^T (-N)^T with N = D A_o, on fp16 wgmma with fp32 accumulators (fp16
            # keeps tf32's 10-bit mantissa; FlashInfer's inverse is fp16 too): every register
            # operand (D, then T^T) goes from the accumulator's layout to the A operand's without
            # moving between lanes, and A_o is read as stored (fp16 operands may be MN-major)
            N = warpgroup_mma(gl.convert_layout(D.to(gl.float16), DOTA), ao_s, gl.zeros([BC, BC], gl.float32, L64))
            n_s.store((-N).to(gl.float16))
            fence_async_shared()
            gl.thread_barrier()
            Tt = Dt
            for _ in gl.static_range(3):
                Tt = warpgroup_mma(gl.convert_layout(Tt.to(gl.float16), DOTA), n_s.permute((1, 0)), Dt)
            # T' = T diag(beta): T^T's registers transposed, so out through a layout whose stores
            # run along T' rows (P, stored straight from the wgmma layout, ran as fast as through
            # this one: s28_gpu/probe_intra.py)
            betar = gl.convert_layout(beta1, gl.SliceLayout(1, L64))
            Tq = gl.permute((Tt * betar[:, None]).to(t_ws.dtype.element_ty), (1, 0))
            gl.store(t_ws + rowo[:, None] * (HV * BC) + i_h * BC + co[None, :], gl.convert_layout(Tq, LO),
                     mask=mo[:, None])


def chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws: ChunkWorkspace, meta: ChunkMeta,
                          scale: float, store_p: bool = True, error_flag=None):
    """Launch the Gluon chunk-parallel kernel (no checks; see chunk.gdn_chunk_prefill): the effects
    of chunk.chunk_intra_fwd (ws.t, p, g, qs, kn for every chunk, out's padding rows), T' and P
    within 16-bit rounding of its. store_p False: ws.p is not written (the Gluon sequential
    kernel with own_p makes P itself). Only where ``gluon_intra_supported``."""
    T, HK, K = q.shape
    HV, V = ws.HV, ws.V
    n_cprog = max(meta.max_chunks, 1)
    return _intra_gluon_kernel[(n_cprog * HK,)](
        q, k, a, b, A_log, dt_bias, out, ws.t, ws.p, ws.g, ws.qs, ws.kn,
        meta.cu_seqlens, meta.start_pos, meta.chunk_seq, meta.chunk_idx, error_flag,
        T, meta.max_seqs, meta.max_chunks, q.stride(0), k.stride(0), a.stride(0), b.stride(0),
        out.stride(0), float(scale),
        HK=HK, HV=HV, K=K, V=V, BC=CHUNK, STORE_P=store_p, HAS_FLAG=error_flag is not None,
        num_warps=4)
