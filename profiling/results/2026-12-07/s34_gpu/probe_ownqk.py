"""GPU probe (thirty-fourth stop): q and k normalised by the Gluon sequential kernel's loader warp
group (own q and k: the intra kernel then loads no q and stores neither) against the intra kernel
storing them (main's pairing), on the same tree: the library takes own q and k where the rows are
cp.async-copyable, so "off" patches that test to say no. Then block states stored by TMA through
the stage's q and k tiles against each thread's stores (chunk_gluon.STATE_TMA).

Per shape (packed qkv rows, bf16, K = V = 128, a state every 256 tokens into pool slots): the
intra kernel the library takes and the sequential kernel after it, each alone, and the whole
gdn_chunk_prefill with GLUON_CONFIG, do_bench median ms; bits of outputs and every pool slot
against the Triton sequential kernel (MANY_SEQS_CONFIG).

    PYTHONPATH=. python3 profiling/results/2026-12-07/s34_gpu/probe_ownqk.py ownqk|tma|tma_plain  # -> $OUT/probe_<arg>.json
"""

import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "2026-12-06", "s29_gpu"))
import probe_phases as P  # noqa: E402

# (HK, HV, sequences, tokens each): 256, 128, 128, 64, 64, 32 (sequence, value head) pairs
# "ownqk": the intra kernel storing q and k against the loader normalising them (plain state
# stores); "tma": the latter against the same with block states out by TMA (its own process, so
# that a fault there cannot cost the first comparison); "tma_plain": TMA state stores against
# plain ones with the intra kernel storing q and k (main's pairing)
MODES = {"ownqk": ("off", "own_qk"), "tma": ("own_qk", "own_qk_tma"), "tma_plain": ("off", "off_tma")}[sys.argv[1]]
SHAPES = [(16, 32, 8, 2048), (8, 16, 8, 2048), (16, 32, 4, 16384), (8, 16, 4, 16384), (16, 32, 2, 4096),
          (16, 32, 32, 512)]


def main():
    import gdn_graphs.ops.chunk as C
    import gdn_graphs.ops.chunk_gluon as G
    from gdn_graphs.ops.workspace import GLUON_CONFIG, MANY_SEQS_CONFIG
    copyable = C.rows_copyable
    report = {"device": torch.cuda.get_device_name(), "runs": []}
    for HK, HV, N, L in SHAPES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        row = {"shape": f"{N}x{L}", "HV": HV, "pairs": N * HV}

        def whole(cfg):
            return lambda: C.gdn_chunk_prefill(q, k, v, a, b, A_log, dt_bias, ssm, meta, out=out, workspace=ws,
                                               config=cfg)
        ssm.fill_(float("nan")); out.fill_(float("nan")); ws.qs.fill_(float("nan")); ws.kn.fill_(float("nan"))
        whole(MANY_SEQS_CONFIG)(); torch.cuda.synchronize()
        ref = (out.clone(), ssm.clone())
        row["ms_triton_seq"] = triton.testing.do_bench(whole(MANY_SEQS_CONFIG))
        for mode in MODES:
            C.rows_copyable = copyable if mode.startswith("own") else (lambda x: False)
            G.STATE_TMA = mode.endswith("tma")
            ssm.fill_(float("nan")); out.fill_(float("nan")); ws.qs.fill_(float("nan")); ws.kn.fill_(float("nan"))
            whole(GLUON_CONFIG)(); torch.cuda.synchronize()
            same = torch.equal(out, ref[0]) and torch.equal(ssm.nan_to_num(7.0), ref[1].nan_to_num(7.0))
            intra = lambda: C.chunk_intra_fwd_for(q, k, a, b, A_log, dt_bias, out, ws, meta, scale, GLUON_CONFIG,
                                                  "tf32", "tf32")
            left = intra()
            assert (left.get("qk") is not None) == mode.startswith("own"), left
            seq = lambda: C.chunk_seq_fwd_by(GLUON_CONFIG, out, v, ssm, ws, meta, HK, **left)
            row[mode] = {"same_bits_as_triton": same, "ms": triton.testing.do_bench(whole(GLUON_CONFIG)),
                         "ms_intra": triton.testing.do_bench(intra), "ms_seq": triton.testing.do_bench(seq)}
        C.rows_copyable = copyable
        report["runs"].append(row)
        o, w = row[MODES[0]], row[MODES[1]]
        print(f"{N}x{L} HV {HV} ({N * HV} pairs): bits off {o['same_bits_as_triton']} own {w['same_bits_as_triton']}; "
              f"whole {o['ms']:.4f} -> {w['ms']:.4f} ({o['ms'] / w['ms']:.3f}x); intra {o['ms_intra']:.4f} -> "
              f"{w['ms_intra']:.4f}; seq {o['ms_seq']:.4f} -> {w['ms_seq']:.4f}; triton seq {row['ms_triton_seq']:.4f}",
              flush=True)
    json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), f"probe_{sys.argv[1]}.json"), "w"),
              indent=1)


if __name__ == "__main__":
    main()
