"""GPU probe (thirty-first stop): what each kernel leaves to the other, on the library's kernels.

    none:  the intra kernel stores P and the normalised q, k; the sequential kernel reads them
    p:     the sequential kernel makes P (OWN_P; own_p64.diff, landed with this stop's call)
    p_qk:  it also normalises the chunk's raw q and k rows (OWN_QK); the intra kernel stores
           neither and loads no q
Bits: outputs and every slot of p and p_qk against none's. ms: do_bench medians of each kernel
alone and of the pair, bf16, K = V = 128, a state every 256 tokens, V tile 64, cold starts.
Then the whole gdn_chunk_prefill with GLUON_CONFIG (p_qk) against MANY_SEQS_CONFIG (Triton's
sequential kernel, the intra kernel storing everything) down to 32 (sequence, value head) pairs:
where GLUON_MIN_PAIRS should sit now.

    PYTHONPATH=. python3 profiling/results/2026-12-07/s31_gpu/own_qk.py

Ran in call 1 with own_qk.diff applied to the library (store_qk, qk: OWN_QK is not on main: the
sequential kernel's normalisation cost more than the intra kernel saved, call1/own_qk.log).
"""

import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "2026-12-06", "s29_gpu"))
import probe_phases as P  # noqa: E402

SHAPES = P.SHAPES + [(16, 32, 4, 16384), (8, 16, 4, 16384)]
CROSS = [(8, 16, 4, 16384), (16, 32, 2, 16384), (16, 32, 2, 4096), (8, 16, 4, 2048), (8, 16, 2, 8192),
         (16, 32, 1, 8192)]  # 64, 64, 64, 64, 32, 32 pairs
MODES = {"none": (True, True), "p": (False, True), "p_qk": (False, False)}  # intra's (store_p, store_qk)


def main():
    from gdn_graphs.ops.chunk_gluon import chunk_seq_fwd_gluon
    from gdn_graphs.ops.chunk_intra_gluon import chunk_intra_fwd_gluon
    report = {"device": torch.cuda.get_device_name(), "runs": []}
    for HK, HV, N, L in SHAPES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)

        def intra(mode):
            sp, sq = MODES[mode]
            return lambda: chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale,
                                                 store_p=sp, store_qk=sq)

        def seq(mode):
            return lambda: chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK, bv=64, own_p=mode != "none",
                                               qk=(q, k, scale) if mode == "p_qk" else None)

        ms, same, ref = {}, {}, None
        for mode in MODES:
            for t in (ws.p, ws.qs, ws.kn):
                t.fill_(float("nan"))  # what a mode does not store must not be read
            ssm.zero_(); out.zero_()
            intra(mode)(); seq(mode)()
            torch.cuda.synchronize()
            got = (out.clone(), ssm.clone())
            if ref is None:
                ref = got
            same[mode] = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            ms[f"intra_{mode}"] = triton.testing.do_bench(intra(mode))
            intra(mode)()
            ms[f"seq_{mode}"] = triton.testing.do_bench(seq(mode))
            ms[f"pair_{mode}"] = triton.testing.do_bench(lambda: (intra(mode)(), seq(mode)()))
        r = {"shape": f"{N}x{L}", "HV": HV, "ms": ms, "same_bits": same}
        report["runs"].append(r)
        print(f"{N}x{L} HV {HV}: bits {same}; " + ", ".join(f"{k} {v:.4f}" for k, v in ms.items()), flush=True)
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    from gdn_graphs.ops.workspace import GLUON_CONFIG, MANY_SEQS_CONFIG
    report["cross"] = []
    for HK, HV, N, L in CROSS:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        ms, res = {}, {}
        for name, cfg in (("triton_seq", MANY_SEQS_CONFIG), ("gluon", GLUON_CONFIG)):
            call = lambda: gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, ssm, meta, out=out, workspace=ws,
                                             config=cfg)
            ssm.zero_(); call(); torch.cuda.synchronize()
            res[name] = (out.clone(), ssm.clone())
            ms[name] = triton.testing.do_bench(call)
        same = all(torch.equal(x, y) for x, y in zip(res["triton_seq"], res["gluon"]))
        report["cross"].append({"shape": f"{N}x{L}", "HV": HV, "pairs": N * HV, "ms": ms, "same_bits": same})
        print(f"whole {N}x{L} HV {HV} ({N * HV} pairs): bits {same}; triton seq {ms['triton_seq']:.4f}, "
              f"gluon {ms['gluon']:.4f} ({ms['triton_seq'] / ms['gluon']:.3f}x)", flush=True)
    json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), "own_qk.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
