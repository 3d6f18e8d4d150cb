"""A Gluon (sm_90) version of chunk.py's sequential kernel: one CTA per (sequence, value head)
owning all of V, the state S [V, K] in fp32 registers as the register (A) operand of wgmma.

Probe, not library code (twenty-fifth stop; the twenty-sixth stop's copy fixes the rounding order). It reads the same ChunkWorkspace as
``_chunk_seq_kernel`` (T', P, gc, q, k from ``chunk_intra_fwd``; v from the caller) and writes the
same things (out rows, block-boundary checkpoints, the final state), so the two can be compared on
one workspace. Per chunk of 64 tokens, with S0 the entering state (S [V, K], K contiguous as in
the pool):

    XT  = S0 k^T,  OqT = S0 q^T                  [V, 64]   (A = bf16(S0) from registers)
    xT  = v^T - XT * exp(gc)                     [V, 64]
    vnT = bf16(xT) T'^T                          [V, 64]   v_new^T
    oT  = OqT * exp(gc) + bf16(vnT) P^T          [V, 64]   -> out (through shared memory)
    S   = exp(gc_last) S0 + bf16(vnT * exp(gc_last - gc)) k        [V, K]

the same roundings and order as ``_seq_chunk`` (16-bit operands, fp32 accumulation, v_new scaled
in fp32 before its one rounding), so that the two kernels can give the same bits. Operands come through
a 2-stage shared-memory ring filled by masked cp.async (rows outside the span read as zeros,
as the Triton kernel's masked loads), chunk j + 1's copies issued before chunk j's products.
BV = 128 (8 warps: two warp groups of 64 rows of V each) or 64 (two CTAs a head, 4 warps).
16-bit inputs only.

Not here (the library kernel has them): the error flag and the repairs of bad metadata; this probe
trusts its metadata (tests build it with chunk_meta).
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

BC = 64


@gluon.jit
def _issue_chunk(j, q_s, k_s, v_s, t_s, p_s, qs_ws, kn_ws, v, t_ws, p_ws,
                 bos, eos, off, nc, i_h, i_hk, i_v, s_vt,
                 HK: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                 BC: gl.constexpr, LD128: gl.constexpr, LD64: gl.constexpr, LDV: gl.constexpr):
    """cp.async chunk j's q, k, v, T', P rows into stage j % 2 (rows outside the span: zeros)."""
    st = j % 2
    r128 = gl.arange(0, BC, layout=gl.SliceLayout(1, LD128))
    c128 = gl.arange(0, K, layout=gl.SliceLayout(0, LD128))
    r64 = gl.arange(0, BC, layout=gl.SliceLayout(1, LD64))
    rvv = gl.arange(0, BC, layout=gl.SliceLayout(1, LDV))
    cvv = gl.arange(0, BV, layout=gl.SliceLayout(0, LDV))
    c64 = gl.arange(0, BC, layout=gl.SliceLayout(0, LD64))
    # rows count from the chunk's first token (chunk.py's _chunk_rows)
    cs = bos + gl.maximum(j * BC - off, 0)
    n_t = gl.where(j < nc, gl.minimum(bos + (j + 1) * BC - off, eos) - cs, 0)
    t128 = cs + r128
    m128 = r128 < n_t
    t64 = cs + r64
    m64 = r64 < n_t
    tvv = cs + rvv
    row128 = t128.to(gl.int64)[:, None]
    row64 = t64.to(gl.int64)[:, None]
    async_copy.async_copy_global_to_shared(q_s.index(st), qs_ws + row128 * (HK * K) + i_hk * K + c128[None, :],
                                           mask=m128[:, None])
    async_copy.async_copy_global_to_shared(k_s.index(st), kn_ws + row128 * (HK * K) + i_hk * K + c128[None, :],
                                           mask=m128[:, None])
    async_copy.async_copy_global_to_shared(v_s.index(st), v + tvv.to(gl.int64)[:, None] * s_vt + i_h * V + i_v * BV
                                           + cvv[None, :], mask=(rvv < n_t)[:, None])
    async_copy.async_copy_global_to_shared(t_s.index(st), t_ws + row64 * (HV * BC) + i_h * BC + c64[None, :],
                                           mask=m64[:, None])
    async_copy.async_copy_global_to_shared(p_s.index(st), p_ws + row64 * (HV * BC) + i_h * BC + c64[None, :],
                                           mask=m64[:, None])
    async_copy.commit_group()


@gluon.jit
def _gates(j, g_ws, bos, eos, off, nc, i_h, ct, HV: gl.constexpr, BC: gl.constexpr):
    """Chunk j's cumulative log decays gc [BC] (0 past its tokens) and its last one: loaded one
    chunk ahead, so that these global loads are not on the chain."""
    cs = bos + gl.maximum(j * BC - off, 0)
    ce = gl.minimum(bos + (j + 1) * BC - off, eos)
    ok = j < nc
    gc = gl.load(g_ws + (cs + ct).to(gl.int64) * HV + i_h, mask=(ct < ce - cs) & ok, other=0.)
    g_last = gl.load(g_ws + gl.where(ok, ce - 1, bos).to(gl.int64) * HV + i_h)
    return gc, g_last


@gluon.jit
def gluon_seq_kernel(out, v, t_ws, p_ws, g_ws, qs_ws, kn_ws, ssm,
                     cu_seqlens, start_pos, read_slot, write_slot, ckpt_offsets, ckpt_slots,
                     max_ckpts, num_slots, block_size, s_vt, s_ot, s_slot,
                     HK: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                     BV: gl.constexpr, BC: gl.constexpr, ROUND_STATE: gl.constexpr,
                     O_DIRECT: gl.constexpr):
    gl.static_assert(K == 128)
    gl.static_assert(V == 128)
    NW: gl.constexpr = BV // 16  # one warp per 16 rows of V: a warp group per 64
    NV: gl.constexpr = V // BV
    G: gl.constexpr = HV // HK
    i_v = gl.program_id(0) % NV
    i_h = gl.program_id(0) // NV
    i_n = gl.program_id(1)
    i_hk = i_h // G
    bos = gl.load(cu_seqlens + i_n)
    eos = gl.load(cu_seqlens + i_n + 1)
    if eos <= bos:
        return
    n0 = gl.load(start_pos + i_n)
    n_end = n0 + (eos - bos)
    off = n0 % BC
    c0 = n0 // BC
    nc = (n_end - 1) // BC - c0 + 1
    first_blk = n0 // block_size
    ck0 = gl.load(ckpt_offsets + i_n)

    # register layouts: wgmma accumulators of [V, 128] and [V, 64] on two warp groups, their
    # A-operand forms, and coalesced layouts for the cp.async tiles and the output rows
    LS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, K, 16])
    L64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BC, 16])
    A64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L64, k_width=2)
    AS: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=LS, k_width=2)
    LD128: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NW, 1], [1, 0])
    LD64: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    LDV: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BV // 8), BV // 8], [NW, 1], [1, 0])
    DT: gl.constexpr = qs_ws.dtype.element_ty
    SH128: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BC, K], DT)
    SH64: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BC, BC], DT)
    SHV: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BC, BV], DT)

    q_s = gl.allocate_shared_memory(DT, [2, BC, K], SH128)
    k_s = gl.allocate_shared_memory(DT, [2, BC, K], SH128)
    v_s = gl.allocate_shared_memory(DT, [2, BC, BV], SHV)
    t_s = gl.allocate_shared_memory(DT, [2, BC, BC], SH64)
    p_s = gl.allocate_shared_memory(DT, [2, BC, BC], SH64)
    if not O_DIRECT:  # O_DIRECT: stores straight from the accumulator (no staging buffer)
        o_s = gl.allocate_shared_memory(DT, [BC, BV], SHV)

    # the state S [V, K]: element [v, k] at ssm[slot, h, v, k]
    rv = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, LS))
    ck = gl.arange(0, K, layout=gl.SliceLayout(0, LS))
    p_state = i_h * (V * K) + rv[:, None] * K + ck[None, :]
    r_slot = gl.load(read_slot + i_n)
    r_ok = (r_slot >= 0) & (r_slot < num_slots)
    S = gl.load(ssm + gl.where(r_ok, r_slot, 0).to(gl.int64) * s_slot + p_state,
                mask=r_ok & (rv[:, None] < V), other=0.).to(gl.float32)

    ct = gl.arange(0, BC, layout=gl.SliceLayout(0, L64))    # token of the chunk, as a column
    ro = gl.arange(0, BC, layout=gl.SliceLayout(1, LDV))  # token of the chunk, as a row (out)
    co = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, LDV))
    zero64 = gl.zeros([BV, BC], gl.float32, L64)

    gc_next, gl_next = _gates(0, g_ws, bos, eos, off, nc, i_h, ct, HV, BC)
    _issue_chunk(0, q_s, k_s, v_s, t_s, p_s, qs_ws, kn_ws, v, t_ws, p_ws, bos, eos, off, nc, i_h, i_hk, i_v,
                 s_vt, HK, HV, K, V, BV, BC, LD128, LD64, LDV)
    for j in range(nc):
        st = j % 2
        gl.thread_barrier()  # every warp is done with stage (j + 1) % 2 (chunk j - 1) and o_s
        _issue_chunk(j + 1, q_s, k_s, v_s, t_s, p_s, qs_ws, kn_ws, v, t_ws, p_ws, bos, eos, off, nc, i_h,
                     i_hk, i_v, s_vt, HK, HV, K, V, BV, BC, LD128, LD64, LDV)
        async_copy.wait_group(1)  # chunk j's group has landed (this thread's copies)
        gl.thread_barrier()       # ... and every thread's
        fence_async_shared()      # generic-proxy writes before the wgmma reads

        cs = bos + gl.maximum(j * BC - off, 0)
        n_t = gl.minimum(bos + (j + 1) * BC - off, eos) - cs
        m_t = ct < n_t
        gc = gc_next
        g_last = gl_next
        gc_next, gl_next = _gates(j + 1, g_ws, bos, eos, off, nc, i_h, ct, HV, BC)
        eg = gl.exp(gc)

        Sb = gl.convert_layout(S.to(DT), A64)
        XT = warpgroup_mma(Sb, k_s.index(st).permute((1, 0)), zero64, is_async=True)
        OqT = warpgroup_mma(Sb, q_s.index(st).permute((1, 0)), zero64, is_async=True)
        XT, OqT = warpgroup_mma_wait(0, deps=(XT, OqT))
        vT = v_s.index(st).permute((1, 0)).load(L64).to(gl.float32)
        xT = vT - XT * eg[None, :]
        xb = gl.convert_layout(xT.to(DT), A64)
        vnT = warpgroup_mma(xb, t_s.index(st).permute((1, 0)), zero64)
        vnb = vnT.to(DT)
        oT = warpgroup_mma(gl.convert_layout(vnb, A64), p_s.index(st).permute((1, 0)), OqT * eg[None, :],
                           is_async=True)
        # the fp32 v_new times the decay, rounded once: _seq_chunk's order (the twenty-fifth
        # stop's probe scaled the rounded v_new and so lost the Triton kernel's bits)
        w = gl.where(m_t, gl.exp(g_last - gc), 0.)
        vs = gl.convert_layout((vnT * w[None, :]).to(DT), AS)
        S = warpgroup_mma(vs, k_s.index(st), S * gl.exp(g_last), is_async=True)
        oT, S = warpgroup_mma_wait(0, deps=(oT, S))

        if O_DIRECT:
            gl.store(out + (cs + ct).to(gl.int64)[None, :] * s_ot + i_h * V
                     + (i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, L64)))[:, None],
                     oT.to(out.dtype.element_ty), mask=m_t[None, :])
        else:
            # the output rows, transposed through shared memory into coalesced stores
            o_s.permute((1, 0)).store(oT.to(DT))
            gl.thread_barrier()
            o = o_s.load(LDV)
            to = cs + ro
            m_o = ro < n_t
            gl.store(out + to.to(gl.int64)[:, None] * s_ot + i_h * V + co[None, :], o.to(out.dtype.element_ty),
                     mask=m_o[:, None])

        p_end = (c0 + j + 1) * BC
        at_block = (p_end % block_size) == 0
        if ROUND_STATE:
            if at_block:
                S = S.to(ssm.dtype.element_ty).to(gl.float32)
        if at_block & (p_end < n_end):
            i_e = ck0 + (p_end // block_size - first_blk - 1)
            slot = gl.load(ckpt_slots + i_e, mask=i_e < max_ckpts, other=-1)
            if (slot >= 0) & (slot < num_slots):
                gl.store(ssm + slot.to(gl.int64) * s_slot + p_state, S.to(ssm.dtype.element_ty))

    async_copy.wait_group(0)
    w_slot = gl.load(write_slot + i_n)
    if (w_slot >= 0) & (w_slot < num_slots):
        gl.store(ssm + w_slot.to(gl.int64) * s_slot + p_state, S.to(ssm.dtype.element_ty))


def gluon_seq_fwd(out, v, ssm, ws, meta, HK: int, bv: int = 128, o_direct: bool = False):
    """Launch the Gluon sequential kernel after chunk_intra_fwd filled ``ws`` (16-bit inputs,
    K = V = 128). Same arguments and effects as chunk.chunk_seq_fwd."""
    HV, K, V = ws.HV, ws.K, ws.V
    assert K == 128 and V == 128 and ws.t.dtype in (torch.bfloat16, torch.float16)
    if meta.max_seqs == 0:
        return
    gluon_seq_kernel[(HV * (V // bv), meta.max_seqs)](
        out, v, ws.t, ws.p, ws.g, ws.qs, ws.kn, ssm,
        meta.cu_seqlens, meta.start_pos, meta.read_slot, meta.write_slot, meta.ckpt_offsets,
        meta.ckpt_slots, meta.ckpt_slots.shape[0], ssm.shape[0], meta.block_size,
        v.stride(0), out.stride(0), ssm.stride(0),
        HK=HK, HV=HV, K=K, V=V, BV=bv, BC=BC, ROUND_STATE=ssm.dtype != torch.float32, O_DIRECT=o_direct,
        num_warps=bv // 16)


# ------------------------------------------------------------------ compile for sm_90 without a GPU
def compile_sm90(HK=16, HV=32, round_state=False, bv=128, o_direct=False):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"out": "*bf16", "v": "*bf16", "t_ws": "*bf16", "p_ws": "*bf16", "g_ws": "*fp32",
           "qs_ws": "*bf16", "kn_ws": "*bf16", "ssm": "*bf16" if round_state else "*fp32",
           "cu_seqlens": "*i32", "start_pos": "*i32", "read_slot": "*i32", "write_slot": "*i32",
           "ckpt_offsets": "*i32", "ckpt_slots": "*i32",
           "max_ckpts": "i32", "num_slots": "i32", "block_size": "i32", "s_vt": "i32", "s_ot": "i32",
           "s_slot": "i32",
           "HK": "constexpr", "HV": "constexpr", "K": "constexpr", "V": "constexpr", "BV": "constexpr", "BC": "constexpr",
           "ROUND_STATE": "constexpr", "O_DIRECT": "constexpr"}
    consts = {"HK": HK, "HV": HV, "K": 128, "V": 128, "BV": bv, "BC": BC, "ROUND_STATE": round_state,
              "O_DIRECT": o_direct}
    attrs = {(i, ): [["tt.divisibility", 16]] for i in list(range(14)) + [16, 17, 18, 19]}
    src = GluonASTSource(gluon_seq_kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=bv // 16))


if __name__ == "__main__":
    import os
    import re
    import subprocess
    import tempfile
    for rs, bv, od in ((False, 128, False), (True, 128, False), (False, 64, False), (True, 64, False),
                       (False, 64, True), (False, 128, True)):
        ck = compile_sm90(round_state=rs, bv=bv, o_direct=od)
        ptx = ck.asm["ptx"]
        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
        os.unlink(f.name)
        print("bv", bv, "round_state", rs, "o_direct", od, "shared", ck.metadata.shared, "wgmma", ptx.count("wgmma.mma_async"),
              re.findall(r"Used \d+ registers|\d+ bytes spill stores", r.stderr), r.returncode)
