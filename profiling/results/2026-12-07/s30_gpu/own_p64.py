"""GPU probe (thirtieth stop, after call 2): call 1's own-P idea again, now that the sequential
kernel runs two CTAs an SM at V tile 64 (another CTA may run while one makes its P).

Variants generated from the library's source:
    seq own_p:   the sequential kernel (V tile 64) making each chunk's P = dec * Q K^T before its
                 chain instead of loading it (call 1's own_sync form), with the decay's scaling
                 `gc * log2(e)` as an explicit mul.rn so it cannot fuse into the subtraction that
                 follows (call 1's V-tile-64 form gave other bits; in the intra kernel a layout
                 conversion separates the two)
    intra no_p:  the intra kernel without P's store
Bits: the own-P kernel's outputs and every slot against the library's after an intra kernel that
stored P. ms, do_bench median, bf16, a state every 256 tokens.

    PYTHONPATH=. python3 profiling/results/2026-12-07/s30_gpu/own_p64.py [--compile]

Ran in call 3 against f22d5d7's library (main's kernels since). Its library form, OWN_P /
STORE_P with the intra kernel also skipping Q K^T, is own_p64.diff (not on main: never GPU-run).
"""

import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "2026-12-06", "s29_gpu"))
import probe_phases as P  # noqa: E402

SEQ_OWN_P = [
    ("""        async_copy.async_copy_global_to_shared(p_s.index(st), p_ws + row64 * (HV * BC) + i_h * BC + c64[None, :],
                                               mask=m64)
""", ""),
    ("""    # (as _chunk_seq_kernel:""", """    @gluon.jit
    def _exp2_ftz(x):
        return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _mul_rn(x):
        return gl.inline_asm_elementwise("mul.rn.f32 $0, $1, 0f3FB8AA3B;", "=r,r", [x], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _decay(gc, n_t, LP: gl.constexpr):
        gc2 = _mul_rn(gc)
        r = gl.arange(0, gc.shape[0], layout=gl.SliceLayout(1, LP))
        c = gl.arange(0, gc.shape[0], layout=gl.SliceLayout(0, LP))
        gr = gl.convert_layout(gc2, gl.SliceLayout(1, LP))
        gcol = gl.convert_layout(gc2, gl.SliceLayout(0, LP))
        return gl.where((c[None, :] <= r[:, None]) & (r[:, None] < n_t), _exp2_ftz(gr[:, None] - gcol[None, :]), 0.)

    # (as _chunk_seq_kernel:"""),
    ("""        A64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L64, k_width=2)
""", """        A64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L64, k_width=2)
        LP: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4],
                                                     instr_shape=[16, BC // (NW // 4), 16])
"""),
    ("""            Sb = gl.convert_layout(S.to(DT), A64)
""", """            QK = warpgroup_mma(q_s.index(st), k_s.index(st).permute((1, 0)), gl.zeros([BC, BC], gl.float32, LP))
            p_s.index(st).store((_decay(gc, n_t, LP) * QK).to(DT))
            fence_async_shared()
            gl.thread_barrier()
            Sb = gl.convert_layout(S.to(DT), A64)
"""),
]
INTRA_NO_P = [("""            gl.store(p_ws + row64[:, None] * (HV * BC) + i_h * BC + cc[None, :], (dec * QK).to(p_ws.dtype.element_ty),
                     mask=m64[:, None])
""", "")]


def mods():
    from gdn_graphs.ops import chunk_gluon, chunk_intra_gluon
    return (P.load(P.edited(chunk_gluon, SEQ_OWN_P), "seq_own_p64"),
            P.load(P.edited(chunk_intra_gluon, INTRA_NO_P), "intra_no_p"))


def compile_only():
    sys.path.insert(0, "tests")
    from sm90_compile import compile_sm90, ptxas_report
    seq, _ = mods()
    meta = {"cu_seqlens", "start_pos", "read_slot", "write_slot", "ckpt_offsets", "ckpt_slots"}
    div = lambda n, ty: ty.startswith("*") or n.startswith("s_") or n == "block_size"
    k = compile_sm90(seq._seq_gluon_kernel, dict(HK=16, HV=32, K=128, V=128, BV=64, BC=64, ROUND_STATE=False),
                     {"g_ws": "*fp32", "ssm": "*fp32"}, meta, {"T", "max_ckpts", "num_slots", "block_size"}, False,
                     4, div)
    print("seq own_p 64 regs, spills", ptxas_report(k), "smem", k.metadata.shared,
          "mul.rn" in k.asm["ptx"])


def main():
    from gdn_graphs.ops import chunk_gluon, chunk_intra_gluon
    seq_p, intra_np = mods()
    report = {"device": torch.cuda.get_device_name(), "runs": []}
    for HK, HV, N, L in P.SHAPES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        intra = lambda m: (lambda: m.chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale))
        seq = lambda m: (lambda: m.chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK, bv=64))
        ms = {"intra": triton.testing.do_bench(intra(chunk_intra_gluon)),
              "intra_no_p": triton.testing.do_bench(intra(intra_np))}
        intra(chunk_intra_gluon)()
        ssm.zero_()
        seq(chunk_gluon)()
        ref = (out.clone(), ssm.clone())
        out.zero_(); ssm.zero_(); ws.p.fill_(float("nan"))
        seq(seq_p)()
        same = torch.equal(out, ref[0]) and torch.equal(ssm, ref[1])
        intra(chunk_intra_gluon)()
        ms["seq64"] = triton.testing.do_bench(seq(chunk_gluon))
        ms["seq64_own_p"] = triton.testing.do_bench(seq(seq_p))
        r = {"shape": f"{N}x{L}", "HV": HV, "ms": ms, "own_p_same_bits": same}
        report["runs"].append(r)
        print(f"{N}x{L} HV {HV}: own P same bits {same}; " + ", ".join(f"{k} {v:.4f}" for k, v in ms.items()))
    json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), "own_p64.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
