"""GPU probe (thirtieth stop): the Gluon sequential kernel making each chunk's P itself (OWN_P)
so that the intra kernel stops storing it (8 KB a chunk and value head less written, and read).

For each shape (s29's probe_phases.SHAPES, bf16, a state every 256 tokens), median ms (do_bench):
    intra        the Gluon intra kernel storing P (as until now) / not storing it (store_p=False)
    seq          the Gluon sequential kernel reading P (as until now) / making it, three ways:
                   own_sync:    the library's: P made before the chain's products (ptxas: 56 B of
                                spill stores at bv 128, none at bv 64)
                   own_overlap: Q K^T issued with S k^T and S q^T, P made while v_new's wgmma
                                runs (180 B of spill stores)
                   own_bv64:    the library's at bv 64 (two CTAs a head, each making P)
    prefill      gdn_chunk_prefill with GLUON_CONFIG: now (own P) and as before (P stored, read)
Each own-P form's outputs and every pool slot are compared with the P-reading kernel's (after an
intra kernel that stored P): its bits must be the same.

    PYTHONPATH=. python3 profiling/results/2026-12-07/s30_gpu/own_p_probe.py   # JSON to $OUT

It ran (call 1) with own_p.diff applied to the library (the sequential kernel's OWN_P, the intra
kernel's STORE_P, their launchers' own_p / store_p); the diff was reverted after it (slower), so
on main this script needs that diff applied first.
"""

import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "2026-12-06", "s29_gpu"))
import probe_phases as P  # noqa: E402

OVERLAP = [  # the library's P-before-the-chain form moved under v_new's wgmma
    ("""            if OWN_P:
                QK = warpgroup_mma(q_s.index(st), k_s.index(st).permute((1, 0)),
                                   gl.zeros([BC, BC], gl.float32, LP))
                p_s.index(st).store((_decay(gc, n_t, LP) * QK).to(DT))
                fence_async_shared()
                gl.thread_barrier()
""", ""),
    ("""            XT, OqT = warpgroup_mma_wait(0, deps=(XT, OqT))
            xT = v_s.index(st).permute((1, 0)).load(L64).to(gl.float32) - XT * eg[None, :]
            vnT = warpgroup_mma(gl.convert_layout(xT.to(DT), A64), t_s.index(st).permute((1, 0)), zero64)
""", """            QK = warpgroup_mma(q_s.index(st), k_s.index(st).permute((1, 0)),
                               gl.zeros([BC, BC], gl.float32, LP), is_async=True)
            XT, OqT, QK = warpgroup_mma_wait(0, deps=(XT, OqT, QK))
            xT = v_s.index(st).permute((1, 0)).load(L64).to(gl.float32) - XT * eg[None, :]
            vnT = warpgroup_mma(gl.convert_layout(xT.to(DT), A64), t_s.index(st).permute((1, 0)), zero64,
                                is_async=True)
            p_s.index(st).store((_decay(gc, n_t, LP) * QK).to(DT))
            fence_async_shared()
            gl.thread_barrier()
            vnT = warpgroup_mma_wait(0, deps=(vnT,))
""")]


def compile_only():
    """CPU check: the overlap variant compiles for sm_90 (registers, spills)."""
    sys.path.insert(0, "tests")
    from sm90_compile import compile_sm90, ptxas_report
    mod = P.load(P.edited(__import__("gdn_graphs.ops.chunk_gluon", fromlist=["x"]), OVERLAP), "seq_overlap")
    meta = {"cu_seqlens", "start_pos", "read_slot", "write_slot", "ckpt_offsets", "ckpt_slots"}
    div = lambda n, ty: ty.startswith("*") or n.startswith("s_") or n == "block_size"
    k = compile_sm90(mod._seq_gluon_kernel, dict(HK=16, HV=32, K=128, V=128, BV=128, BC=64, ROUND_STATE=False,
                                                 OWN_P=True), {"g_ws": "*fp32", "ssm": "*fp32"}, meta,
                     {"T", "max_ckpts", "num_slots", "block_size"}, False, 8, div)
    print("overlap regs, spills", ptxas_report(k), "smem", k.metadata.shared)


def main():
    from gdn_graphs.ops import chunk_gluon, chunk_intra_gluon
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    from gdn_graphs.ops.workspace import GLUON_CONFIG
    overlap = P.load(P.edited(chunk_gluon, OVERLAP), "seq_overlap")
    report = {"device": torch.cuda.get_device_name(), "runs": []}
    for HK, HV, N, L in P.SHAPES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        intra = lambda sp: (lambda: chunk_intra_gluon.chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws,
                                                                            meta, scale, store_p=sp))
        seq = lambda m, own, bv=128: (lambda: m.chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK, bv=bv, own_p=own))
        forms = {"own_sync": seq(chunk_gluon, True), "own_overlap": seq(overlap, True),
                 "own_bv64": seq(chunk_gluon, True, 64)}
        ms = {"intra_store_p": triton.testing.do_bench(intra(True)),
              "intra_no_p": triton.testing.do_bench(intra(False))}
        intra(True)()
        ssm.zero_()
        seq(chunk_gluon, False)()
        out_ref, ssm_ref = out.clone(), ssm.clone()
        same = {}
        for n, f in forms.items():
            out.zero_(); ssm.zero_(); ws.p.fill_(float("nan"))  # own P must not read ws.p
            f()
            same[n] = torch.equal(out, out_ref) and torch.equal(ssm, ssm_ref)
        intra(True)()
        ms["seq_read_p"] = triton.testing.do_bench(seq(chunk_gluon, False))
        for n, f in forms.items():
            ms["seq_" + n] = triton.testing.do_bench(f)
        ms["prefill_now"] = triton.testing.do_bench(lambda: gdn_chunk_prefill(
            q, k, v, a, b, A_log, dt_bias, ssm, meta, out=out, scale=scale, workspace=ws, config=GLUON_CONFIG))
        ms["prefill_read_p"] = triton.testing.do_bench(lambda: (intra(True)(), seq(chunk_gluon, False)()))
        run = {"shape": f"{N}x{L}", "HV": HV, "ms": ms, "same_bits": same}
        report["runs"].append(run)
        print(f"{N}x{L} HV {HV}: same bits {same}; " + ", ".join(f"{k} {v:.4f}" for k, v in ms.items()))
    json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), "own_p_probe.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
