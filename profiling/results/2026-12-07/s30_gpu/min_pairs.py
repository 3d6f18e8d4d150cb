"""GPU probe (thirtieth stop): where the Gluon sequential kernel at V tile 64 (two CTAs an SM, the
library's GLUON_CONFIG since call 2) beats the Triton one, by (sequence, value head) pairs: the
threshold GLUON_MIN_PAIRS (128, set for V tile 128 with one CTA an SM).

For TP-1 and TP-2 heads and 1, 2, 4, 8 sequences of 2,048 tokens and one of 8,192 (bf16, a state
every 256 tokens), the sequential kernel alone after the library's intra kernel, median ms
(do_bench): Triton's as chunk_config picks it without Gluon (one sequence: DEFAULT_CONFIG, else
MANY_SEQS_CONFIG), Gluon at V tile 64 and 128. Outputs and every slot of each Gluon run compared
with Triton's (the same bits expected).

    PYTHONPATH=. python3 profiling/results/2026-12-07/s30_gpu/min_pairs.py   # JSON to $OUT
"""

import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "2026-12-06", "s29_gpu"))
import probe_phases as P  # noqa: E402

CASES = [(hk, hv, n, 2048) for hk, hv in ((16, 32), (8, 16)) for n in (1, 2, 4, 8)] + [(16, 32, 1, 8192),
                                                                                       (8, 16, 1, 8192)]


def main():
    from gdn_graphs.ops.chunk import chunk_seq_fwd_by
    from gdn_graphs.ops.chunk_intra_gluon import chunk_intra_fwd_gluon
    from gdn_graphs.ops.workspace import ChunkConfig, chunk_config
    report = {"device": torch.cuda.get_device_name(), "runs": []}
    for HK, HV, N, L in CASES:
        T, q, k, v, a, b, A_log, dt_bias, meta, ssm, ws, out, scale = P.make_case(HK, HV, N, L)
        chunk_intra_fwd_gluon(q, k, a, b, A_log, dt_bias, out, ws, meta, scale)
        cfgs = {"triton": chunk_config(N, torch.bfloat16, HV, gluon_ok=False),
                "gluon64": ChunkConfig(seq_kernel="gluon", bv=64),
                "gluon128": ChunkConfig(seq_kernel="gluon", bv=128)}
        run = lambda c: (lambda: chunk_seq_fwd_by(c, out, v, ssm, ws, meta, HK))
        ssm.zero_()
        run(cfgs["triton"])()
        ref = (out.clone(), ssm.clone())
        same = {}
        for n in ("gluon64", "gluon128"):
            out.zero_(); ssm.zero_()
            run(cfgs[n])()
            same[n] = torch.equal(out, ref[0]) and torch.equal(ssm, ref[1])
        ms = {n: triton.testing.do_bench(run(c)) for n, c in cfgs.items()}
        r = {"shape": f"{N}x{L}", "HV": HV, "pairs": N * HV, "ms": ms, "same_bits": same}
        report["runs"].append(r)
        print(f"{N}x{L} HV {HV} pairs {N * HV}: " + ", ".join(f"{k} {v:.4f}" for k, v in ms.items())
              + f"; gluon64/triton {ms['triton'] / ms['gluon64']:.2f}x; same bits {same}")
    json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), "min_pairs.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
