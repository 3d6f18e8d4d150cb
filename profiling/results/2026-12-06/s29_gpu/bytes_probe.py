"""GPU probe (twenty-ninth stop): are the Gluon prefill kernels paced by their bytes? Each kernel
timed as on main and with some of its global traffic removed (outputs then wrong: timing only). A
removed store keeps its instruction with a mask that is false at run time (cs < 0), so the
compiler keeps the arithmetic that feeds it; a removed cp.async load leaves its stage's stale
shared memory to the products.

    seq   no_tp:      the sequential kernel without its T' and P loads (16 of ~80 KB a chunk)
    seq   no_out:     ... without its output stores (16 KB a chunk)
    seq   no_tp_out:  both
    seq   own_p:      P computed from the chunk's q, k tiles instead of loaded (its bits checked: out
                      and every pool slot against the library kernel's)
    intra no_qk:      the intra kernel without its normalised q, k stores (32 of 96 KB a CTA)
    intra no_tp:      ... without its T' and P stores (32 KB a CTA)

If a kernel's time falls about as its bytes do, memory sets its pace. bf16, a state every 256
tokens; median ms (do_bench).

    PYTHONPATH=. python3 profiling/results/2026-12-06/s29_gpu/bytes_probe.py   # JSON to $OUT
"""

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
import probe_phases as P  # noqa: E402

SEQ_TP = [("""        async_copy.async_copy_global_to_shared(t_s.index(st), t_ws + row64 * (HV * BC) + i_h * BC + c64[None, :],
                                               mask=m64)
        async_copy.async_copy_global_to_shared(p_s.index(st), p_ws + row64 * (HV * BC) + i_h * BC + c64[None, :],
                                               mask=m64)
""", "")]
SEQ_OUT = [("o.to(out.dtype.element_ty), mask=(ro < n_t)[:, None])",
            "o.to(out.dtype.element_ty), mask=(ro < n_t)[:, None] & (cs < 0))")]
INTRA_QK = [("gl.store(kn_ws + p_hk, kb, mask=m_ld)", "gl.store(kn_ws + p_hk, kb, mask=m_ld & (cs < 0))"),
            ("gl.store(qs_ws + p_hk, qb, mask=m_ld)", "gl.store(qs_ws + p_hk, qb, mask=m_ld & (cs < 0))")]
INTRA_TP = [("(dec * QK).to(p_ws.dtype.element_ty),\n                     mask=m64[:, None])",
             "(dec * QK).to(p_ws.dtype.element_ty),\n                     mask=m64[:, None] & (cs < 0))"),
            ("gl.convert_layout(Tq, LO),\n                     mask=mo[:, None])",
             "gl.convert_layout(Tq, LO),\n                     mask=mo[:, None] & (cs < 0))")]
# P computed in the sequential kernel from the chunk's q and k tiles it already holds, as the intra
# kernel computes it (the same wgmma k-steps, the same decay instructions), instead of loaded: if
# its bits are the intra kernel's, the intra kernel need not store P for this kernel (8 KB a chunk
# and value head less each way). The two warp groups split P's columns (m64n32k16 each).
SEQ_OWN_P = [
    ("""        async_copy.async_copy_global_to_shared(p_s.index(st), p_ws + row64 * (HV * BC) + i_h * BC + c64[None, :],
                                               mask=m64)
""", ""),
    ("""    @gluon.jit
    def _gates(j, g_ws""", """    @gluon.jit
    def _exp2_ftz(x):
        return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _gates(j, g_ws"""),
    ("""            XT, OqT = warpgroup_mma_wait(0, deps=(XT, OqT))
            xT = v_s.index(st).permute((1, 0)).load(L64).to(gl.float32) - XT * eg[None, :]
            vnT = warpgroup_mma(gl.convert_layout(xT.to(DT), A64), t_s.index(st).permute((1, 0)), zero64)
""", """            LP: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4],
                                                         instr_shape=[16, BC // (NW // 4), 16])
            QK = warpgroup_mma(q_s.index(st), k_s.index(st).permute((1, 0)), gl.zeros([BC, BC], gl.float32, LP),
                               is_async=True)
            XT, OqT, QK = warpgroup_mma_wait(0, deps=(XT, OqT, QK))
            xT = v_s.index(st).permute((1, 0)).load(L64).to(gl.float32) - XT * eg[None, :]
            vnT = warpgroup_mma(gl.convert_layout(xT.to(DT), A64), t_s.index(st).permute((1, 0)), zero64,
                                is_async=True)
            gc2 = gc * 1.4426950408889634
            rP = gl.arange(0, BC, layout=gl.SliceLayout(1, LP))
            cP = gl.arange(0, BC, layout=gl.SliceLayout(0, LP))
            gr = gl.convert_layout(gc2, gl.SliceLayout(1, LP))
            gcol = gl.convert_layout(gc2, gl.SliceLayout(0, LP))
            dec = gl.where((cP[None, :] <= rP[:, None]) & (rP[:, None] < n_t), _exp2_ftz(gr[:, None] - gcol[None, :]), 0.)
            p_s.index(st).store((dec * QK).to(DT))
            fence_async_shared()
            gl.thread_barrier()
            vnT = warpgroup_mma_wait(0, deps=(vnT,))
""")]
SEQ = {"no_tp": SEQ_TP, "no_out": SEQ_OUT, "no_tp_out": SEQ_TP + SEQ_OUT, "own_p": SEQ_OWN_P}
INTRA = {"no_qk": INTRA_QK, "no_tp": INTRA_TP}


def main():
    from gdn_graphs.ops import chunk_gluon, chunk_intra_gluon
    seq_mods = {n: P.load(P.edited(chunk_gluon, e), "bytes_seq_" + n) for n, e in SEQ.items()}
    intra_mods = {n: P.load(P.edited(chunk_intra_gluon, e), "bytes_intra_" + n) for n, e in INTRA.items()}
    report = {"device": torch.cuda.get_device_name(), "runs": []}
    for HK, HV, N, L in P.SHAPES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        intra = lambda m: (lambda: m.chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale))
        seq = lambda m: (lambda: m.chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK))
        ms = {"intra": triton.testing.do_bench(intra(chunk_intra_gluon))}
        for n, m in intra_mods.items():
            ms["intra_" + n] = triton.testing.do_bench(intra(m))
        intra(chunk_intra_gluon)()  # the workspace the sequential kernels read
        seq(chunk_gluon)()
        out_lib, ssm_lib = out.clone(), ssm.clone()
        out.zero_(); ssm.zero_()
        seq(seq_mods["own_p"])()
        own_p_same = torch.equal(out, out_lib) and torch.equal(ssm, ssm_lib)
        ms["seq"] = triton.testing.do_bench(seq(chunk_gluon))
        for n, m in seq_mods.items():
            ms["seq_" + n] = triton.testing.do_bench(seq(m))
        run = {"shape": f"{N}x{L}", "HV": HV, "ms": ms, "own_p_same_bits": own_p_same}
        report["runs"].append(run)
        print(f"{N}x{L} HV {HV}: own_p same bits {own_p_same}; " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), "bytes_probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
