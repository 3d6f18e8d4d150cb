"""chunk.py's sequential kernel written in Gluon for Hopper (sm_90): the same arithmetic in the same
order, so the same bits, faster where a batch has enough (sequence, value head) pairs to fill the
SMs.

``_seq_gluon_kernel`` (one CTA per (sequence, value head, BV rows of V), sequential over chunks)
    Holds the state S [BV, K] in fp32 registers, where Triton's kernel holds S^T [K, BV], so that S
    is the register (A) operand of every wgmma it enters instead of a copy through shared memory.
    Per chunk of 64 tokens, with S0 the entering state (transposes of chunk.py's products):
        XT  = S0 k^T,  OqT = S0 q^T                 [BV, 64]   (A = S0 rounded to 16 bits)
        xT  = v^T - XT * exp(gc)                    [BV, 64]
        vnT = bf16(xT) T'^T                         [BV, 64]   v_new^T
        oT  = OqT * exp(gc) + bf16(vnT) P^T         [BV, 64]   -> out
        S   = exp(gc_last) S0 + bf16(vnT * exp(gc_last - gc)) k     [BV, K]
    Every rounding and every accumulator is chunk.py's ``_seq_chunk``'s; the wgmma sums over the
    same index in the same order with the operands in swapped roles.
    Warp roles (``gl.warp_specialize``): a loader warp group (``_load_chunks``, 32 registers a
    thread) fills a two-stage shared-memory ring with each chunk's q, k, v, T' (and P) rows, its
    gc and its last gc by masked cp.async (rows outside the span read as zeros, as Triton's masked
    loads), each thread's copies arriving on the stage's ``ready`` mbarrier as they land; the
    chain's warp groups (``_chain``) wait on it, compute, store the output and the block states,
    and free the stage (``empty``). So the chain issues no copy and computes no address but its
    stores, and a chunk's loads run while the previous chunk computes. With OWN_P the chain
    makes P = dec * Q K^T itself from the q and k tiles (the Gluon intra kernel's bits:
    ``_decay``) and the intra kernel does not store it. The output tile is transposed through the
    chunk's v tile, so at V tile 64 with own P a CTA needs 105 KB of shared memory and 2 x 128
    threads x 128 registers, and two CTAs share an SM, one's arithmetic overlapping the other's
    waits on memory.

Why it exists: with several sequences Triton's kernel spends its time on the chain's latency and
on shared-memory copies of the state. With the loader warp group this kernel alone ran 1.34-1.44x
Triton's at 8 x 2048 (TP 1 and 2), 4 x 16384 and 32 x 512 on an H100 (the same kernel issuing its
own copies: 1.04-1.09x slower at V tile 64 with own P, 1.08-1.22x at 128), and the whole prefill
1.13-1.30x at 32 to 256 (sequence, value head) pairs, so ``chunk_config`` takes it from two
sequences and 32 pairs (profiling/results/2026-12-07/SUMMARY.md, thirty-third stop; README
"Conventions": a launch choice never changes a bit).

The same memory-safety repairs and error codes as ``_chunk_seq_kernel`` (gdn_graphs.ops.common).
K = V = 128 and bf16 inputs only (``gluon_seq_supported``; fp16 would compile the same way but has
not run on a GPU). Triton's interpreter cannot run
Gluon: the CPU tier compiles it for sm_90 (tests/test_chunk_gluon.py), the GPU tier compares its
bits with the Triton kernel's.
"""

from __future__ import annotations

import functools

import torch

from gdn_graphs.constants import CHUNK
from gdn_graphs.ops.common import (ERR_META_C, ERR_SLOT_C, ERR_TOKENS_C, bad_slot, clip_pos, clip_span,
                                   interpreting, report, slot_ok)
from gdn_graphs.ops.meta import ChunkMeta
from gdn_graphs.ops.workspace import ChunkWorkspace

try:  # Gluon ships with Triton >= 3.5 (experimental)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mbarrier
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    HAS_GLUON = True
except ImportError:  # pragma: no cover - Triton without Gluon: Triton's kernel runs everywhere
    HAS_GLUON = False

__all__ = ["HAS_GLUON", "gluon_seq_supported", "chunk_seq_fwd_gluon"]

LOADER_WARPS = 4   # the loader partition: a warp group issuing the chunks' masked cp.async
LOADER_REGS = 32   # its registers a thread (setmaxnreg); at V tile 64 the chain gets 224


@functools.lru_cache(maxsize=None)
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def gluon_seq_supported(v: torch.Tensor, K: int) -> bool:
    """Whether ``chunk_seq_fwd_gluon`` can run on v [T, HV, V] with key dim K (host facts only, no
    sync): Gluon present and no interpreter, a Hopper GPU (sm_90), bf16 v (the dtype its GPU tests
    ran), K = V = 128, and v's rows 16-byte aligned (cp.async copies 16 bytes: a token stride that
    is a multiple of 16 elements and a 16-byte aligned start, as in every packed qkv layout)."""
    if not HAS_GLUON or interpreting() or v.device.type != "cuda":
        return False
    if v.dtype != torch.bfloat16 or v.dim() != 3 or (K, v.shape[2]) != (128, 128):
        return False
    if v.stride(2) != 1 or v.stride(0) % 16 or v.data_ptr() % 16:
        return False
    return _is_sm90(v.device.index if v.device.index is not None else torch.cuda.current_device())


if HAS_GLUON:
    @gluon.jit
    def _issue_chunk(j, st, q_s, k_s, v_s, t_s, p_s, gc_s, gl_s, qs_ws, kn_ws, v, t_ws, p_ws, g_ws,
                     bos, eos, off, i_h, i_hk, i_v, s_vt,
                     HK: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                     BV: gl.constexpr, BC: gl.constexpr, OWN_P: gl.constexpr, LW: gl.constexpr):
        """cp.async chunk j's q, k, v, T' rows (and P's unless the kernel makes P: OWN_P), its
        cumulative log decays gc and its last one into stage st by the LW loader warps (rows
        outside the span: zeros, nothing read; Triton's masked loads)."""
        LD128: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [LW, 1], [1, 0])
        LD64: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [LW, 1], [1, 0])
        LDV: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BV // 8), BV // 8], [LW, 1], [1, 0])
        LG: gl.constexpr = gl.BlockedLayout([1], [32], [LW], [0])
        r128 = gl.arange(0, BC, layout=gl.SliceLayout(1, LD128))
        c128 = gl.arange(0, K, layout=gl.SliceLayout(0, LD128))
        r64 = gl.arange(0, BC, layout=gl.SliceLayout(1, LD64))
        c64 = gl.arange(0, BC, layout=gl.SliceLayout(0, LD64))
        rvv = gl.arange(0, BC, layout=gl.SliceLayout(1, LDV))
        cvv = gl.arange(0, BV, layout=gl.SliceLayout(0, LDV))
        rg = gl.arange(0, BC, layout=LG)
        r1 = gl.arange(0, 1, layout=LG)
        # rows count from the chunk's first token (chunk.py's _chunk_rows)
        cs = bos + gl.maximum(j * BC - off, 0)
        n_t = gl.minimum(bos + (j + 1) * BC - off, eos) - cs
        row128 = (cs + r128).to(gl.int64)[:, None]
        row64 = (cs + r64).to(gl.int64)[:, None]
        m128 = (r128 < n_t)[:, None]
        m64 = (r64 < n_t)[:, None]
        async_copy.async_copy_global_to_shared(q_s.index(st), qs_ws + row128 * (HK * K) + i_hk * K + c128[None, :],
                                               mask=m128)
        async_copy.async_copy_global_to_shared(k_s.index(st), kn_ws + row128 * (HK * K) + i_hk * K + c128[None, :],
                                               mask=m128)
        async_copy.async_copy_global_to_shared(v_s.index(st), v + (cs + rvv).to(gl.int64)[:, None] * s_vt
                                               + i_h * V + i_v * BV + cvv[None, :], mask=(rvv < n_t)[:, None])
        async_copy.async_copy_global_to_shared(t_s.index(st), t_ws + row64 * (HV * BC) + i_h * BC + c64[None, :],
                                               mask=m64)
        if not OWN_P:
            async_copy.async_copy_global_to_shared(p_s.index(st), p_ws + row64 * (HV * BC) + i_h * BC
                                                   + c64[None, :], mask=m64)
        async_copy.async_copy_global_to_shared(gc_s.index(st), g_ws + (cs + rg).to(gl.int64) * HV + i_h,
                                               mask=rg < n_t)
        async_copy.async_copy_global_to_shared(gl_s.index(st), g_ws + (cs + n_t - 1 + r1).to(gl.int64) * HV + i_h)

    @gluon.jit
    def _load_chunks(q_s, k_s, v_s, t_s, p_s, gc_s, gl_s, ready, empty, qs_ws, kn_ws, v, t_ws, p_ws,
                     g_ws, bos, eos, off, nc, i_h, i_hk, i_v, s_vt,
                     HK: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                     BV: gl.constexpr, BC: gl.constexpr, OWN_P: gl.constexpr, LW: gl.constexpr):
        """The loader partition: fills stage j % 2 with chunk j once the chain has freed it, and
        has every loader thread's copies arrive on ready[j % 2] as they land."""
        for j in range(nc):
            st = j % 2
            mbarrier.wait(empty.index(st), ((j // 2) & 1) ^ 1)  # (a fresh barrier passes parity 1)
            _issue_chunk(j, st, q_s, k_s, v_s, t_s, p_s, gc_s, gl_s, qs_ws, kn_ws, v, t_ws, p_ws, g_ws,
                         bos, eos, off, i_h, i_hk, i_v, s_vt, HK, HV, K, V, BV, BC, OWN_P, LW)
            async_copy.mbarrier_arrive(ready.index(st), increment_count=False)

    @gluon.jit
    def _decay(gc, n_t, LP: gl.constexpr):
        """exp(gc_t - gc_s) for s <= t < n_t, else 0: [BC, BC] in LP, the bits of chunk_intra_gluon's
        decay (its _gates and _exp2_ftz). The scaling by log2(e) is an explicit mul.rn: the
        compiler may not fuse it into the subtraction that follows, which it did where LP is the
        layout gc comes in (V tile 64: other bits, GPU probe), while the intra kernel's layout
        conversion in between keeps the two apart there."""
        gc2 = gl.inline_asm_elementwise("mul.rn.f32 $0, $1, 0f3FB8AA3B;", "=r,r", [gc], dtype=gl.float32,
                                        is_pure=True, pack=1)  # 0f3FB8AA3B: log2(e) in fp32
        r = gl.arange(0, gc.shape[0], layout=gl.SliceLayout(1, LP))
        c = gl.arange(0, gc.shape[0], layout=gl.SliceLayout(0, LP))
        gr = gl.convert_layout(gc2, gl.SliceLayout(1, LP))
        gcol = gl.convert_layout(gc2, gl.SliceLayout(0, LP))
        e = gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [gr[:, None] - gcol[None, :]],
                                      dtype=gl.float32, is_pure=True, pack=1)
        return gl.where((c[None, :] <= r[:, None]) & (r[:, None] < n_t), e, 0.)

    @gluon.jit
    def _chain(S, q_s, k_s, v_s, t_s, p_s, gc_s, gl_s, ready, empty, out, ssm, ckpt_slots, error_flag,
               bos, eos, off, nc, c0, n_end, first_blk, ck0, i_h, i_v, max_ckpts, num_slots,
               block_size, s_ot, s_slot,
               K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BC: gl.constexpr,
               ROUND_STATE: gl.constexpr, OWN_P: gl.constexpr, HAS_FLAG: gl.constexpr):
        """The default partition: the state chain over the chunks as they arrive, the output rows,
        the block-boundary and final states."""
        NW: gl.constexpr = BV // 16  # one warp per 16 rows of V: a warp group per 64
        # register layouts: wgmma accumulators [BV, K] and [BV, 64] (a warp group per 64 rows),
        # their A-operand forms, and a coalesced layout for the output rows
        LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, K, 16])
        L64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BC, 16])
        A64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L64, k_width=2)
        # P [64, 64] (OWN_P), its columns split between the warp groups
        LP: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4],
                                                     instr_shape=[16, BC // (NW // 4), 16])
        AS: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LS, k_width=2)
        LDV: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BV // 8), BV // 8], [NW, 1], [1, 0])
        L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        DT: gl.constexpr = q_s.dtype
        rv = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, LS))
        ck = gl.arange(0, K, layout=gl.SliceLayout(0, LS))
        p_state = i_h * (V * K) + rv[:, None] * K + ck[None, :]
        ct = gl.arange(0, BC, layout=gl.SliceLayout(0, L64))   # token of the chunk, as a column
        ro = gl.arange(0, BC, layout=gl.SliceLayout(1, LDV))   # token of the chunk, as a row
        co = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, LDV))
        zero64 = gl.zeros([BV, BC], gl.float32, L64)
        for j in range(nc):
            st = j % 2
            mbarrier.wait(ready.index(st), (j // 2) & 1)  # every loader thread's copies have landed
            fence_async_shared()  # before wgmma reads them through the async proxy
            cs = bos + gl.maximum(j * BC - off, 0)
            n_t = gl.minimum(bos + (j + 1) * BC - off, eos) - cs
            gc = gc_s.index(st).load(gl.SliceLayout(0, L64))
            g_last = gl.sum(gl_s.index(st).load(L1), 0)  # (one entry: a scalar)
            eg = gl.exp(gc)

            if OWN_P:  # P = dec * Q K^T with the intra kernel's operands, k-steps and decay: its bits
                QK = warpgroup_mma(q_s.index(st), k_s.index(st).permute((1, 0)),
                                   gl.zeros([BC, BC], gl.float32, LP))
                p_s.index(0).store((_decay(gc, n_t, LP) * QK).to(DT))
                fence_async_shared()
                gl.thread_barrier()
            Sb = gl.convert_layout(S.to(DT), A64)
            XT = warpgroup_mma(Sb, k_s.index(st).permute((1, 0)), zero64, is_async=True)
            OqT = warpgroup_mma(Sb, q_s.index(st).permute((1, 0)), zero64, is_async=True)
            XT, OqT = warpgroup_mma_wait(0, deps=(XT, OqT))
            xT = v_s.index(st).permute((1, 0)).load(L64).to(gl.float32) - XT * eg[None, :]
            vnT = warpgroup_mma(gl.convert_layout(xT.to(DT), A64), t_s.index(st).permute((1, 0)), zero64)
            oT = warpgroup_mma(gl.convert_layout(vnT.to(DT), A64), p_s.index(0 if OWN_P else st).permute((1, 0)),
                               OqT * eg[None, :], is_async=True)
            # v_new scaled in fp32, then rounded once (_seq_chunk's order)
            w = gl.where(ct < n_t, gl.exp(g_last - gc), 0.)
            vs = gl.convert_layout((vnT * w[None, :]).to(DT), AS)
            S = warpgroup_mma(vs, k_s.index(st), S * gl.exp(g_last), is_async=True)
            oT, S = warpgroup_mma_wait(0, deps=(oT, S))

            # the output rows, transposed through shared memory into coalesced stores: through the
            # chunk's v tile, whose entries each thread overwrites are those it read into xT (the
            # same layout), so no other warp still needs them; without a tile of its own a CTA
            # at bv 64 with own P needs 105 KB, and two fit an SM
            v_s.index(st).permute((1, 0)).store(oT.to(DT))
            gl.thread_barrier()
            o = v_s.index(st).load(LDV)
            gl.store(out + (cs + ro).to(gl.int64)[:, None] * s_ot + i_h * V + co[None, :],
                     o.to(out.dtype.element_ty), mask=(ro < n_t)[:, None])
            gl.thread_barrier()  # every chain warp is done with stage st ...
            mbarrier.arrive(empty.index(st))  # ... so the loader may refill it

            p_end = (c0 + j + 1) * BC  # absolute end of this chunk when it is full
            at_block = (p_end % block_size) == 0
            if ROUND_STATE:  # the running state equals what a block-boundary slot holds
                if at_block:
                    S = S.to(ssm.dtype.element_ty).to(gl.float32)
            if at_block & (p_end < n_end):
                i_e = ck0 + (p_end // block_size - first_blk - 1)
                slot = gl.load(ckpt_slots + i_e, mask=i_e < max_ckpts, other=-1)
                if slot_ok(slot, num_slots):
                    gl.store(ssm + slot.to(gl.int64) * s_slot + p_state, S.to(ssm.dtype.element_ty))
                report(error_flag, bad_slot(slot, num_slots), ERR_SLOT_C, HAS_FLAG)
        return S, p_state

    # (as _chunk_seq_kernel: T, the pool size and the checkpoint table's length change with the
    # engine's step, not the model; specialised, the first request would recompile the warm-up's)
    @gluon.jit(do_not_specialize=["T", "max_ckpts", "num_slots"])
    def _seq_gluon_kernel(out, v, t_ws, p_ws, g_ws, qs_ws, kn_ws, ssm,
                          cu_seqlens, start_pos, read_slot, write_slot, ckpt_offsets, ckpt_slots,
                          error_flag, T, max_ckpts, num_slots, block_size, s_vt, s_ot, s_slot,
                          HK: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                          BV: gl.constexpr, BC: gl.constexpr, ROUND_STATE: gl.constexpr,
                          OWN_P: gl.constexpr, HAS_FLAG: gl.constexpr,
                          LW: gl.constexpr, LOAD_REGS: gl.constexpr):
        gl.static_assert(K == 128)
        gl.static_assert(V == 128)
        NW: gl.constexpr = BV // 16  # one warp per 16 rows of V: a warp group per 64
        NV: gl.constexpr = V // BV
        G: gl.constexpr = HV // HK
        i_v = gl.program_id(0) % NV
        i_h = gl.program_id(0) // NV
        i_n = gl.program_id(1)
        i_hk = i_h // G

        # the repairs of _chunk_seq_kernel, with common.py's helpers (Gluon calls @triton.jit
        # scalar functions)
        bos, eos, clipped = clip_span(gl.load(cu_seqlens + i_n), gl.load(cu_seqlens + i_n + 1), T)
        report(error_flag, clipped, ERR_TOKENS_C, HAS_FLAG)
        if eos <= bos:
            return
        n0, moved = clip_pos(gl.load(start_pos + i_n))
        report(error_flag, moved, ERR_TOKENS_C, HAS_FLAG)
        n_end = n0 + (eos - bos)
        off = n0 % BC
        c0 = n0 // BC
        nc = (n_end - 1) // BC - c0 + 1
        first_blk = n0 // block_size
        ck00 = gl.load(ckpt_offsets + i_n)
        ck0 = gl.minimum(gl.maximum(ck00, 0), max_ckpts)
        report(error_flag, (ck0 != ck00) | (ck0 + (n_end - 1) // block_size - first_blk > max_ckpts),
                ERR_META_C, HAS_FLAG)

        LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, K, 16])
        DT: gl.constexpr = qs_ws.dtype.element_ty
        SH128: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BC, K], DT)
        SH64: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BC, BC], DT)
        SHV: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BC, BV], DT)
        PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # (rank of a stage: 1-D)
        # two stages of chunk tiles, filled by the loader partition; ready[s]: stage s landed
        # (every loader thread's copies arrive), empty[s]: the chain is done with it
        q_s = gl.allocate_shared_memory(DT, [2, BC, K], SH128)
        k_s = gl.allocate_shared_memory(DT, [2, BC, K], SH128)
        v_s = gl.allocate_shared_memory(DT, [2, BC, BV], SHV)
        t_s = gl.allocate_shared_memory(DT, [2, BC, BC], SH64)
        p_s = gl.allocate_shared_memory(DT, [1 if OWN_P else 2, BC, BC], SH64)  # (own P: made, used, done)
        gc_s = gl.allocate_shared_memory(gl.float32, [2, BC], PLAIN)
        gl_s = gl.allocate_shared_memory(gl.float32, [2, 1], PLAIN)
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(2):
            mbarrier.init(ready.index(s), count=32 * LW)
            mbarrier.init(empty.index(s), count=1)

        # the state S [BV, K]: element [v, k] at ssm[slot, h, v, k]
        rv = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, LS))
        ck = gl.arange(0, K, layout=gl.SliceLayout(0, LS))
        r_slot = gl.load(read_slot + i_n)
        r_ok = slot_ok(r_slot, num_slots)  # only pool slots are dereferenced
        S = gl.load(ssm + gl.where(r_ok, r_slot, 0).to(gl.int64) * s_slot + i_h * (V * K) + rv[:, None] * K
                    + ck[None, :], mask=r_ok & (rv[:, None] < V), other=0.).to(gl.float32)
        report(error_flag, bad_slot(r_slot, num_slots), ERR_SLOT_C, HAS_FLAG)

        S, p_state = gl.warp_specialize([
            (_chain, (S, q_s, k_s, v_s, t_s, p_s, gc_s, gl_s, ready, empty, out, ssm, ckpt_slots, error_flag,
                      bos, eos, off, nc, c0, n_end, first_blk, ck0, i_h, i_v, max_ckpts, num_slots,
                      block_size, s_ot, s_slot, K, V, BV, BC, ROUND_STATE, OWN_P, HAS_FLAG)),
            (_load_chunks, (q_s, k_s, v_s, t_s, p_s, gc_s, gl_s, ready, empty, qs_ws, kn_ws, v, t_ws, p_ws,
                            g_ws, bos, eos, off, nc, i_h, i_hk, i_v, s_vt, HK, HV, K, V, BV, BC, OWN_P, LW)),
        ], [LW], [LOAD_REGS])
        w_slot = gl.load(write_slot + i_n)
        if slot_ok(w_slot, num_slots):
            gl.store(ssm + w_slot.to(gl.int64) * s_slot + p_state, S.to(ssm.dtype.element_ty))
        report(error_flag, bad_slot(w_slot, num_slots), ERR_SLOT_C, HAS_FLAG)


def chunk_seq_fwd_gluon(out, v, ssm, ws: ChunkWorkspace, meta: ChunkMeta, HK: int, bv: int = 64,
                        own_p: bool = False, error_flag=None):
    """Launch the Gluon sequential kernel (no checks; see chunk.gdn_chunk_prefill) after
    chunk_intra_fwd filled ``ws``: the arguments and effects of chunk.chunk_seq_fwd, and its bits.
    bv: rows of V a CTA owns, 128 (two warp groups) or 64 (one). own_p: make each chunk's P from
    its q and k tiles instead of reading ws.p; only after chunk_intra_gluon's kernel, whose P bits
    it repeats (that kernel then need not store P). Only where ``gluon_seq_supported``."""
    HV, K, V = ws.HV, ws.K, ws.V
    if meta.max_seqs == 0:
        return
    _seq_gluon_kernel[(HV * (V // bv), meta.max_seqs)](
        out, v, ws.t, ws.p, ws.g, ws.qs, ws.kn, ssm,
        meta.cu_seqlens, meta.start_pos, meta.read_slot, meta.write_slot, meta.ckpt_offsets,
        meta.ckpt_slots, error_flag, out.shape[0], meta.ckpt_slots.shape[0], ssm.shape[0],
        meta.block_size, v.stride(0), out.stride(0), ssm.stride(0),
        HK=HK, HV=HV, K=K, V=V, BV=bv, BC=CHUNK, ROUND_STATE=ssm.dtype != torch.float32,
        OWN_P=own_p, HAS_FLAG=error_flag is not None, LW=LOADER_WARPS, LOAD_REGS=LOADER_REGS,
        num_warps=bv // 16, **launch_regs(bv, own_p))


def launch_regs(bv: int, own_p: bool) -> dict:
    """The register cap a CTA launches with. GLUON_CONFIG's pairing (V tile 64, own P): 128 a
    thread, so that two CTAs (each a chain warp group and the loader's) share an SM, the warp roles
    moving 256 - LOADER_REGS of them to the chain (setmaxnreg); its shared memory fits two too.
    Otherwise Triton's default, one CTA an SM (at V tile 64 without own P the loader's fifth tile
    would spill at 32 registers)."""
    return {"maxnreg": 128} if bv == 64 and own_p else {}
