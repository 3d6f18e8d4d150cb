"""GPU probe (thirty-third stop): the Gluon sequential kernel with warp roles (a loader warp group
issuing the chunks' masked cp.async, the chain's warp groups doing nothing else) against the
same kernel without them (main's library, run from another PYTHONPATH into another JSON).

Per shape: the Gluon intra kernel once (storing P, so every variant can run), then each
sequential kernel alone, do_bench median ms: Triton's (MANY_SEQS_CONFIG), Gluon at
V tile 64 making P (GLUON_CONFIG's pairing), 64 reading P, 128 reading P. Bits: outputs and
every pool slot of each Gluon variant against Triton's. Then the whole gdn_chunk_prefill,
GLUON_CONFIG against MANY_SEQS_CONFIG, at 32 to 256 (sequence, value head) pairs: where
GLUON_MIN_PAIRS should sit.

    PYTHONPATH=. python3 profiling/results/2026-12-07/s33_gpu/probe_ws.py NAME   # -> $OUT/probe_ws_NAME.json
"""

import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "2026-12-06", "s29_gpu"))
import probe_phases as P  # noqa: E402

SHAPES = [(16, 32, 8, 2048), (8, 16, 8, 2048), (16, 32, 4, 16384), (16, 32, 32, 512), (16, 32, 1, 8192)]
CROSS = [(16, 32, 8, 2048), (8, 16, 8, 2048), (8, 16, 4, 16384), (16, 32, 2, 16384), (8, 16, 4, 2048),
         (16, 32, 1, 8192)]  # 256, 128, 64, 64, 64, 32 pairs
VARIANTS = {"g64_ownp": (64, True), "g64": (64, False), "g128": (128, False)}


def main():
    name = sys.argv[1]
    from gdn_graphs.ops.chunk import chunk_seq_fwd_by
    from gdn_graphs.ops.chunk_gluon import chunk_seq_fwd_gluon
    from gdn_graphs.ops.chunk_intra_gluon import chunk_intra_fwd_gluon
    from gdn_graphs.ops.workspace import GLUON_CONFIG, MANY_SEQS_CONFIG
    report = {"name": name, "device": torch.cuda.get_device_name(), "runs": [], "cross": []}
    for HK, HV, N, L in SHAPES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale, store_p=True)
        seqs = {"triton": lambda: chunk_seq_fwd_by(MANY_SEQS_CONFIG, out, v, ssm, ws, meta, HK)}
        for key, (bv, own_p) in VARIANTS.items():
            seqs[key] = (lambda bv=bv, own_p=own_p: chunk_seq_fwd_gluon(out, v, ssm, ws, meta, HK, bv=bv, own_p=own_p))
        ms, same, ref = {}, {}, None
        for key, fn in seqs.items():
            ssm.fill_(float("nan")); out.fill_(float("nan"))
            fn(); torch.cuda.synchronize()
            got = (out.clone(), ssm.clone())
            if ref is None:
                ref = got
            same[key] = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            ms[key] = triton.testing.do_bench(fn)
        r = {"shape": f"{N}x{L}", "HV": HV, "ms": ms, "same_bits_as_triton": same}
        report["runs"].append(r)
        print(f"{N}x{L} HV {HV}: bits {same}; " + ", ".join(f"{k} {v:.4f}" for k, v in ms.items()), flush=True)
    from gdn_graphs.ops.chunk import gdn_chunk_prefill
    for HK, HV, N, L in CROSS:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        ms, res = {}, {}
        for key, cfg in (("triton_seq", MANY_SEQS_CONFIG), ("gluon", GLUON_CONFIG)):
            call = lambda: gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, ssm, meta, out=out, workspace=ws,
                                             config=cfg)
            ssm.zero_(); call(); torch.cuda.synchronize()
            res[key] = (out.clone(), ssm.clone())
            ms[key] = triton.testing.do_bench(call)
        same = all(torch.equal(x, y) for x, y in zip(res["triton_seq"], res["gluon"]))
        report["cross"].append({"shape": f"{N}x{L}", "HV": HV, "pairs": N * HV, "ms": ms, "same_bits": same})
        print(f"whole {N}x{L} HV {HV} ({N * HV} pairs): bits {same}; triton seq {ms['triton_seq']:.4f}, "
              f"gluon {ms['gluon']:.4f} ({ms['triton_seq'] / ms['gluon']:.3f}x)", flush=True)
    json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), f"probe_ws_{name}.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
